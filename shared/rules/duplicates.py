"""Duplicate transaction ids (``docs/billing-rules.md``, "Duplicate transaction ids"): the reason
``duplicate_transaction_id`` is decided last, among otherwise valid rows, and the first otherwise valid
occurrence of an id is kept.

Whether a repeated id is a duplicate depends on the validity of its earlier rows, which may be validated
anywhere. So the rule is decided in two cheap steps around validation, which can then run on any processor:

1. :class:`FirstOccurrences`, one pass over the ids in file order (the initiator): each row's ``repeat_of``,
   the row of its id's first occurrence, or 0 for a first occurrence.
2. :func:`keep_first`, once every row is validated (the controller): of the otherwise valid rows that
   repeat an id (held back until then), the first of each id is kept when the id's first occurrence was
   rejected; every other one is a duplicate. A first occurrence whose id may have been counted in an earlier
   batch is held too, as a repeat of itself (``repeat_of`` its own row; see :mod:`store.ledger.ids`), and kept
   unless the ledger has its id.

A first occurrence that is otherwise valid is counted at once, as are rows whose id does not repeat.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import FileRefused

_HASH_KEYS = ("billing-txid-h1.", "billing-txid-h2.")
#: Rows are remembered as uint32: a batch file of more data rows is refused.
MAX_ROWS = np.iinfo(np.uint32).max
#: The filter in front of the remembered ids (16 MiB).
FILTER_BITS = 1 << 27
#: Ids hashed at a time by :func:`id_hashes`.
_HASH_SLICE = 100_000


class FirstOccurrences:
    """The ids of one batch seen so far and the row of each one's first occurrence, in bounded memory.

    Each id is remembered as 96 bits of two keyed SipHashes (a uint64 and a uint32 array, sorted by the
    first) and its first row (uint32): 16 bytes per id whatever its length, so 10 million ids take 160 MB.
    A chunk's new ids make a sorted run of their own; a run is merged with the one before it while that one
    is less than twice its size, up to ``run_ids``: few runs to search (about a dozen at ten million ids),
    each id copied a few times, and a merge never holds more than ``run_ids`` twice. A filter of
    ``FILTER_BITS`` bits (one set per id, by the top bits of its hash) spares the search for almost every
    new id: all but 0.7 % of them at a million ids, 7 % at ten million. Within one chunk ids
    are compared exactly; a false repeat across chunks needs two distinct ids with equal 96-bit hashes
    (about n²/2^97, 10^-15 for 10 million ids: never in practice).
    """

    def __init__(self, *, run_ids: int = 1 << 20) -> None:
        self._run_ids = run_ids
        self._runs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # the largest first
        self._filter = np.zeros(FILTER_BITS // 8, dtype=np.uint8)

    def __len__(self) -> int:
        return sum(len(h1) for h1, _, _ in self._runs)

    @staticmethod
    def hashes(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The 64-bit and the 32-bit part of each id's hash (``ids``: an object array of str)."""
        return FirstOccurrences.hash64(ids), (_siphash(ids, _HASH_KEYS[1]) >> np.uint64(32)).astype(np.uint32)

    @staticmethod
    def hash64(ids: np.ndarray) -> np.ndarray:
        """The 64-bit part of each id's hash (the first of :meth:`hashes`), what the ledger keeps of an id."""
        return _siphash(ids, _HASH_KEYS[0])

    def repeat_of(self, ids: pa.Array, rows: np.ndarray, *, hashes: np.ndarray | None = None) -> np.ndarray:
        """For the next rows of the file (``ids`` stripped, their 1-based ``rows`` ascending), the row of
        each id's first occurrence, 0 where this is the first (or the id is empty); remembers the new ids.
        ``hashes`` (uint64, one per row), if given, gets each id's 64-bit hash (the first of :meth:`hashes`).
        Refuses a file of more than ``MAX_ROWS`` rows."""
        repeat = np.zeros(len(ids), dtype=np.int64)
        if len(rows) and rows[-1] > MAX_ROWS:
            raise FileRefused(f"the file has more than {MAX_ROWS} data rows")
        present = np.flatnonzero(
            pc.fill_null(pc.greater(pc.binary_length(ids), 0), False).to_numpy(zero_copy_only=False)
        )
        if not len(present):
            return repeat
        strings = ids.take(pa.array(present)).to_numpy(zero_copy_only=False)
        own = rows[present]
        h1, h2 = self.hashes(strings)
        if hashes is not None:
            hashes[present] = h1
        order = np.argsort(h1, kind="stable")
        sorted_h1, sorted_h2 = h1[order], h2[order]
        first = np.zeros(len(present), dtype=np.int64)
        first[order] = self._first_rows(sorted_h1, sorted_h2)
        same_as_next = sorted_h1[1:] == sorted_h1[:-1]
        candidate = np.zeros(len(present), dtype=bool)
        candidate[order[1:][same_as_next]] = True
        candidate[order[:-1][same_as_next]] = True
        earliest: dict[str, int] = {}
        for i in np.flatnonzero(candidate).tolist():  # only ids whose hash repeats within the chunk, in file order
            at = earliest.setdefault(strings[i], i)
            if at != i and not first[i]:
                first[i] = own[at]
        repeat[present] = first
        fresh = order[first[order] == 0]
        self._add(h1[fresh], h2[fresh], own[fresh].astype(np.uint32))
        return repeat

    def _first_rows(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        """The first row of each hashed id seen before, else 0 (``h1`` sorted: the searches then walk the
        runs in order, far faster than unsorted)."""
        found = np.zeros(len(h1), dtype=np.int64)
        byte, bit = _filter_position(h1)
        maybe = np.flatnonzero((self._filter[byte] >> bit) & 1)
        if len(maybe):
            found[maybe] = self._search(h1[maybe], h2[maybe])
        return found

    def _search(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        """:meth:`_first_rows` of ids the filter does not rule out, searched in every run."""
        found = np.zeros(len(h1), dtype=np.int64)
        for run1, run2, run_rows in self._runs:
            at = np.minimum(np.searchsorted(run1, h1), len(run1) - 1)
            same = np.flatnonzero(run1[at] == h1)
            match = run2[at[same]] == h2[same]
            found[same[match]] = run_rows[at[same[match]]]
            for i in same[~match]:  # equal 64-bit parts of two ids: astronomically rare
                end = np.searchsorted(run1, h1[i], side="right")
                other = np.flatnonzero(run2[at[i] : end] == h2[i])
                if len(other):
                    found[i] = run_rows[at[i] + other[0]]
        return found

    def _add(self, h1: np.ndarray, h2: np.ndarray, rows: np.ndarray) -> None:
        """Remember new hashed ids, given sorted by ``h1``: their filter bits set, a run of their own merged
        with those before it while they are less than twice its size (up to ``run_ids``)."""
        if not len(h1):
            return
        byte, bit = _filter_position(h1)  # sorted too: the bits of one byte are ORed together first
        starts = np.flatnonzero(np.r_[True, byte[1:] != byte[:-1]])
        self._filter[byte[starts]] |= np.bitwise_or.reduceat(np.left_shift(1, bit, dtype=np.uint8), starts)
        run = (h1, h2, rows)
        while self._runs and _mergeable(len(self._runs[-1][0]), len(run[0]), self._run_ids):
            run = _merged(self._runs.pop(), run)
        self._runs.append(run)


def _mergeable(before: int, new: int, most: int) -> bool:
    """Whether a run of ``new`` ids joins the one before it: that one is less than twice its size, and both
    together hold at most ``most``."""
    return before < 2 * new and before + new <= most


def _merged(
    old: tuple[np.ndarray, np.ndarray, np.ndarray], new: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two runs as one, sorted by the first array: one linear merge."""
    at = np.searchsorted(old[0], new[0]) + np.arange(len(new[0]))
    taken = np.zeros(len(old[0]) + len(new[0]), dtype=bool)
    taken[at] = True
    merged = _empty_run(len(taken))
    for target, was, added in zip(merged, old, new, strict=True):
        target[at], target[~taken] = added, was
    return merged


def _filter_position(h1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each hash's bit lies in the filter (by its top bits): its byte, and the bit in it."""
    slot = h1 >> np.uint64(64 - FILTER_BITS.bit_length() + 1)
    return (slot >> np.uint64(3)).astype(np.intp), (slot & np.uint64(7)).astype(np.uint8)


def _empty_run(size: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.empty(size, dtype=np.uint64), np.empty(size, dtype=np.uint32), np.empty(size, dtype=np.uint32)


def id_hashes(ids: pa.Array | pa.ChunkedArray | np.ndarray) -> np.ndarray:
    """Each id's signed 64-bit hash as the ledger keeps it (:meth:`FirstOccurrences.hash64`, what the id filter
    holds); ids given in Arrow are made Python strings a slice at a time, so that only so many exist at once."""
    parts = [np.empty(0, np.uint64)]
    for start in range(0, len(ids), _HASH_SLICE):
        part = ids[start : start + _HASH_SLICE]
        parts.append(FirstOccurrences.hash64(part if isinstance(part, np.ndarray) else part.to_numpy(False)))
    return np.concatenate(parts).view(np.int64)


def keep_first(
    rows: np.ndarray, repeat_of: np.ndarray, rejected: np.ndarray, taken: np.ndarray | None = None
) -> np.ndarray:
    """Which held rows are kept: per first occurrence (``repeat_of``), the earliest held row when that first
    occurrence is among the ``rejected`` rows or is that held row itself (held as a candidate for an id of an
    earlier batch), unless its id is ``taken`` (bool per row: counted in an earlier batch); every other held
    row is a duplicate."""
    kept = np.zeros(len(rows), dtype=bool)
    if not len(rows):
        return kept
    order = np.lexsort((rows, repeat_of))
    firsts = repeat_of[order]
    earliest = order[np.flatnonzero(np.r_[True, firsts[1:] != firsts[:-1]])]
    free = np.isin(repeat_of[earliest], rejected) | (rows[earliest] == repeat_of[earliest])
    kept[earliest] = free if taken is None else free & ~taken[earliest]
    return kept


def _siphash(ids: np.ndarray, key: str) -> np.ndarray:
    """Each id's keyed SipHash (uint64)."""
    import pandas as pd  # here: the store imports this module, and most commands reading it need no pandas

    hashed: np.ndarray = pd.util.hash_array(ids, hash_key=key, categorize=False)
    return hashed
