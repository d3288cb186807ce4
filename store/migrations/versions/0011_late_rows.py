"""Late rows: the periods closed, and each batch's counted rows of a period closed before it completed.

A store with documents takes each documented period as closed since its first document. Batches completed
before this revision have no late rows recorded: when they completed was not compared with closes then.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "closed_periods",
        sa.Column("period", sa.String(7), primary_key=True),
        sa.Column("closed_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "late_rows",
        sa.Column("batch_id", sa.String(255), primary_key=True),
        sa.Column("period", sa.String(7), primary_key=True),
        sa.Column("rows", sa.BigInteger, nullable=False),
    )
    op.execute(
        "INSERT INTO closed_periods (period, closed_at) SELECT period, MIN(issued_at) FROM documents GROUP BY period"
    )


def downgrade() -> None:
    op.drop_table("late_rows")
    op.drop_table("closed_periods")
