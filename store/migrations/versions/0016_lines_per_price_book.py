"""Lines per price book and tax per rate: what is documented (``document_batches``, ``settled_changes``) is kept per
price book, tax region and tax rate, as the aggregates are (all three in the key), and a document's lines per
product and price book (``document_lines`` keyed by number, product and price book).

Rows from before take what the aggregates of revision 0014 took for the rows of that time: their batch's price book,
region ``''`` and rate ``''`` (not recorded), so that what was documented still meets what is billed. An existing
line takes the single price book of its document where the document names one, else ``''``.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEYS = {
    "document_batches": ["number", "product", "batch_id"],
    "settled_changes": ["period", "account_id", "currency", "product", "batch_id"],
}
_RATED_BY = ("pricebook", "region", "tax_rate")
_BATCH_PRICEBOOK = "(SELECT coalesce(b.pricebook_hash, '') FROM batches b WHERE b.batch_id = {}.batch_id)"
#: A line's price book: its document's, where the document names exactly one.
_LINE_PRICEBOOK = (
    "(SELECT CASE WHEN d.pricebooks <> '' AND d.pricebooks NOT LIKE '% %' THEN d.pricebooks ELSE '' END "
    "FROM documents d WHERE d.number = document_lines.number)"
)


def upgrade() -> None:
    for table, key in _KEYS.items():
        _add_key_columns(table, _RATED_BY)
        op.execute(f"UPDATE {table} SET pricebook = {_BATCH_PRICEBOOK.format(table)}")
        _primary_key(table, [*key[:-1], *_RATED_BY, key[-1]])
    _add_key_columns("document_lines", ("pricebook",))
    op.execute(f"UPDATE document_lines SET pricebook = coalesce({_LINE_PRICEBOOK}, '')")
    _primary_key("document_lines", ["number", "product", "pricebook"])


def downgrade() -> None:
    conn = op.get_bind()
    for table, key in (*_KEYS.items(), ("document_lines", ["number", "product"])):
        split = f"SELECT count(*) FROM (SELECT 1 FROM {table} GROUP BY {', '.join(key)} HAVING count(*) > 1) s"
        if conn.execute(sa.text(split)).scalar():
            raise RuntimeError(f"{table} is split by price book, region or rate: it cannot be downgraded")
    for table, key in (*_KEYS.items(), ("document_lines", ["number", "product"])):
        _primary_key(table, key)
        with op.batch_alter_table(table) as batch:
            for column in _RATED_BY if table != "document_lines" else ("pricebook",):
                batch.drop_column(column)


def _add_key_columns(table: str, columns: Sequence[str]) -> None:
    """Add ``columns`` to ``table``, not null, ``''`` in the rows there."""
    sizes = {"pricebook": 64, "region": 64, "tax_rate": 32}
    with op.batch_alter_table(table) as batch:
        for column in columns:
            batch.add_column(sa.Column(column, sa.String(sizes[column]), nullable=False, server_default=""))
    with op.batch_alter_table(table) as batch:
        for column in columns:
            batch.alter_column(column, existing_type=sa.String(sizes[column]), server_default=None)


def _primary_key(table: str, columns: list[str]) -> None:
    """Make ``columns`` the key of ``table`` (SQLite: the table copied with it)."""
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint(f"{table}_pkey", table, type_="primary")
        op.create_primary_key(f"{table}_pkey", table, columns)
        return
    reflected = sa.Table(table, sa.MetaData(), autoload_with=op.get_bind())
    keyed = sa.Table(
        table,
        sa.MetaData(),
        *(sa.Column(c.name, c.type, primary_key=c.name in columns, nullable=c.nullable) for c in reflected.columns),
    )
    for index in reflected.indexes:
        sa.Index(index.name, *(keyed.c[c.name] for c in index.columns), unique=index.unique)
    with op.batch_alter_table(table, recreate="always", copy_from=keyed):
        pass
