"""The ledger's id filter: a Bloom filter over the 64-bit hashes of transaction ids billed (or being billed) in
earlier batches, so that only the rows of a batch whose id may repeat one of theirs are held for the exact check
in SQL (``docs/architecture.md``, "Transaction ids across batches").

It is *blocked*: an id's :data:`HASHES` bits all lie in one 64-bit word (chosen by the hash's low bits; the bits
in it by multiplicative hashing), so adding or looking up an id touches one word, one memory access. An id is a
candidate when its bits are all set. With 12 bits an id about 1 % of ids never seen are candidates (2 % with
9.6); a false candidate costs only its exact check. The filter never forgets an id (a voided batch's ids stay
candidates), so it never misses one.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

#: Bits set per id.
HASHES = 6
#: Odd 64-bit multipliers, one per bit: the top 6 bits of ``hash × multiplier`` say which bit of the word.
_MULTIPLIERS = np.array(
    [
        0x9E3779B97F4A7C15,
        0xC2B2AE3D27D4EB4F,
        0x165667B19E3779F9,
        0xD6E8FEB86659FD93,
        0xFF51AFD7ED558CCD,
        0xC4CEB9FE1A85EC53,
    ],
    dtype=np.uint64,
)
_WORD = np.dtype("<u8")
#: Hashes added or looked up at a time: the temporaries of a slice take a few MB, whatever the batch's size.
_SLICE = 1 << 16


class IdFilter:
    """A blocked Bloom filter of ``bits`` bits (a power of two, at least 64)."""

    def __init__(self, bits: int, data: bytes | bytearray | None = None) -> None:
        """An empty filter, or the one ``data`` holds (used in place when it is a ``bytearray``, else copied)."""
        if bits < 64 or bits & (bits - 1):
            raise ValueError(f"an id filter's size is a power of two of at least 64 bits, not {bits}")
        self.bits = bits
        words = np.zeros(bits // 64, _WORD) if data is None else np.frombuffer(data, _WORD)
        self._words = words if words.flags.writeable else words.copy()
        if len(self._words) * 64 != bits:
            raise ValueError(f"an id filter of {bits} bits holds {bits // 8} bytes, not {len(self._words) * 8}")

    def to_bytes(self) -> bytes:
        """The filter's bits, as :class:`IdFilter` reads them back."""
        return self._words.tobytes()

    def chunks(self, size: int = 4 << 20) -> Iterator[bytes]:
        """:meth:`to_bytes` in pieces of ``size`` bytes, one copy of a piece at a time."""
        view = self._words.data.cast("B")
        for start in range(0, len(view), size):
            yield bytes(view[start : start + size])

    def add(self, hashes: np.ndarray) -> None:
        """Remember the ids of these hashes (uint64)."""
        for start in range(0, len(hashes), _SLICE):
            words, masks = self._positions(hashes[start : start + _SLICE])
            np.bitwise_or.at(self._words, words, masks)

    def might_contain(self, hashes: np.ndarray) -> np.ndarray:
        """Whether each id may have been added (False: certainly not)."""
        found = np.empty(len(hashes), dtype=bool)
        for start in range(0, len(hashes), _SLICE):
            words, masks = self._positions(hashes[start : start + _SLICE])
            found[start : start + _SLICE] = (self._words[words] & masks) == masks
        return found

    def merge(self, other: IdFilter) -> None:
        """Add every id of ``other`` (a filter of the same size)."""
        if other.bits != self.bits:
            raise ValueError("only filters of one size can be merged")
        self._words |= other._words

    def _positions(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each hash's word, and the mask of its bits there."""
        hashes = np.asarray(hashes, np.uint64)
        words = (hashes & np.uint64(len(self._words) - 1)).astype(np.intp)
        masks = np.zeros(len(hashes), np.uint64)
        for multiplier in _MULTIPLIERS:
            masks |= np.left_shift(np.uint64(1), (hashes * multiplier) >> np.uint64(58))
        return words, masks
