"""Dated reference data: what is stored per aggregate keeps the tax region and the price book that rated its rows
(both in the key) and the tax rate; held rows and the partial aggregates of batches not settled likewise; and the rows
of the price books batches were rated with (``price_book_rows``). Rows from before keep region ``''`` (not recorded),
their batch's price book, and no tax rate; ``price_book_rows`` starts empty (the price books live in blob storage).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEY = ["batch_id", "account_id", "product", "billing_day"]
#: The batch's price book, for rows of it from before this revision.
_BATCH_PRICEBOOK = "(SELECT coalesce(b.pricebook_hash, '') FROM batches b WHERE b.batch_id = {}.batch_id)"


def upgrade() -> None:
    conn = op.get_bind()
    for table in ("aggregates", "held"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("region", sa.String(64), nullable=False, server_default=""))
            batch.add_column(sa.Column("pricebook", sa.String(64), nullable=False, server_default=""))
            batch.add_column(sa.Column("tax_rate", sa.String(32), nullable=True))
        op.execute(f"UPDATE {table} SET pricebook = {_BATCH_PRICEBOOK.format(table)}")
    _primary_key([*_KEY, "region", "pricebook"])
    for table in ("aggregates", "held"):
        with op.batch_alter_table(table) as batch:
            batch.alter_column("region", existing_type=sa.String(64), server_default=None)
            batch.alter_column("pricebook", existing_type=sa.String(64), server_default=None)
    _partials_with_keys(conn)
    op.create_table(
        "price_book_rows",
        sa.Column("pricebook", sa.String(64), primary_key=True),
        sa.Column("product", sa.String(255), primary_key=True),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("unit", sa.String(32), nullable=False),
        sa.Column("unit_price", sa.String(32), nullable=False),
        sa.Column("offpeak_unit_price", sa.String(32), nullable=False),
        sa.Column("minimum_charge", sa.String(32), nullable=True),
    )


def _partials_with_keys(conn: sa.Connection) -> None:
    """The partial aggregates of batches not settled, each given region ``''``, its batch's price book and no tax
    rate, in the columns' order of this revision."""
    stored = sa.text(
        "SELECT p.work_item_id, p.aggregates, coalesce(b.pricebook_hash, '') AS pricebook "
        "FROM partials p LEFT JOIN batches b ON b.batch_id = p.batch_id"
    )
    update = sa.text("UPDATE partials SET aggregates = :aggregates WHERE work_item_id = :work_item_id")
    for work_item_id, data, pricebook in conn.execute(stored).all():
        table = pa.ipc.open_stream(data).read_all()
        n = table.num_rows
        day = table.schema.get_field_index("billing_day")
        table = table.add_column(day + 1, "region", pa.array([""] * n, pa.string()))
        table = table.add_column(day + 2, "pricebook", pa.array([pricebook] * n, pa.string()))
        currency = table.schema.get_field_index("currency")
        table = table.add_column(currency + 1, "tax_rate", pc.cast(pa.nulls(n), pa.string()))
        conn.execute(update, {"work_item_id": work_item_id, "aggregates": _encode(table)})


def downgrade() -> None:
    if op.get_bind().execute(sa.text("SELECT count(*) FROM partials")).scalar():
        raise RuntimeError("batches not settled keep partial aggregates: let them settle before downgrading")
    split = sa.text(f"SELECT count(*) FROM (SELECT 1 FROM aggregates GROUP BY {', '.join(_KEY)} HAVING count(*) > 1) s")
    if op.get_bind().execute(split).scalar():
        raise RuntimeError("aggregates are split by region or price book: they cannot be downgraded")
    op.drop_table("price_book_rows")
    _primary_key(_KEY)
    for table in ("aggregates", "held"):
        with op.batch_alter_table(table) as batch:
            for column in ("tax_rate", "pricebook", "region"):
                batch.drop_column(column)


def _primary_key(columns: list[str]) -> None:
    """Make ``columns`` the key of ``aggregates`` (SQLite: the table copied with it)."""
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint("aggregates_pkey", "aggregates", type_="primary")
        op.create_primary_key("aggregates_pkey", "aggregates", columns)
        return
    reflected = sa.Table("aggregates", sa.MetaData(), autoload_with=op.get_bind())
    keyed = sa.Table(
        "aggregates",
        sa.MetaData(),
        *(sa.Column(c.name, c.type, primary_key=c.name in columns, nullable=c.nullable) for c in reflected.columns),
    )
    for index in reflected.indexes:
        sa.Index(index.name, *(keyed.c[c.name] for c in index.columns), unique=index.unique)
    with op.batch_alter_table("aggregates", recreate="always", copy_from=keyed):
        pass


def _encode(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="lz4")) as stream:
        stream.write_table(table)
    encoded: bytes = sink.getvalue().to_pybytes()
    return encoded
