"""Documents: a closed period's invoices and adjustments, their lines, and what each batch changed of a line.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime, money_type, quantity_type

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _measures() -> list[sa.Column[object]]:
    return [
        sa.Column("transactions", sa.BigInteger, nullable=False),
        sa.Column("quantity", quantity_type(), nullable=False),
        sa.Column("net", money_type(), nullable=False),
        sa.Column("tax", money_type(), nullable=False),
        sa.Column("total", money_type(), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "documents",
        sa.Column("number", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("period", sa.String(7), nullable=False),
        sa.Column("account_id", sa.String(64), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("issued_at", UTCDateTime(), nullable=False),
        sa.Column("net", money_type(), nullable=False),
        sa.Column("tax", money_type(), nullable=False),
        sa.Column("total", money_type(), nullable=False),
        sa.Column("pricebooks", sa.Text, nullable=False),
        sa.Column("tax_tables", sa.Text, nullable=False),
    )
    op.create_index("ix_documents_period_account", "documents", ["period", "account_id", "currency"])
    op.create_index("ix_documents_account", "documents", ["account_id"])
    op.create_table(
        "document_lines",
        sa.Column("number", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("product", sa.String(255), primary_key=True),
        *_measures(),
    )
    op.create_table(
        "document_batches",
        sa.Column("number", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("product", sa.String(255), primary_key=True),
        sa.Column("batch_id", sa.String(255), primary_key=True),
        *_measures(),
    )


def downgrade() -> None:
    op.drop_table("document_batches")
    op.drop_table("document_lines")
    op.drop_index("ix_documents_account", "documents")
    op.drop_index("ix_documents_period_account", "documents")
    op.drop_table("documents")
