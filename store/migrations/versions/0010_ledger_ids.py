"""The ledger's transaction ids: the table ``ledger_ids`` (each accepted batch's ids by segment and hash) and,
on batches, the id filter's serials and the segment holding the batch's ids. Batches recorded before have no
ids in it: later batches are checked against the ids of batches from this revision on.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("filter_serial", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("id_serial", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("id_segment", sa.BigInteger, nullable=True))
    op.create_table(
        "ledger_ids",
        sa.Column("segment", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("id_hash", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("batch_seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("row", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("transaction_id", sa.Text, nullable=False),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("ledger_ids")
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("id_segment")
        batch.drop_column("id_serial")
        batch.drop_column("filter_serial")
