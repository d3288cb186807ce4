"""The SQLite fold cache: the stored aggregates of the batches a store added to lately, held in memory so
that adding to them again needs no read. Each batch row's ``fold_token`` tells whether they are still
what is stored. (PostgreSQL adds to the stored sums in SQL and needs none of this.)"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import sqlalchemy as sa

from .batches import SETTLED
from .fold import AGGREGATE_VALUES, ARROW_TYPES, FOLD_SCHEMA, Key, fold, keys, plus

#: At most this many aggregates (keys) cached per store: the key space of a batch, not its row count,
#: sets an entry's size.
CACHED_ROWS = 250_000
#: Reads one batch's stored aggregates on SQLite, as a fold's columns.
_SQLITE_BATCH = f"SELECT {', '.join(FOLD_SCHEMA.names)} FROM aggregates WHERE batch_id = ?"

#: What a batch row says of its aggregates: their fold token, and its completed work items.
Stamp = tuple[str | None, int]


def stamp(row: Mapping[str, Any]) -> Stamp:
    """A batch row's stamp (see :class:`FoldCache`)."""
    return row["fold_token"], row["completed_items"]


class Folded:
    """A batch's complete stored aggregates (SQLite), held so that adding to some of its keys costs what those
    keys cost, whatever the batch's size: each key's row, and the rows' currency and sums in arrays rewritten in
    place (a decimal as its 16 bytes: copied, never converted). Row 0 has no currency and zero sums: what a key
    not stored yet has."""

    def __init__(self, table: pa.Table) -> None:
        self._rows: dict[Key, int] = dict(zip(keys(table), range(1, table.num_rows + 1), strict=True))
        self._columns = {name: np.concatenate([_array(name, 1), _numpy(table[name])]) for name in AGGREGATE_VALUES}

    def __len__(self) -> int:
        """How many aggregates (keys)."""
        return len(self._rows)

    def plus(self, added: pa.Table) -> Summed:
        """``added`` (aggregates of the batch) plus what is stored for their keys, exactly: a row per key."""
        added_keys = keys(added)
        if len(set(added_keys)) < len(added_keys):
            added = fold(added)
            added_keys = keys(added)
        rows = self._rows
        at = np.array([rows.get(key, 0) for key in added_keys], np.int64)
        stored = {name: _arrow(column[at], ARROW_TYPES[name]) for name, column in self._columns.items()}
        return Summed(plus(added, stored), added_keys, at)

    def add(self, summed: Summed) -> None:
        """Take what :meth:`plus` gave, and nothing changed since, as its keys' aggregates (the new keys get their
        rows here, in ``summed.rows`` too)."""
        rows, at = self._rows, summed.rows
        new = np.flatnonzero(at == 0)
        if len(new):
            start = len(rows) + 1
            rows.update(zip([summed.keys[i] for i in new], range(start, start + len(new)), strict=True))
            at[new] = np.arange(start, start + len(new))
        for name, column in self._columns.items():
            if len(rows) >= len(column):  # full: room for twice as many
                column = self._columns[name] = np.concatenate([column, _array(name, max(len(column), len(rows)))])
            column[at] = _numpy(summed.table[name])


@dataclass(frozen=True)
class Summed:
    """What :meth:`Folded.plus` made: the sums (a row per key), their keys, each key's row (0: none yet)."""

    table: pa.Table
    keys: list[Key]
    rows: np.ndarray


def _array(name: str, length: int) -> np.ndarray:
    """Room for ``length`` values of aggregate column ``name`` as :class:`Folded` holds them: no currency, zeros."""
    if name == "currency":
        return np.full(length, None, object)
    return np.zeros(length, "V16" if pa.types.is_decimal(ARROW_TYPES[name]) else np.int64)


def _numpy(column: pa.ChunkedArray) -> np.ndarray:
    """A column without nulls as :class:`Folded` holds it: decimals as their 16 bytes, text as objects."""
    array = column.combine_chunks()
    if pa.types.is_decimal(array.type):
        return np.frombuffer(array.buffers()[1], "V16", len(array), array.offset * 16)
    values: np.ndarray = array.to_numpy(zero_copy_only=False)
    return values


def _arrow(values: np.ndarray, kind: pa.DataType) -> pa.Array:
    """The Arrow column of ``kind`` that :func:`_numpy` made ``values`` from (a currency None is null)."""
    if pa.types.is_decimal(kind):
        return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])
    return pa.array(values, kind)


#: What an apply wrote of one batch's aggregates (SQLite): the batch's stored aggregates it added to, the sums.
Written = tuple[Folded, Summed]


class FoldCache:
    """The complete stored aggregates of the batches a store added to lately (SQLite), so that adding to them
    again needs no read: at most :data:`CACHED_ROWS` aggregates, the least recently used batch evicted first, a batch
    settled ``complete`` or ``refused`` dropped (nothing adds to it again).

    Why it is exact whatever else writes to the database: every write of a batch's aggregates, by any store,
    sets a fresh random ``fold_token`` on the batch's row in the same transaction, and an entry is kept only
    after its transaction committed, stamped with the row as written. ``Store.apply`` compares the stamp with
    the row while it holds the row locked (``BEGIN IMMEDIATE``): equal, nobody wrote the batch's aggregates
    since, and the entry is what is stored; different (another store's write, a refusal, an outcome unknown),
    the batch's aggregates are read once again. The stamp holds the row's completed work items too, which any
    writer counting a work item changes: a controller older than the token, still running beside, included.
    """

    def __init__(self, limit: int = CACHED_ROWS) -> None:
        self._limit = limit
        self._entries: OrderedDict[str, tuple[Stamp, Folded]] = OrderedDict()
        self._rows = 0
        self._lock = threading.Lock()  # a store may be shared by threads

    def stored(self, conn: sa.Connection, batch_id: str, stamped: Stamp) -> Folded:
        """``batch_id``'s stored aggregates, its row (locked in ``conn``) stamped ``stamped``: cached or read."""
        with self._lock:
            entry = self._entries.get(batch_id)
            if entry is not None and entry[0] == stamped:
                self._entries.move_to_end(batch_id)
                return entry[1]
        return Folded(_batch_aggregates(conn, batch_id))

    def committed(self, rows: Mapping[str, Mapping[str, Any]], merged: Mapping[str, Written]) -> None:
        """Keep what a committed transaction wrote: ``rows`` (batch rows as written) and, per batch it added to,
        its stored aggregates as :meth:`stored` gave them with the sums it wrote.

        The given aggregates are added to in place: no other transaction holds them (one that began after this
        one committed finds this one's token on the row, not the entry's)."""
        with self._lock:
            for batch_id, row in rows.items():
                written = merged.get(batch_id)
                settled = row["state"] in SETTLED
                if written is None and not settled:
                    continue  # its aggregates not written: an entry is still what is stored
                self._discard(batch_id)
                if written is not None and not settled:
                    folded, summed = written
                    folded.add(summed)
                    if len(folded) <= self._limit:
                        self._entries[batch_id] = (stamp(row), folded)
                        self._rows += len(folded)
            while self._rows > self._limit:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._rows -= len(evicted)

    def drop(self, batch_ids: Iterable[str]) -> None:
        """Forget these batches."""
        with self._lock:
            for batch_id in batch_ids:
                self._discard(batch_id)

    def _discard(self, batch_id: str) -> None:
        entry = self._entries.pop(batch_id, None)
        if entry is not None:
            self._rows -= len(entry[1])


def _batch_aggregates(conn: sa.Connection, batch_id: str) -> pa.Table:
    """One batch's stored aggregates on SQLite (one query), as a table like :func:`fold` makes."""
    cursor = conn.connection.cursor()  # the driver's plain tuples: no conversion per value
    try:
        found = cursor.execute(_SQLITE_BATCH, (batch_id,)).fetchall()
    finally:
        cursor.close()
    columns = zip(*found, strict=True) if found else [()] * len(FOLD_SCHEMA)
    as_read = {
        name: pa.array(column, pa.int64() if name == "transactions" else pa.string())
        for name, column in zip(FOLD_SCHEMA.names, columns, strict=True)
    }
    return pa.table(as_read).cast(FOLD_SCHEMA)
