"""Documents an accountant accepts: the seller's and the customers' versions, the changes settled without a
document, and what a document holds besides Part 2 (display number, what it corrects, due date, snapshots).

Documents issued before keep their numbers: each ``adjustment`` becomes a ``credit_note`` (total below zero) or a
``debit_note``, ``corrects`` the earlier documents of its ``(account_id, period, currency)``; every one gets the
display number ``INV-`` and its number padded to 6 digits. They have no snapshots and no due date (no parties
existed when they were issued).

Revision ID: 0015
Revises: 0013
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime, money_type, quantity_type

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NEW_COLUMNS = ("display_number", "corrects", "due_date", "seller", "customer")


def _measures() -> list[sa.Column[object]]:
    return [
        sa.Column("transactions", sa.BigInteger, nullable=False),
        sa.Column("quantity", quantity_type(), nullable=False),
        sa.Column("net", money_type(), nullable=False),
        sa.Column("tax", money_type(), nullable=False),
        sa.Column("total", money_type(), nullable=False),
    ]


def upgrade() -> None:
    op.add_column("documents", sa.Column("display_number", sa.String(48), nullable=True))
    op.add_column("documents", sa.Column("corrects", sa.Text, nullable=True))
    op.add_column("documents", sa.Column("due_date", sa.Date, nullable=True))
    op.add_column("documents", sa.Column("seller", sa.Text, nullable=True))
    op.add_column("documents", sa.Column("customer", sa.Text, nullable=True))
    op.create_table(
        "sellers",
        sa.Column("version", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("address", sa.Text, nullable=False),
        sa.Column("country", sa.String(2), nullable=False),
        sa.Column("tax_id", sa.String(64), nullable=False),
        sa.Column("payment_terms_days", sa.Integer, nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("set_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "customers",
        sa.Column("account_id", sa.String(64), primary_key=True),
        sa.Column("version", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("address", sa.Text, nullable=False),
        sa.Column("country", sa.String(2), nullable=False),
        sa.Column("tax_id", sa.String(64), nullable=True),
        sa.Column("email", sa.String(254), nullable=True),
        sa.Column("set_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "settled_changes",
        sa.Column("period", sa.String(7), primary_key=True),
        sa.Column("account_id", sa.String(64), primary_key=True),
        sa.Column("currency", sa.String(3), primary_key=True),
        sa.Column("product", sa.String(255), primary_key=True),
        sa.Column("batch_id", sa.String(255), primary_key=True),
        *_measures(),
    )
    _fill_documents()


def _fill_documents() -> None:
    """Kinds by sign, ``corrects`` and display numbers for the documents issued before this revision."""
    documents = sa.table(
        "documents",
        sa.column("number", sa.BigInteger),
        sa.column("kind", sa.String),
        sa.column("period", sa.String),
        sa.column("account_id", sa.String),
        sa.column("currency", sa.String),
        sa.column("total", money_type()),
        sa.column("display_number", sa.String),
        sa.column("corrects", sa.Text),
    )
    conn = op.get_bind()
    query = sa.select(*(documents.c[name] for name in ("number", "kind", "period", "account_id", "currency", "total")))
    earlier: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for row in conn.execute(query.order_by(documents.c.number)).all():
        before = earlier[row.period, row.account_id, row.currency]
        kind = row.kind if row.kind != "adjustment" else "credit_note" if int(row.total) < 0 else "debit_note"
        values = {
            "kind": kind,
            "display_number": f"INV-{int(row.number):06d}",
            "corrects": " ".join(str(n) for n in before) if kind != "invoice" else "",
        }
        conn.execute(sa.update(documents).where(documents.c.number == row.number).values(**values))
        before.append(int(row.number))


def downgrade() -> None:
    documents = sa.table("documents", sa.column("kind", sa.String))
    op.execute(
        sa.update(documents).where(documents.c.kind.in_(("credit_note", "debit_note"))).values(kind="adjustment")
    )
    op.drop_table("settled_changes")
    op.drop_table("customers")
    op.drop_table("sellers")
    with op.batch_alter_table("documents") as batch:
        for name in reversed(_NEW_COLUMNS):
            batch.drop_column(name)
