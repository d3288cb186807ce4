"""Partial aggregates kept per work item until the batch settles (table ``partials``), instead of added into
``aggregates`` at every apply (and the fold token that let a store cache them). The aggregates of batches not
settled yet (``processing`` or ``failed``) become one partials row each, so that settling them later still counts
them.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The partial aggregates' columns as a processor makes them (shared.rules.schemas.PARTIAL_SCHEMA).
_SCHEMA = pa.schema(
    [
        ("account_id", pa.string()),
        ("product", pa.string()),
        ("billing_day", pa.string()),
        ("currency", pa.string()),
        ("transactions", pa.int64()),
        ("quantity", pa.decimal128(38, 6)),
        ("net", pa.decimal128(38, 0)),
        ("tax", pa.decimal128(38, 0)),
        ("total", pa.decimal128(38, 0)),
    ]
)
#: The work item id under which a batch's aggregates from before this revision are kept.
_BEFORE = "{}:aggregates-before-0013"


def upgrade() -> None:
    partials = op.create_table(
        "partials",
        sa.Column("work_item_id", sa.String(255), primary_key=True),
        sa.Column("batch_id", sa.String(255), nullable=False),
        sa.Column("aggregates", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_partials_batch_id", "partials", ["batch_id"])
    conn = op.get_bind()
    unsettled = conn.execute(sa.text("SELECT batch_id FROM batches WHERE state IN ('processing', 'failed')"))
    for batch_id in list(unsettled.scalars()):
        stored = sa.text(f"SELECT {', '.join(_SCHEMA.names)} FROM aggregates WHERE batch_id = :batch_id")
        found = conn.execute(stored, {"batch_id": batch_id}).all()
        if found:
            table = pa.Table.from_pylist([_partial(row._mapping) for row in found]).cast(_SCHEMA)
            row = {"work_item_id": _BEFORE.format(batch_id), "batch_id": batch_id, "aggregates": _encode(table)}
            op.bulk_insert(partials, [row])
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("fold_token")


def downgrade() -> None:
    if op.get_bind().execute(sa.text("SELECT count(*) FROM partials")).scalar():
        raise RuntimeError("batches not settled keep partial aggregates: let them settle before downgrading")
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("fold_token", sa.String(32), nullable=True))
    op.drop_index("ix_partials_batch_id", "partials")
    op.drop_table("partials")


def _partial(stored: sa.RowMapping) -> dict[str, Any]:
    """A stored aggregate as a partial aggregate: its day and decimals as text (exact), the rest as they are."""
    return {name: value if isinstance(value, int | str) else str(value) for name, value in stored.items()}


def _encode(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as stream:
        stream.write_table(table)
    encoded: bytes = sink.getvalue().to_pybytes()
    return encoded
