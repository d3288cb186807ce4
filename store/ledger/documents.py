"""Documents: what a close issues (:mod:`store.ledger.closing`), and reading them.

A document is an ``invoice`` (its ``(account_id, period, currency)`` triple's first), then a ``credit_note``
(a later one whose total is negative) or a ``debit_note`` (a later one, total zero or more). A note
``corrects`` every earlier document of its triple; ``corrected_by`` (read, not stored) names the later ones.
It keeps snapshots of the seller and of its customer as they were at issue (:mod:`store.ledger.parties`;
None for documents issued before parties existed, and ``customer`` None for an account without a record),
its ``display_number`` (the seller's prefix and the number padded to 6 digits) and its ``due_date`` (the UTC
date of ``issued_at`` plus the seller's payment terms). Nothing ever updates or deletes a document.

Its lines are per product and price book (:mod:`store.ledger.lines`), with the unit and prices of that price book's
stored rows (``price_book_rows``, by content hash); its tax per rate is read from what each batch changed of it
(``document_batches`` keeps the tax region and rate).
"""

from __future__ import annotations

import calendar
import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Literal

import sqlalchemy as sa

from .. import schema
from ..queries import PERIOD_PATTERN
from ..pricebooks import read as price_rows
from ..schema import document_batches, document_lines
from .lines import Line, Sums, Tax, taxes_of
from .numbers import LedgerError

Kind = Literal["invoice", "credit_note", "debit_note"]
KINDS: tuple[Kind, ...] = ("invoice", "credit_note", "debit_note")
#: What a document's JSON shows of its seller snapshot (the store keeps the payment terms and prefix too).
SELLER_KEYS = ("name", "address", "country", "tax_id")


@dataclass(frozen=True)
class Document:
    """An issued document: an invoice, a credit note or a debit note."""

    number: int
    kind: Kind
    period: str
    account_id: str
    currency: str
    issued_at: datetime
    net: int
    tax: int
    total: int
    pricebooks: tuple[str, ...]
    tax_tables: tuple[str, ...]
    lines: tuple[Line, ...]
    display_number: str
    corrects: tuple[int, ...] = ()
    corrected_by: tuple[int, ...] = ()
    seller: Mapping[str, Any] | None = None
    customer: Mapping[str, Any] | None = None
    due_date: date | None = None
    taxes: tuple[Tax, ...] = ()

    @property
    def service_period(self) -> tuple[date, date]:
        """The period's first and last UTC day."""
        return period_days(self.period)

    def to_json_dict(self) -> dict[str, Any]:
        """The document as JSON values: money as integer minor units, times and dates ISO 8601."""
        first, last = self.service_period
        return {
            "number": self.number,
            "display_number": self.display_number,
            "kind": self.kind,
            "period": self.period,
            "account_id": self.account_id,
            "currency": self.currency,
            "issued_at": self.issued_at.isoformat(),
            "due_date": self.due_date.isoformat() if self.due_date else None,
            "service_period": {"from": first.isoformat(), "to": last.isoformat()},
            "seller": None if self.seller is None else {k: self.seller.get(k) for k in SELLER_KEYS},
            "customer": None if self.customer is None else dict(self.customer),
            "net": self.net,
            "tax": self.tax,
            "total": self.total,
            "corrects": list(self.corrects),
            "corrected_by": list(self.corrected_by),
            "pricebooks": list(self.pricebooks),
            "tax_tables": list(self.tax_tables),
            "lines": [line.to_json_dict() for line in self.lines],
            "taxes": [tax.to_json_dict() for tax in self.taxes],
        }


@dataclass(frozen=True)
class Difference:
    """What the next close of a period would issue for one ``(account_id, currency)``: a document not yet
    numbered, its lines naming their batches, its tax per rate, ``corrects`` the earlier documents of its triple."""

    kind: Kind
    period: str
    account_id: str
    currency: str
    lines: tuple[Line, ...]
    corrects: tuple[int, ...] = ()
    taxes: tuple[Tax, ...] = ()

    @property
    def sums(self) -> Sums:
        return sum((line.sums for line in self.lines), Sums())

    def to_json_dict(self) -> dict[str, Any]:
        """As a document's JSON, without what issuing gives (number, dates, snapshots, hashes)."""
        sums = self.sums
        return {
            "kind": self.kind,
            "period": self.period,
            "account_id": self.account_id,
            "currency": self.currency,
            "net": sums.net,
            "tax": sums.tax,
            "total": sums.total,
            "corrects": list(self.corrects),
            "lines": [line.to_json_dict() for line in self.lines],
            "taxes": [tax.to_json_dict() for tax in self.taxes],
        }


@dataclass(frozen=True)
class Period:
    """A billing period with billed rows or documents: ``closed`` from its first close on (even one that issued
    nothing); ``pending`` is what its next close would issue (for a period never closed, everything billed)."""

    period: str
    closed: bool
    documents: int
    pending: tuple[Difference, ...]

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "period": self.period,
            "state": "closed" if self.closed else "open",
            "documents": self.documents,
            "pending": [difference.to_json_dict() for difference in self.pending],
        }


def period_days(period: str, today: date = date.max) -> tuple[date, date]:
    """The first and last day of a period ``YYYY-MM`` that is not after ``today``'s; :class:`LedgerError` else."""
    if not re.fullmatch(PERIOD_PATTERN, period):
        raise LedgerError(f"billing period {period!r} is not YYYY-MM")
    year, month = int(period[:4]), int(period[5:])
    if (year, month) > (today.year, today.month):
        raise LedgerError(f"billing period {period} is in the future (today is {today.isoformat()}): nothing closed")
    return date(year, month, 1), date(year, month, calendar.monthrange(year, month)[1])


def display_number(prefix: str, number: int) -> str:
    """``INV-000123``: the prefix and the number padded to 6 digits."""
    return f"{prefix}{number:06d}"


def documents(
    engine: sa.Engine,
    *,
    period: str | None = None,
    account: str | None = None,
    kind: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> list[Document]:
    """The documents issued, by number, of a period, an account, a kind (None: any); ``limit`` of them from
    ``offset`` on (None: all). :class:`LedgerError` for a malformed period."""
    if period is not None:
        period_days(period)
    query = sa.select(schema.documents).limit(limit).offset(offset)
    for column, value in (("period", period), ("account_id", account), ("kind", kind)):
        if value is not None:
            query = query.where(schema.documents.c[column] == value)
    with engine.connect() as conn:
        heads = conn.execute(query.order_by(schema.documents.c.number)).mappings().all()
        return with_lines(conn, heads)


def document(engine: sa.Engine, number: int) -> Document | None:
    """The document numbered ``number``, if issued."""
    with engine.connect() as conn:
        query = sa.select(schema.documents).where(schema.documents.c.number == number)
        heads = conn.execute(query).mappings().all()
        found = with_lines(conn, heads)
    return found[0] if found else None


def with_lines(conn: sa.Connection, heads: Sequence[sa.RowMapping]) -> list[Document]:
    """The documents of rows of table ``documents``, with their lines (and their price books' rows), their tax per
    rate (from what each batch changed) and the notes that correct them."""
    if not heads:
        return []
    lines, taxes = _lines_and_taxes(conn, [int(head["number"]) for head in heads])
    later = _of_triples(conn, heads)
    return [
        Document(
            number=int(head["number"]),
            kind=head["kind"],
            period=head["period"],
            account_id=head["account_id"],
            currency=head["currency"],
            issued_at=head["issued_at"],
            net=int(head["net"]),
            tax=int(head["tax"]),
            total=int(head["total"]),
            pricebooks=tuple(head["pricebooks"].split()),
            tax_tables=tuple(head["tax_tables"].split()),
            lines=tuple(sorted(lines[head["number"]], key=lambda line: (line.product, line.pricebook))),
            display_number=head["display_number"] or str(head["number"]),
            corrects=tuple(int(n) for n in (head["corrects"] or "").split()),
            corrected_by=tuple(n for n in later[_triple(head)] if n > head["number"]),
            seller=None if head["seller"] is None else json.loads(head["seller"]),
            customer=None if head["customer"] is None else json.loads(head["customer"]),
            due_date=head["due_date"],
            taxes=taxes_of(taxes[head["number"]]),
        )
        for head in heads
    ]


def _lines_and_taxes(
    conn: sa.Connection, numbers: list[int]
) -> tuple[dict[int, list[Line]], dict[int, list[tuple[str, str, Sums]]]]:
    """Per document number: its lines, and what each batch changed as ``(tax_rate, region, sums)``. A line none of
    whose batches has its price book (one from before lines were split by price book) names those of its product."""
    b = document_batches
    batches_of: dict[tuple[int, str, str], set[str]] = defaultdict(set)
    of_product: dict[tuple[int, str], set[str]] = defaultdict(set)
    changes: dict[int, list[tuple[str, str, Sums]]] = defaultdict(list)
    found_lines: list[sa.RowMapping] = []
    for chunk in (numbers[i : i + 500] for i in range(0, len(numbers), 500)):
        of_batches = sa.select(b).where(b.c.number.in_(chunk))
        for row in conn.execute(of_batches).mappings():
            batches_of[row["number"], row["product"], row["pricebook"]].add(row["batch_id"])
            of_product[row["number"], row["product"]].add(row["batch_id"])
            changes[row["number"]].append((row["tax_rate"], row["region"], Sums.of(row)))
        found_lines += conn.execute(sa.select(document_lines).where(document_lines.c.number.in_(chunk))).mappings()
    prices = price_rows(conn, {row["pricebook"] for row in found_lines} - {""})
    lines: dict[int, list[Line]] = defaultdict(list)
    for row in found_lines:
        number, product, pricebook = row["number"], row["product"], row["pricebook"]
        batch_ids = tuple(sorted(batches_of.get((number, product, pricebook)) or of_product[number, product]))
        lines[number].append(Line(product, Sums.of(row), batch_ids, pricebook, prices.get((pricebook, product))))
    return lines, changes


def _triple(row: sa.RowMapping) -> tuple[str, str, str]:
    return (row["period"], row["account_id"], row["currency"])


def _of_triples(conn: sa.Connection, heads: Sequence[sa.RowMapping]) -> dict[tuple[str, str, str], list[int]]:
    """The numbers of every document of the heads' ``(period, account_id, currency)`` triples, ascending."""
    d = schema.documents
    wanted = {_triple(head) for head in heads}
    query = sa.select(d.c.number, d.c.period, d.c.account_id, d.c.currency).order_by(d.c.number)
    accounts = sorted({account for _, account, _ in wanted})
    if len(accounts) <= 500:
        query = query.where(d.c.account_id.in_(accounts))
    found: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for row in conn.execute(query).mappings():
        if (triple := _triple(row)) in wanted:
            found[triple].append(int(row["number"]))
    return found
