"""Partial aggregates kept per work item until the batch settles (table ``partials``), instead of added into
``aggregates`` at every apply (and the fold token that let a store cache them); held rows keep their id and its hash,
rejected rows the hash of their id where they are its first occurrence, so that completing a batch needs no pass
over its ids; a batch waiting for an earlier one names it (``waiting_for``). For batches not settled yet
(``processing`` or ``failed``), their aggregates become one partials row each, and their held and rejected rows get
those from the ledger's ids.

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
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("fold_token")
        batch.add_column(sa.Column("waiting_for", sa.String(255), nullable=True))
    with op.batch_alter_table("rejects") as rejects:
        rejects.add_column(sa.Column("id_hash", sa.BigInteger, nullable=True))
    with op.batch_alter_table("held") as held:
        held.add_column(sa.Column("transaction_id", sa.Text, nullable=True))
        held.add_column(sa.Column("id_hash", sa.BigInteger, nullable=True))
    conn = op.get_bind()
    running = "SELECT batch_id, id_segment, id_key FROM batches WHERE state IN ('processing', 'failed')"
    for batch_id, segment, key in conn.execute(sa.text(running)).all():
        _keep_aggregates(conn, partials, batch_id)
        _ids_of_rows(conn, batch_id, segment, key)
    op.execute("UPDATE held SET transaction_id = '', id_hash = 0 WHERE id_hash IS NULL")  # a batch without ids
    with op.batch_alter_table("held") as held:
        held.alter_column("transaction_id", existing_type=sa.Text, nullable=False)
        held.alter_column("id_hash", existing_type=sa.BigInteger, nullable=False)


def _keep_aggregates(conn: sa.Connection, partials: sa.Table, batch_id: str) -> None:
    """A running batch's aggregates as one row of partials."""
    stored = sa.text(f"SELECT {', '.join(_SCHEMA.names)} FROM aggregates WHERE batch_id = :batch_id")
    found = conn.execute(stored, {"batch_id": batch_id}).all()
    if found:
        table = pa.Table.from_pylist([_partial(row._mapping) for row in found]).cast(_SCHEMA)
        row = {"work_item_id": _BEFORE.format(batch_id), "batch_id": batch_id, "aggregates": _encode(table)}
        op.bulk_insert(partials, [row])


def _ids_of_rows(conn: sa.Connection, batch_id: str, segment: int | None, key: int | None) -> None:
    """Give a running batch's held rows the id their first occurrence recorded, and its rejected rows the hash of
    theirs, from the ledger's ids of the batch (one pass over its segment)."""
    if key is None:
        return
    recorded = sa.text(
        "SELECT row, id_hash, transaction_id FROM ledger_ids WHERE segment = :segment AND batch_key = :key"
    )
    ids = {row: (id_hash, text) for row, id_hash, text in conn.execute(recorded, {"segment": segment, "key": key})}
    held = sa.text("SELECT DISTINCT repeat_of FROM held WHERE batch_id = :batch_id")
    firsts = [
        {"batch_id": batch_id, "first": r, "id_hash": ids[r][0], "id": ids[r][1]}
        for (r,) in conn.execute(held, {"batch_id": batch_id})
        if r in ids
    ]
    if firsts:
        conn.execute(
            sa.text(
                "UPDATE held SET id_hash = :id_hash, transaction_id = :id "
                "WHERE batch_id = :batch_id AND repeat_of = :first"
            ),
            firsts,
        )
    rejected = sa.text("SELECT row FROM rejects WHERE batch_id = :batch_id")
    hashes = [
        {"batch_id": batch_id, "row": r, "id_hash": ids[r][0]}
        for (r,) in conn.execute(rejected, {"batch_id": batch_id})
        if r in ids
    ]
    if hashes:
        conn.execute(sa.text("UPDATE rejects SET id_hash = :id_hash WHERE batch_id = :batch_id AND row = :row"), hashes)


def downgrade() -> None:
    if op.get_bind().execute(sa.text("SELECT count(*) FROM partials")).scalar():
        raise RuntimeError("batches not settled keep partial aggregates: let them settle before downgrading")
    with op.batch_alter_table("held") as held:
        held.drop_column("id_hash")
        held.drop_column("transaction_id")
    with op.batch_alter_table("rejects") as rejects:
        rejects.drop_column("id_hash")
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("waiting_for")
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
