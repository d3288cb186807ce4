"""Ids recorded before the manifest: a batch's ids are keyed by ``batches.id_key`` (given with its first ids)
instead of its seq (given with its manifest), and ``ledger_id_parts`` records the ids parts taken. Batches with
ids keep their seq as their key.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The counter of id keys (store.ledger.ids.ID_KEYS).
ID_KEYS = "ledger_id_keys"


def upgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("id_key", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("id_parts", sa.BigInteger, nullable=False, server_default="0"))
        batch.add_column(sa.Column("id_parts_recorded", sa.BigInteger, nullable=False, server_default="0"))
    op.execute("UPDATE batches SET id_key = seq WHERE id_segment IS NOT NULL")
    op.create_index("ux_batches_id_key", "batches", ["id_key"], unique=True)
    op.execute(f"INSERT INTO counters (name, value) SELECT '{ID_KEYS}', COALESCE(MAX(id_key), 0) FROM batches")
    op.execute("ALTER TABLE ledger_ids RENAME COLUMN batch_seq TO batch_key")
    op.create_table(
        "ledger_id_parts",
        sa.Column("batch_id", sa.String(255), primary_key=True),
        sa.Column("part", sa.BigInteger, primary_key=True, autoincrement=False),
    )


def downgrade() -> None:
    op.drop_table("ledger_id_parts")
    # Back to seqs: the ids of batches without one (their manifest not recorded yet) go.
    numbered = "SELECT id_key FROM batches WHERE seq IS NOT NULL AND id_key IS NOT NULL"
    op.execute(f"DELETE FROM ledger_ids WHERE batch_key NOT IN ({numbered})")
    op.execute("UPDATE ledger_ids SET batch_key = -batch_key")
    op.execute("UPDATE ledger_ids SET batch_key = (SELECT seq FROM batches WHERE id_key = -ledger_ids.batch_key)")
    op.execute("ALTER TABLE ledger_ids RENAME COLUMN batch_key TO batch_seq")
    op.execute(f"DELETE FROM counters WHERE name = '{ID_KEYS}'")
    op.drop_index("ux_batches_id_key", "batches")
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("id_parts_recorded")
        batch.drop_column("id_parts")
        batch.drop_column("id_key")
