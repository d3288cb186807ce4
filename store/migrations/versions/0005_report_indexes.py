"""Indexes for the cross-batch report filters (store.queries): account and period, product, day; state.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: name → (table, columns). Batch filters use the aggregates' primary key (batch_id first).
INDEXES = {
    "ix_aggregates_account_day": ("aggregates", ["account_id", "billing_day"]),
    "ix_aggregates_product_day": ("aggregates", ["product", "billing_day"]),
    "ix_aggregates_day": ("aggregates", ["billing_day"]),
    "ix_batches_state": ("batches", ["state"]),
}


def upgrade() -> None:
    for name, (table, columns) in INDEXES.items():
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, (table, _) in reversed(INDEXES.items()):
        op.drop_index(name, table_name=table)
