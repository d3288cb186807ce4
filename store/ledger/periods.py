"""Closed periods and late rows.

A counted row is late when its period had been closed (table ``closed_periods``, :func:`mark_closed`) before its
batch completed; late rows are counted per batch and period in the transaction that completes the batch (table
``late_rows``, :func:`record_late`) and billed by the period's next close (:mod:`store.ledger.closing`). A
completion and a close never interleave: on PostgreSQL the completion holds the closes' advisory lock
(:data:`CLOSE_LOCK`) shared, so it sees every close committed before it and a close sees every completion
committed before it (SQLite's ``BEGIN IMMEDIATE`` serialises them anyway).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa

from ..schema import aggregates, closed_periods, late_rows

#: PostgreSQL advisory lock key of closes ("ledg"): exclusive in a close, shared in a batch's completion.
CLOSE_LOCK = 0x6C656467


def mark_closed(conn: sa.Connection, period: str, now: datetime) -> None:
    """Record that ``period`` is closed (from its first close on), in the closing transaction."""
    known = sa.select(closed_periods.c.period).where(closed_periods.c.period == period)
    if conn.execute(known).first() is None:
        conn.execute(sa.insert(closed_periods).values(period=period, closed_at=now))


def record_late(conn: sa.Connection, completed: Sequence[str]) -> None:
    """Record the late rows of the batches completing in this transaction (their aggregates written): per
    period closed by now, the batch's counted rows of it."""
    if not completed:
        return
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock_shared(CLOSE_LOCK)))
    closed = set(conn.execute(sa.select(closed_periods.c.period)).scalars())
    if not closed:
        return
    per_day = (
        sa.select(aggregates.c.batch_id, aggregates.c.billing_day, sa.func.sum(aggregates.c.transactions))
        .where(aggregates.c.batch_id.in_(sorted(completed)))
        .group_by(aggregates.c.batch_id, aggregates.c.billing_day)
    )
    late: dict[tuple[str, str], int] = defaultdict(int)
    for batch_id, day, transactions in conn.execute(per_day):
        if (period := day.strftime("%Y-%m")) in closed:
            late[batch_id, period] += int(transactions)
    rows = [{"batch_id": b, "period": p, "rows": n} for (b, p), n in sorted(late.items()) if n]
    if rows:
        conn.execute(sa.insert(late_rows), rows)


def late(conn: sa.Connection, batch_ids: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
    """The late rows of batches (None: of every batch), per batch and period; batches without any left out."""
    query = sa.select(late_rows).order_by(late_rows.c.batch_id, late_rows.c.period)
    if batch_ids is not None:
        query = query.where(late_rows.c.batch_id.in_(sorted(batch_ids)))
    found: dict[str, dict[str, int]] = defaultdict(dict)
    for row in conn.execute(query):
        found[row.batch_id][row.period] = int(row.rows)
    return dict(found)
