"""Initial schema: batches, work_items, aggregates, rejects.

Revision ID: 0001
Revises:
Create Date: 2025-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime, money_type, quantity_type

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("batch_id", sa.String(255), primary_key=True),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("accepted", sa.BigInteger, nullable=False),
        sa.Column("rejected", sa.BigInteger, nullable=False),
        sa.Column("work_items", sa.BigInteger, nullable=True),
        sa.Column("completed_items", sa.BigInteger, nullable=False),
        sa.Column("poisoned_items", sa.BigInteger, nullable=False),
        sa.Column("transactions_recorded", sa.BigInteger, nullable=False),
        sa.Column("pricebook_hash", sa.String(128), nullable=True),
        sa.Column("taxes_hash", sa.String(128), nullable=True),
        sa.Column("refused_reason", sa.Text, nullable=True),
        sa.Column("accepted_at", UTCDateTime(), nullable=True),
        sa.Column("completed_at", UTCDateTime(), nullable=True),
        sa.Column("latency_seconds", sa.Float, nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "work_items",
        sa.Column("work_item_id", sa.String(255), primary_key=True),
        sa.Column("batch_id", sa.String(255), nullable=False),
        sa.Column("transactions", sa.BigInteger, nullable=False),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.Column("poison_reason", sa.Text, nullable=True),
    )
    op.create_index("ix_work_items_batch_id", "work_items", ["batch_id"])
    op.create_table(
        "aggregates",
        sa.Column("batch_id", sa.String(255), primary_key=True),
        sa.Column("account_id", sa.String(64), primary_key=True),
        sa.Column("product", sa.String(255), primary_key=True),
        sa.Column("billing_day", sa.Date, primary_key=True),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("transactions", sa.BigInteger, nullable=False),
        sa.Column("quantity", quantity_type(), nullable=False),
        sa.Column("net", money_type(), nullable=False),
        sa.Column("tax", money_type(), nullable=False),
        sa.Column("total", money_type(), nullable=False),
    )
    op.create_table(
        "rejects",
        sa.Column("batch_id", sa.String(255), primary_key=True),
        sa.Column("row", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("raw", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("rejects")
    op.drop_table("aggregates")
    op.drop_index("ix_work_items_batch_id", table_name="work_items")
    op.drop_table("work_items")
    op.drop_table("batches")
