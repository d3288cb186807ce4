"""The rows of the price books batches were rated with (table ``price_book_rows``), by content hash: what a document
shows of a line's prices (its unit, unit and off-peak prices as the price book writes them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from .engine import CHUNK, chunks
from .schema import price_book_rows

if TYPE_CHECKING:  # in annotations only: the store reads without loading the rating rules
    from shared.rules.reference import PriceBook


@dataclass(frozen=True)
class PriceRow:
    """One product of a price book: prices as decimal text (``offpeak_unit_price`` the unit price's where the book
    leaves it empty; ``minimum_charge`` None for none)."""

    pricebook: str
    product: str
    currency: str
    unit: str
    unit_price: str
    offpeak_unit_price: str
    minimum_charge: str | None


def price_rows_of(book: PriceBook) -> list[PriceRow]:
    """A price book's rows."""
    return [
        PriceRow(book.content_hash, product, price.currency, price.unit, *price.texts[:2], price.texts[2] or None)
        for product, price in zip(book.products, book.prices, strict=True)
    ]


def known(conn: sa.Connection, hashes: Iterable[str]) -> set[str]:
    """Those of ``hashes`` whose rows are recorded."""
    query = sa.select(price_book_rows.c.pricebook).distinct()
    return {
        found
        for chunk in chunks(sorted(set(hashes)), CHUNK)
        for found in conn.scalars(query.where(price_book_rows.c.pricebook.in_(chunk)))
    }


def record(conn: sa.Connection, rows: Iterable[PriceRow]) -> None:
    """Record the rows of the price books not recorded yet (a price book's rows are recorded whole, once; one that
    another writer records meanwhile is left as it is)."""
    by_book: dict[str, list[PriceRow]] = {}
    for row in rows:
        by_book.setdefault(row.pricebook, []).append(row)
    new = [row.__dict__ for book in sorted(by_book.keys() - known(conn, by_book)) for row in by_book[book]]
    insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(price_book_rows)
    for chunk in chunks(new, CHUNK):
        conn.execute(insert.on_conflict_do_nothing(), chunk)


def read(conn: sa.Connection, hashes: Iterable[str]) -> Mapping[tuple[str, str], PriceRow]:
    """The rows of the price books named, by (price book, product)."""
    t = price_book_rows
    found: dict[tuple[str, str], PriceRow] = {}
    for chunk in chunks(sorted(set(hashes)), CHUNK):
        for r in conn.execute(sa.select(t).where(t.c.pricebook.in_(chunk))).mappings():
            found[r["pricebook"], r["product"]] = PriceRow(**r)
    return found
