"""The ledger's ids without their text: ``ledger_ids`` keeps each id's hash and row, and ``ledger_id_texts`` the
ids' text per batch, in Parquet parts of at most :data:`PART_ROWS` ids (``row``, ``transaction_id``), read only where
a hash is found again. The ids recorded before go into parts of their batch, in row order.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Ids a part of text holds at most (store.ledger.ids).
PART_ROWS = 100_000
_IDS = pa.schema([("row", pa.int64()), ("transaction_id", pa.string())])
_TEXTS = sa.table(
    "ledger_id_texts",
    sa.column("batch_key", sa.BigInteger),
    sa.column("first_row", sa.BigInteger),
    sa.column("last_row", sa.BigInteger),
    sa.column("ids", sa.LargeBinary),
)


def upgrade() -> None:
    op.create_table(
        "ledger_id_texts",
        sa.Column("batch_key", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("first_row", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("last_row", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("ids", sa.LargeBinary, nullable=False),
    )
    conn = op.get_bind()
    recorded = sa.text("SELECT batch_key, row, transaction_id FROM ledger_ids ORDER BY batch_key, row")
    for part in _parts(conn.execute(recorded.execution_options(yield_per=PART_ROWS))):
        conn.execute(sa.insert(_TEXTS), part)
    op.execute("ALTER TABLE ledger_ids DROP COLUMN transaction_id")


def downgrade() -> None:
    op.execute("ALTER TABLE ledger_ids ADD COLUMN transaction_id TEXT NOT NULL DEFAULT ''")
    op.create_table(
        "ledger_id_texts_rows",
        sa.Column("batch_key", sa.BigInteger, nullable=False),
        sa.Column("row", sa.BigInteger, nullable=False),
        sa.Column("transaction_id", sa.Text, nullable=False),
    )
    op.create_index("ix_ledger_id_texts_rows", "ledger_id_texts_rows", ["batch_key", "row"])
    rows = sa.table("ledger_id_texts_rows", sa.column("batch_key"), sa.column("row"), sa.column("transaction_id"))
    conn = op.get_bind()
    for key, data in conn.execute(sa.select(_TEXTS.c.batch_key, _TEXTS.c.ids)).all():
        part = pq.read_table(pa.BufferReader(data)).to_pydict()
        texts = zip(part["row"], part["transaction_id"], strict=True)
        conn.execute(sa.insert(rows), [{"batch_key": key, "row": r, "transaction_id": t} for r, t in texts])
    op.execute(
        "UPDATE ledger_ids SET transaction_id = COALESCE((SELECT t.transaction_id FROM ledger_id_texts_rows t "
        "WHERE t.batch_key = ledger_ids.batch_key AND t.row = ledger_ids.row LIMIT 1), '')"
    )
    op.drop_table("ledger_id_texts_rows")
    op.drop_table("ledger_id_texts")


def _parts(recorded: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """The ``ledger_id_texts`` rows of ids in (batch key, row) order: each batch's in parts of ``PART_ROWS``."""
    key: int | None = None
    rows: list[int] = []
    texts: list[str] = []
    for batch_key, row, text in recorded:
        if rows and (batch_key != key or len(rows) == PART_ROWS):
            yield _part(key, rows, texts)
            rows, texts = [], []
        key = batch_key
        rows.append(row)
        texts.append(text)
    if rows:
        yield _part(key, rows, texts)


def _part(key: int | None, rows: list[int], texts: list[str]) -> dict[str, Any]:
    sink = pa.BufferOutputStream()
    table = pa.table([pa.array(rows, pa.int64()), pa.array(texts, pa.string())], schema=_IDS)
    pq.write_table(table, sink, compression="zstd", compression_level=1, use_dictionary=False)
    return {"batch_key": key, "first_row": rows[0], "last_row": rows[-1], "ids": sink.getvalue().to_pybytes()}
