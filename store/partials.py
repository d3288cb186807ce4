"""What each work item counted, kept as it came until its batch settles: then summed into ``aggregates`` (per day)
and ``period_aggregates`` (per billing period, tax region and rate) once.

A work item's partial aggregates are one row of ``partials`` (an Arrow stream: the one its results message carried,
else LZ4; written and read in a few milliseconds), written in the transaction that records the item, so that recording
a work item costs one row however many aggregate keys it touches. When the batch completes, its partials and the
partials of its held rows counted then are summed per day and per period (:func:`~store.fold.daily`,
:func:`~store.fold.regional`) and written as its aggregates, and the partials go; when it fails (a poisoned work
item), what it counted so far is written the same way and the partials stay, so that a replay that completes it later
writes the whole again. Sums beyond what the store's columns hold (10^38 minor units) are found then: the store
refuses the batch for them.

A store also sums the partials it records as it records them (:class:`Sums`, kept per batch by :class:`Folds`), so
that a batch settles without reading its partials back and summing them at its end: those sums are taken only where
they hold exactly the work items the batch has recorded (another process may have recorded some, or a transaction
that recorded some rolled back); otherwise the partials are read back as above.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import sqlalchemy as sa

from shared.rules.schemas import PARTIAL_SCHEMA
from shared.tables import decode_table, encode_stream

from .engine import CHUNK, chunks
from .fold import SUMMED, checked, daily, regional, sql_values
from .schema import aggregates, partials, period_aggregates

#: Partial aggregates summed at a time while a batch settles (a batch's keys, not its rows, bound the sums).
_FOLD_ROWS = 1_000_000
#: Batches whose sums a store keeps (the most recently recorded).
_FOLDED_BATCHES = 4
#: Partial rows a batch's sums keep as they came before they are summed.
_PENDING_ROWS = 500_000
#: The tables a batch's aggregates are written to.
_WRITTEN = (aggregates, period_aggregates)
_PG_TYPES = {"billing_day": "date", "transactions": "bigint", **dict.fromkeys(SUMMED[1:], "numeric")}


class Overflow(ValueError):
    """A batch's sums pass what the store's columns hold (38 digits; 2^63 transactions an aggregate)."""


#: Sums per day and per period (:func:`~store.fold.daily`, :func:`~store.fold.regional`).
Summed = tuple[pa.Table, pa.Table]


@dataclass(frozen=True)
class Sums:
    """The partials of some of a batch's work items (``items``): the last recorded kept as they came, up to
    :data:`_PENDING_ROWS` rows (many rows are summed at once for less than a few at a time), the others summed per
    day and per period."""

    items: frozenset[str] = frozenset()
    summed: Summed | None = None
    pending: tuple[pa.Table, ...] = ()

    def add(self, partials: Mapping[str, pa.Table], *, whole: bool = False) -> Sums:
        """These sums and the partials of more work items (work item → its ``PARTIAL_SCHEMA`` table), summed at once
        if ``whole`` (a batch about to settle: its settle then sums only what comes last); raises ``pa.ArrowInvalid``
        when a sum does not fit its column."""
        items, pending = self.items | partials.keys(), (*self.pending, *partials.values())
        if not whole and sum(table.num_rows for table in pending) < _PENDING_ROWS:
            return Sums(items, self.summed, pending)
        return Sums(items, self._with(pending))

    def total(self, kept: pa.Table | None) -> Summed:
        """These sums and ``kept`` (partials), summed."""
        return self._with(self.pending if kept is None or not kept.num_rows else (*self.pending, kept))

    def _with(self, partials: tuple[pa.Table, ...]) -> Summed:
        """The sums so far and ``partials``, summed."""
        if not partials:
            return self.summed or _summed(PARTIAL_SCHEMA.empty_table())
        added = _summed(pa.concat_tables(partials))
        return added if self.summed is None else _merged(self.summed, added)


class Folds:
    """Per batch, the :class:`Sums` of the partials this store recorded, as of its last commit (of the
    :data:`_FOLDED_BATCHES` batches that recorded last)."""

    def __init__(self) -> None:
        self._sums: OrderedDict[str, Sums] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, batch_id: str) -> Sums | None:
        with self._lock:
            return self._sums.get(batch_id)

    def keep(self, batch_id: str, sums: Sums | None) -> None:
        """Keep ``sums`` as the batch's (``None``: forget them)."""
        with self._lock:
            self._sums.pop(batch_id, None)
            if sums is not None:
                self._sums[batch_id] = sums
                while len(self._sums) > _FOLDED_BATCHES:
                    self._sums.popitem(last=False)


def record(conn: sa.Connection, counted: Iterable[tuple[str, str, pa.Table, bytes | None]]) -> None:
    """Keep the partial aggregates of work items recorded now: (work item, batch, ``PARTIAL_SCHEMA`` table, the stream
    its results message carried it in, if any: kept as it came); a null sum raises ``ValueError``."""
    rows = [
        {"work_item_id": item, "batch_id": batch, "aggregates": _encode(table, stream)}
        for item, batch, table, stream in counted
    ]
    for chunk in chunks(rows, CHUNK):
        conn.execute(sa.insert(partials), chunk)


def settle(
    conn: sa.Connection, batch_id: str, kept: pa.Table | None, *, complete: bool, sums: Sums | None = None
) -> None:
    """Write the aggregates of a batch settling now: the partials of its work items and ``kept`` (the partials of its
    held rows counted now), summed exactly; they replace what was written of it before (a failed batch completing
    after a replay). The partials are read back unless ``sums`` hold exactly the batch's work items. A ``complete``
    batch's partials go. Raises :class:`Overflow`, having written nothing, when a sum does not fit its column."""
    try:
        if sums is not None and sums.items == _recorded_items(conn, batch_id):
            written = sums.total(kept)
        else:
            written = _fold(_tables(conn, batch_id, kept))
    except pa.ArrowInvalid as exc:
        raise Overflow(Overflow.__doc__) from exc
    for table, rows in zip(_WRITTEN, written, strict=True):
        conn.execute(sa.delete(table).where(table.c.batch_id == batch_id))
        if rows.num_rows:
            _insert(conn, table, batch_id, rows)
    if complete:
        conn.execute(sa.delete(partials).where(partials.c.batch_id == batch_id))


def _tables(conn: sa.Connection, batch_id: str, kept: pa.Table | None) -> Iterator[pa.Table]:
    """A batch's partial aggregates, table by table: its work items', then ``kept``."""
    query = sa.select(partials.c.aggregates).where(partials.c.batch_id == batch_id).order_by(partials.c.work_item_id)
    for data in conn.scalars(query):
        yield decode_table(data)
    if kept is not None and kept.num_rows:
        yield kept


def _fold(tables: Iterable[pa.Table]) -> Summed:
    """A batch's partial aggregates summed per day and per period, :data:`_FOLD_ROWS` or so at a time: each part's
    sums added to those before."""
    sums: Summed | None = None
    for group in _groups(tables, _FOLD_ROWS):
        part = _summed(pa.concat_tables(group))  # checked as they were recorded (:func:`_encode`)
        sums = part if sums is None else _merged(sums, part)
    return sums or _summed(PARTIAL_SCHEMA.empty_table())


def _summed(partials: pa.Table) -> Summed:
    """Partial aggregates summed per day and per period."""
    return daily(partials), regional(partials)


def _merged(first: Summed, second: Summed) -> Summed:
    """Two pieces of sums summed into one."""
    return daily(pa.concat_tables([first[0], second[0]])), regional(pa.concat_tables([first[1], second[1]]))


def _recorded_items(conn: sa.Connection, batch_id: str) -> frozenset[str]:
    """The work items whose partials a batch keeps."""
    return frozenset(conn.scalars(sa.select(partials.c.work_item_id).where(partials.c.batch_id == batch_id)))


def _groups(tables: Iterable[pa.Table], rows: int) -> Iterator[list[pa.Table]]:
    """``tables`` taken as they come, in lists of at least ``rows`` rows (the last one fewer)."""
    group: list[pa.Table] = []
    for table in tables:
        group.append(table)
        if sum(part.num_rows for part in group) >= rows:
            yield group
            group = []
    if group:
        yield group


def _insert(conn: sa.Connection, table: sa.Table, batch_id: str, rows: pa.Table) -> None:
    """Insert a batch's aggregates into ``table`` (the other columns' names): on SQLite the canonical decimal text
    Arrow wrote, on PostgreSQL in one statement, one array a column."""
    columns = [column.name for column in table.columns if column.name != "batch_id"]
    names = ", ".join(["batch_id", *columns])
    if conn.dialect.name == "postgresql":
        arrays = ", ".join(f"CAST(:{name} AS {_PG_TYPES.get(name, 'text')}[])" for name in columns)
        statement = sa.text(f"INSERT INTO {table.name} ({names}) SELECT :batch_id, * FROM unnest({arrays})")
        conn.execute(statement, {"batch_id": batch_id, **{name: sql_values(rows[name]) for name in columns}})
        return
    insert = f"INSERT INTO {table.name} ({names}) VALUES (?, {', '.join('?' * len(columns))})"
    values = zip(itertools.repeat(batch_id), *(sql_values(rows[name]) for name in columns))
    for chunk in chunks(values, CHUNK):
        conn.exec_driver_sql(insert, chunk)


def _encode(table: pa.Table, stream: bytes | None) -> bytes:
    """A work item's partial aggregates (``PARTIAL_SCHEMA``) as an Arrow stream: ``stream`` if given, else compressed
    here; a null sum raises ``ValueError``."""
    checked([table])
    return encode_stream(table, dense=False) if stream is None else stream
