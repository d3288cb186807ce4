"""Dated reference data: the aggregates keep the price book that rated their rows (in the key); their sums per
billing period, tax region and tax rate are kept beside them (``period_aggregates``, what the documents are closed
from); held rows and the partial aggregates of batches not settled keep the region, the price book and the rate; and
the rows of the price books batches were rated with (``price_book_rows``). Rows from before take their batch's price
book, region ``''`` and rate ``''`` (not recorded; no rate in held rows and partials); ``price_book_rows`` starts
empty (the price books live in blob storage).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import localcontext
from itertools import groupby, islice
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from alembic import op

from store.schema import EXACT, money_type, quantity_type

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEY = ["batch_id", "account_id", "product", "billing_day"]
_SUMMED = ("transactions", "quantity", "net", "tax", "total")
#: The batch's price book, for rows of it from before this revision.
_BATCH_PRICEBOOK = "(SELECT coalesce(b.pricebook_hash, '') FROM batches b WHERE b.batch_id = {}.batch_id)"


def upgrade() -> None:
    conn = op.get_bind()
    with op.batch_alter_table("held") as batch:
        batch.add_column(sa.Column("region", sa.String(64), nullable=False, server_default=""))
        batch.add_column(sa.Column("pricebook", sa.String(64), nullable=False, server_default=""))
        batch.add_column(sa.Column("tax_rate", sa.String(32), nullable=True))
    with op.batch_alter_table("aggregates") as batch:
        batch.add_column(sa.Column("pricebook", sa.String(64), nullable=False, server_default=""))
    for table in ("aggregates", "held"):
        op.execute(f"UPDATE {table} SET pricebook = {_BATCH_PRICEBOOK.format(table)}")
    _primary_key([*_KEY, "pricebook"])
    with op.batch_alter_table("held") as batch:
        batch.alter_column("region", existing_type=sa.String(64), server_default=None)
        batch.alter_column("pricebook", existing_type=sa.String(64), server_default=None)
    with op.batch_alter_table("aggregates") as batch:
        batch.alter_column("pricebook", existing_type=sa.String(64), server_default=None)
    _per_period(conn, _period_aggregates())
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


def _period_aggregates() -> sa.Table:
    """The table of the aggregates per billing period, tax region and tax rate."""
    return op.create_table(
        "period_aggregates",
        sa.Column("batch_id", sa.String(255), primary_key=True),
        sa.Column("account_id", sa.String(64), primary_key=True),
        sa.Column("product", sa.String(255), primary_key=True),
        sa.Column("period", sa.String(7), primary_key=True),
        sa.Column("pricebook", sa.String(64), primary_key=True),
        sa.Column("region", sa.String(64), primary_key=True),
        sa.Column("tax_rate", sa.String(32), primary_key=True),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("transactions", sa.BigInteger, nullable=False),
        sa.Column("quantity", quantity_type(), nullable=False),
        sa.Column("net", money_type(), nullable=False),
        sa.Column("tax", money_type(), nullable=False),
        sa.Column("total", money_type(), nullable=False),
    )


def _per_period(conn: sa.Connection, period_aggregates: sa.Table) -> None:
    """Fill ``period_aggregates`` from the aggregates there: summed exactly (in Python) per batch, account, product,
    period and price book, region and rate ``''``; read in key order, a key's rows come together."""
    old = sa.Table(
        "aggregates",
        sa.MetaData(),
        *(sa.Column(name, sa.String) for name in (*_KEY[:3], "pricebook", "currency")),
        sa.Column("billing_day", sa.Date),
        sa.Column("transactions", sa.BigInteger),
        sa.Column("quantity", quantity_type()),
        *(sa.Column(name, money_type()) for name in _SUMMED[2:]),
    )
    rows = conn.execute(sa.select(old).order_by(*(old.c[k] for k in _KEY)).execution_options(yield_per=10_000))
    summed = (_summed(list(group)) for _, group in groupby(rows.mappings(), key=_period_key))
    while chunk := list(islice(summed, 5_000)):
        conn.execute(sa.insert(period_aggregates), chunk)


def _period_key(row: sa.RowMapping) -> tuple[object, ...]:
    return (*(row[k] for k in _KEY[:3]), row["billing_day"].strftime("%Y-%m"), row["pricebook"])


def _summed(rows: list[sa.RowMapping]) -> dict[str, Any]:
    """The rows of one key of ``period_aggregates`` as its row (exact: ints and decimals)."""
    first = rows[0]
    with localcontext(EXACT):
        sums = {name: sum(row[name] for row in rows) for name in _SUMMED}
    kept = {k: first[k] for k in (*_KEY[:3], "pricebook", "currency")}
    return {**kept, "period": first["billing_day"].strftime("%Y-%m"), "region": "", "tax_rate": "", **sums}


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
        raise RuntimeError("aggregates are split by price book: they cannot be downgraded")
    op.drop_table("price_book_rows")
    op.drop_table("period_aggregates")
    _primary_key(_KEY)
    with op.batch_alter_table("aggregates") as batch:
        batch.drop_column("pricebook")
    with op.batch_alter_table("held") as batch:
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
