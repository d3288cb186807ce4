"""What a batch's work items leave in the store beside their partial aggregates and ids: the work items recorded (or
poisoned), their rejected rows, and their held rows (possible duplicates, decided when the batch completes)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date
from typing import Any

import numpy as np
import pyarrow as pa
import sqlalchemy as sa

from shared.rules.duplicates import keep_first
from shared.rules.schemas import PARTIAL_SCHEMA, REJECTED_SCHEMA

from .batches import BatchRow, count
from .engine import CHUNK, chunks
from .schema import aggregates, held, partials, period_aggregates, rejects, work_items

_RECORDED = sa.select(work_items.c.work_item_id, work_items.c.poison_reason).where(
    work_items.c.work_item_id.in_(sa.bindparam("ids", expanding=True))
)


def recorded_work_items(conn: sa.Connection, ids: list[str]) -> dict[str, str | None]:
    """Work item id → its poison reason (None when it was recorded normally), for those recorded."""
    found: dict[str, str | None] = {}
    for chunk in chunks(ids, CHUNK):
        found.update((row.work_item_id, row.poison_reason) for row in conn.execute(_RECORDED, {"ids": chunk}))
    return found


def insert_work_items(conn: sa.Connection, records: Iterable[dict[str, Any]]) -> None:
    """Record work items (``poison_reason`` None unless given)."""
    for chunk in chunks(records, CHUNK):
        conn.execute(sa.insert(work_items), [{"poison_reason": None, **record} for record in chunk])


def forget_counts(conn: sa.Connection, row: BatchRow) -> None:
    """A refused batch counts nothing: delete its aggregates (daily and per period), partial aggregates, rejects and
    held rows, zero its counts."""
    for table in (aggregates, period_aggregates, partials, rejects, held):
        conn.execute(sa.delete(table).where(table.c.batch_id == row["batch_id"]))
    row.update({"accepted": 0, "rejected": 0, "transactions_recorded": 0})


def insert_rejects(conn: sa.Connection, tables: Iterable[tuple[str, pa.Table]]) -> None:
    """Record rejected rows (``REJECTED_SCHEMA`` tables, by batch)."""
    records = (
        {"batch_id": batch_id, **record} for batch_id, table in tables if table.num_rows for record in table.to_pylist()
    )
    for chunk in chunks(records, 5000):
        conn.execute(sa.insert(rejects), chunk)


def insert_held(conn: sa.Connection, tables: Iterable[tuple[str, pa.Table]]) -> None:
    """Keep held rows (``HELD_SCHEMA`` tables, by batch) until their batch completes."""
    records = (
        {"batch_id": batch_id, **record, "billing_day": date.fromisoformat(record["billing_day"])}
        for batch_id, table in tables
        if table.num_rows
        for record in table.to_pylist()
    )
    for chunk in chunks(records, CHUNK):
        conn.execute(sa.insert(held), chunk)


def held_firsts(conn: sa.Connection, batch_id: str) -> dict[int, tuple[int, str]]:
    """The first occurrences (rows) a batch's held rows repeat, each with its id's hash and the id (a held row's)."""
    query = sa.select(held.c.repeat_of, held.c.id_hash, held.c.transaction_id).where(held.c.batch_id == batch_id)
    return {r.repeat_of: (r.id_hash, r.transaction_id) for r in conn.execute(query)}


def resolve_held(conn: sa.Connection, row: BatchRow, taken: set[int]) -> tuple[pa.Table, list[int]]:
    """As a batch completes, every row of it validated: decide its held rows (:func:`keep_first`; ``taken``: the
    first occurrences whose id an earlier batch counted), reject the duplicates, count the rest; the partials of
    those counted (``PARTIAL_SCHEMA``) and the first occurrences they repeat are returned."""
    batch_id = row["batch_id"]
    found = conn.execute(sa.select(held).where(held.c.batch_id == batch_id).order_by(held.c.row)).mappings().all()
    if not found:
        return PARTIAL_SCHEMA.empty_table(), []
    numbers = np.array([record["row"] for record in found], np.int64)
    repeat_of = np.array([record["repeat_of"] for record in found], np.int64)
    firsts = sorted(set(repeat_of.tolist()))
    query = sa.select(rejects.c.row).where(rejects.c.batch_id == batch_id)
    rejected = [
        number for chunk in chunks(firsts, CHUNK) for number in conn.scalars(query.where(rejects.c.row.in_(chunk)))
    ]
    kept = keep_first(numbers, repeat_of, np.array(rejected, np.int64), np.isin(repeat_of, list(taken)))
    duplicates = [  # a candidate, its own first occurrence, keeps its id's hash: the ledger recorded that id
        {
            "row": record["row"],
            "reason": "duplicate_transaction_id",
            "raw": record["raw"],
            "id_hash": record["id_hash"] if record["row"] == record["repeat_of"] else None,
        }
        for record, keep in zip(found, kept, strict=True)
        if not keep
    ]
    insert_rejects(conn, [(batch_id, pa.Table.from_pylist(duplicates, schema=REJECTED_SCHEMA))])
    conn.execute(sa.delete(held).where(held.c.batch_id == batch_id))
    count(row, int(kept.sum()), len(duplicates))
    counted = [
        {**{name: record[name] for name in PARTIAL_SCHEMA.names}, "billing_day": record["billing_day"].isoformat()}
        for record, keep in zip(found, kept, strict=True)
        if keep
    ]
    return pa.Table.from_pylist(counted, schema=PARTIAL_SCHEMA), repeat_of[kept].tolist()
