"""Rows held until their batch completes: otherwise valid rows whose transaction id repeats an earlier row's,
decided then to be counted or rejected as duplicates (``shared.rules.duplicates``).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from store.schema import money_type, quantity_type

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "held",
        sa.Column("batch_id", sa.String(255), primary_key=True),
        sa.Column("row", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("repeat_of", sa.BigInteger, nullable=False),
        sa.Column("raw", sa.Text, nullable=False),
        sa.Column("account_id", sa.String(64), nullable=False),
        sa.Column("product", sa.String(255), nullable=False),
        sa.Column("billing_day", sa.Date, nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("transactions", sa.BigInteger, nullable=False),
        sa.Column("quantity", quantity_type(), nullable=False),
        sa.Column("net", money_type(), nullable=False),
        sa.Column("tax", money_type(), nullable=False),
        sa.Column("total", money_type(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("held")
