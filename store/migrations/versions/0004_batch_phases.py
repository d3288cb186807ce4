"""Each batch's phases as the initiator saw them: uploaded, first and last work item sent, debatched.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PHASES = ("uploaded_at", "first_item_sent_at", "last_item_sent_at", "debatched_at")


def upgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        for name in PHASES:
            batch.add_column(sa.Column(name, UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        for name in reversed(PHASES):
            batch.drop_column(name)
