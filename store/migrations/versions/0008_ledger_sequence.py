"""The ledger's first columns: each accepted batch's sequence number and when it was voided; the counters
table that hands out sequence numbers without gaps. Batches accepted before are numbered in the order they
were accepted (then by id), refused ones get none.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("seq", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("voided_at", UTCDateTime(), nullable=True))
    counters = op.create_table(
        "counters",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("value", sa.BigInteger, nullable=False),
    )
    conn = op.get_bind()
    batches = sa.table(
        "batches",
        sa.column("batch_id", sa.String),
        sa.column("seq", sa.BigInteger),
        sa.column("accepted_at", UTCDateTime()),
        sa.column("work_items", sa.BigInteger),
        sa.column("refused_reason", sa.Text),
    )
    accepted = conn.execute(
        sa.select(batches.c.batch_id)
        .where(batches.c.work_items.is_not(None), batches.c.refused_reason.is_(None))
        .order_by(batches.c.accepted_at.is_(None), batches.c.accepted_at, _code_points(conn, batches.c.batch_id))
    ).scalars()
    numbered = [{"b": batch_id, "s": seq} for seq, batch_id in enumerate(accepted, start=1)]
    if numbered:
        number = sa.update(batches).where(batches.c.batch_id == sa.bindparam("b")).values(seq=sa.bindparam("s"))
        conn.execute(number, numbered)
    op.bulk_insert(counters, [{"name": "batch_seq", "value": len(numbered)}])
    op.create_index("ux_batches_seq", "batches", ["seq"], unique=True)


def _code_points(conn: sa.Connection, column: sa.ColumnElement[str]) -> sa.ColumnElement[str]:
    """Text ordered by code point: SQLite's own order, PostgreSQL's ``C`` collation."""
    return column if conn.dialect.name == "sqlite" else sa.collate(column, "C")


def downgrade() -> None:
    op.drop_index("ux_batches_seq", "batches")
    op.drop_table("counters")
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("voided_at")
        batch.drop_column("seq")
