"""What each work item counted, kept as it came until its batch settles: then summed into ``aggregates`` once.

A work item's partial aggregates are one row of ``partials`` (an Arrow stream, LZ4: written and read in a few
milliseconds), written in the transaction that records the item, so that recording a work item costs one row however
many aggregate keys it touches. When the
batch completes, its partials and the partials of its held rows counted then are folded (:func:`~store.fold.fold`)
and written as its aggregates, and the partials go; when it fails (a poisoned work item), what it counted so far is
written the same way and the partials stay, so that a replay that completes it later writes the whole again. Sums
beyond what the store's columns hold (10^38 minor units) are found then: the store refuses the batch for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa
import sqlalchemy as sa

from shared.rules.schemas import PARTIAL_SCHEMA

from .engine import CHUNK, chunks
from .fold import AGGREGATE_KEY, AGGREGATE_VALUES, SUMMED, fold, of_batches, sql_values
from .schema import aggregates, partials

#: Partial aggregates folded at a time while a batch settles (a batch's keys, not its rows, bound the fold).
_FOLD_ROWS = 500_000
_COLUMNS = AGGREGATE_KEY + AGGREGATE_VALUES
_SQLITE_INSERT = f"INSERT INTO aggregates ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
_PG_TYPES = {"billing_day": "date", "transactions": "bigint", **dict.fromkeys(SUMMED[1:], "numeric")}
#: One PostgreSQL statement writes a whole fold (one array per column).
_PG_INSERT = sa.text(
    f"INSERT INTO aggregates ({', '.join(_COLUMNS)}) SELECT * FROM unnest("
    + ", ".join(f"CAST(:{name} AS {_PG_TYPES.get(name, 'text')}[])" for name in _COLUMNS)
    + ")"
)
_IPC = pa.ipc.IpcWriteOptions(compression="lz4")


class Overflow(ValueError):
    """A batch's sums pass what the store's columns hold (38 digits; 2^63 transactions an aggregate)."""


def record(conn: sa.Connection, counted: Iterable[tuple[str, str, pa.Table]]) -> None:
    """Keep the partial aggregates of work items recorded now: (work item, batch, ``PARTIAL_SCHEMA`` table); a null
    sum raises ``ValueError``."""
    rows = [{"work_item_id": item, "batch_id": batch, "aggregates": _encode(table)} for item, batch, table in counted]
    for chunk in chunks(rows, CHUNK):
        conn.execute(sa.insert(partials), chunk)


def settle(conn: sa.Connection, batch_id: str, kept: pa.Table | None, *, complete: bool) -> None:
    """Write the aggregates of a batch settling now: the partials of its work items and ``kept`` (the partials of its
    held rows counted now), summed exactly; they replace what was written of it before (a failed batch completing
    after a replay). A ``complete`` batch's partials go. Raises :class:`Overflow`, having written nothing, when a sum
    does not fit its column."""
    try:
        folded = _fold(_tables(conn, batch_id, kept), batch_id)
    except pa.ArrowInvalid as exc:
        raise Overflow(Overflow.__doc__) from exc
    conn.execute(sa.delete(aggregates).where(aggregates.c.batch_id == batch_id))
    if folded.num_rows:
        _insert(conn, folded)
    if complete:
        conn.execute(sa.delete(partials).where(partials.c.batch_id == batch_id))


def _tables(conn: sa.Connection, batch_id: str, kept: pa.Table | None) -> Iterator[pa.Table]:
    """A batch's partial aggregates, table by table: its work items', then ``kept``."""
    query = sa.select(partials.c.aggregates).where(partials.c.batch_id == batch_id).order_by(partials.c.work_item_id)
    for data in conn.scalars(query):
        yield pa.ipc.open_stream(data).read_all()
    if kept is not None and kept.num_rows:
        yield kept


def _fold(tables: Iterator[pa.Table], batch_id: str) -> pa.Table:
    """The tables of one batch folded into its aggregates (:func:`~store.fold.fold`), so many rows at a time."""
    folded = of_batches([])
    pending: list[tuple[str, pa.Table]] = []
    for table in tables:
        pending.append((batch_id, table))
        if sum(part.num_rows for _, part in pending) >= _FOLD_ROWS:
            folded, pending = fold(pa.concat_tables([folded, of_batches(pending)])), []
    return fold(pa.concat_tables([folded, of_batches(pending)])) if pending else folded


def _insert(conn: sa.Connection, folded: pa.Table) -> None:
    """Insert folded aggregates: on SQLite the canonical decimal text Arrow wrote, on PostgreSQL one array a column."""
    if conn.dialect.name == "postgresql":
        conn.execute(_PG_INSERT, {name: sql_values(folded[name]) for name in _COLUMNS})
        return
    values = zip(*(sql_values(folded[name]) for name in _COLUMNS), strict=True)
    for chunk in chunks(values, CHUNK):
        conn.exec_driver_sql(_SQLITE_INSERT, chunk)


def _encode(table: pa.Table) -> bytes:
    """A work item's partial aggregates (``PARTIAL_SCHEMA``) as an Arrow stream, compressed; a null sum raises
    ``ValueError``."""
    of_batches([("", table)])  # checks them
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, PARTIAL_SCHEMA, options=_IPC) as stream:
        stream.write_table(table)
    encoded: bytes = sink.getvalue().to_pybytes()
    return encoded
