"""Billing periods closed into documents: what a billing team sends out, numbered, never changed once issued.

:func:`close` issues a period's documents in ONE transaction. What is billed of a period is every counted row
of it: the aggregates of the batches ``complete`` at that moment and not voided. What is documented of it is
the sum of its documents, kept per batch (table ``document_batches``): the difference, per ``(account_id,
currency)`` and product, is what the close issues. Each pair with a non-zero change gets one document: an
``invoice`` the first time the pair is documented for the period, an ``adjustment`` (signed: negative where
usage went away, e.g. a batch voided) after that; a line per product whose change is not zero, naming the
batches whose rows changed it. Documents are numbered 1, 2, 3, … across the whole ledger from the gap-free
counter ``document_number`` (:func:`store.ledger.numbers.take_numbers`), within one close in ``(account_id,
currency)`` order by code point. Closes are serialised: a PostgreSQL advisory lock held to the end of the
transaction, ``BEGIN IMMEDIATE`` on SQLite. Nothing ever updates or deletes a document. A close records its period
as closed (:func:`store.ledger.periods.mark_closed`): rows of it counted later are late.
"""

from __future__ import annotations

import calendar
import dataclasses
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal, localcontext
from typing import Any, Literal

import sqlalchemy as sa

from .. import schema
from ..batches import BatchState
from ..engine import CHUNK, chunks, writing
from ..queries import PERIOD_PATTERN
from ..schema import EXACT, aggregates, batches, document_batches, document_lines
from .numbers import LedgerError, take_numbers
from .periods import CLOSE_LOCK, mark_closed

Kind = Literal["invoice", "adjustment"]
KINDS: tuple[Kind, ...] = ("invoice", "adjustment")
#: The counter of document numbers.
DOCUMENT_NUMBER = "document_number"
MEASURES = ("transactions", "quantity", "net", "tax", "total")

#: (account_id, currency, product, batch_id)
_Key = tuple[str, str, str, str]


@dataclass(frozen=True)
class Sums:
    """Transactions, exact quantity, and money in minor units (signed in a change)."""

    transactions: int = 0
    quantity: Decimal = Decimal(0)
    net: int = 0
    tax: int = 0
    total: int = 0

    def __add__(self, other: Sums) -> Sums:
        with localcontext(EXACT):
            return Sums(*(getattr(self, m) + getattr(other, m) for m in MEASURES))

    def __sub__(self, other: Sums) -> Sums:
        with localcontext(EXACT):
            return Sums(*(getattr(self, m) - getattr(other, m) for m in MEASURES))

    def __bool__(self) -> bool:
        return any(getattr(self, m) for m in MEASURES)

    @classmethod
    def of(cls, row: sa.RowMapping) -> Sums:
        return cls(int(row["transactions"]), Decimal(row["quantity"]), *(int(row[m]) for m in ("net", "tax", "total")))

    def values(self) -> dict[str, Any]:
        return {m: getattr(self, m) for m in MEASURES}


@dataclass(frozen=True)
class Line:
    """A document's line: one product's change, and the batches whose rows changed it."""

    product: str
    sums: Sums
    batches: tuple[str, ...]

    def to_json_dict(self) -> dict[str, Any]:
        """``product``, ``transactions``, ``quantity`` (decimal text), ``net``, ``tax``, ``total``, ``batches``."""
        return {
            "product": self.product,
            "transactions": self.sums.transactions,
            "quantity": quantity_text(self.sums.quantity),
            "net": self.sums.net,
            "tax": self.sums.tax,
            "total": self.sums.total,
            "batches": list(self.batches),
        }


@dataclass(frozen=True)
class Document:
    """An issued document (an invoice or an adjustment)."""

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

    def to_json_dict(self) -> dict[str, Any]:
        """The document as JSON values: money as integer minor units, ``issued_at`` ISO 8601."""
        return {
            "number": self.number,
            "kind": self.kind,
            "period": self.period,
            "account_id": self.account_id,
            "currency": self.currency,
            "issued_at": self.issued_at.isoformat(),
            "net": self.net,
            "tax": self.tax,
            "total": self.total,
            "pricebooks": list(self.pricebooks),
            "tax_tables": list(self.tax_tables),
            "lines": [line.to_json_dict() for line in self.lines],
        }


@dataclass(frozen=True)
class Difference:
    """What the next close of a period would issue for one ``(account_id, currency)``: a document not yet
    numbered, its lines naming their batches."""

    kind: Kind
    period: str
    account_id: str
    currency: str
    lines: tuple[Line, ...]

    @property
    def sums(self) -> Sums:
        return sum((line.sums for line in self.lines), Sums())

    def to_json_dict(self) -> dict[str, Any]:
        """As a document's JSON, without ``number``, ``issued_at`` and the hashes."""
        sums = self.sums
        return {
            "kind": self.kind,
            "period": self.period,
            "account_id": self.account_id,
            "currency": self.currency,
            "net": sums.net,
            "tax": sums.tax,
            "total": sums.total,
            "lines": [line.to_json_dict() for line in self.lines],
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


def quantity_text(value: Decimal) -> str:
    """A plain decimal text without exponent or trailing zeros (``-12.5``, ``3``, ``0``)."""
    if value == 0:
        return "0"
    with localcontext(EXACT):
        return format(value.normalize(), "f")


def period_days(period: str, today: date) -> tuple[date, date]:
    """The first and last day of a period ``YYYY-MM`` that is not in the future; :class:`LedgerError` else."""
    if not re.fullmatch(PERIOD_PATTERN, period):
        raise LedgerError(f"billing period {period!r} is not YYYY-MM")
    year, month = int(period[:4]), int(period[5:])
    if (year, month) > (today.year, today.month):
        raise LedgerError(f"billing period {period} is in the future (today is {today.isoformat()}): nothing closed")
    return date(year, month, 1), date(year, month, calendar.monthrange(year, month)[1])


def close(engine: sa.Engine, period: str, *, now: datetime | None = None) -> list[Document]:
    """Issue the documents of ``period`` (see the module), in one transaction; those issued, in number order
    (none when nothing changed since the period's last close)."""
    now = now or datetime.now(UTC)
    first, last = period_days(period, now.date())
    with writing(engine) as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(CLOSE_LOCK)))
        mark_closed(conn, period, now)
        differences, changes = _differences(conn, period, first, last)
        if not differences:
            return []
        number = take_numbers(conn, DOCUMENT_NUMBER, len(differences))
        issued = _insert(conn, [_numbered(number + i, d, now) for i, d in enumerate(differences)], changes)
    return issued


def pending(engine: sa.Engine, period: str, *, today: date | None = None) -> list[Difference]:
    """What closing ``period`` now would issue, in the order it would number them; nothing is written.
    :class:`LedgerError` for a malformed or future period."""
    first, last = period_days(period, today or datetime.now(UTC).date())
    with engine.connect() as conn:
        return _differences(conn, period, first, last)[0]


def periods(engine: sa.Engine, only: str | None = None) -> list[Period]:
    """Every period with billed rows (complete batches, not voided) or documents, newest first; or only the
    period ``only`` (none when it has neither)."""
    a = aggregates
    billed_days = (
        sa.select(a.c.billing_day)
        .distinct()
        .select_from(a.join(batches, a.c.batch_id == batches.c.batch_id))
        .where(batches.c.state == BatchState.complete.value, batches.c.voided_at.is_(None))
    )
    issued = sa.select(schema.documents.c.period, sa.func.count()).group_by(schema.documents.c.period)
    if only is not None:
        first, last = period_days(only, date.max)
        billed_days = billed_days.where(a.c.billing_day >= first, a.c.billing_day <= last)
        issued = issued.where(schema.documents.c.period == only)
    found = []
    with engine.connect() as conn:
        counts = {row[0]: int(row[1]) for row in conn.execute(issued)}
        closed = set(conn.execute(sa.select(schema.closed_periods.c.period)).scalars())
        names = {day.strftime("%Y-%m") for day in conn.execute(billed_days).scalars()} | counts.keys()
        names |= closed if only is None else closed & {only}
        for name in sorted(names, reverse=True):
            differences = _differences(conn, name, *period_days(name, date.max))[0]
            found.append(Period(name, name in closed, counts.get(name, 0), tuple(differences)))
    return found


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
    ``offset`` on (None: all)."""
    query = sa.select(schema.documents).limit(limit).offset(offset)
    for column, value in (("period", period), ("account_id", account), ("kind", kind)):
        if value is not None:
            query = query.where(schema.documents.c[column] == value)
    with engine.connect() as conn:
        heads = conn.execute(query.order_by(schema.documents.c.number)).mappings().all()
        return _with_lines(conn, heads)


def document(engine: sa.Engine, number: int) -> Document | None:
    """The document numbered ``number``, if issued."""
    with engine.connect() as conn:
        query = sa.select(schema.documents).where(schema.documents.c.number == number)
        heads = conn.execute(query).mappings().all()
        found = _with_lines(conn, heads)
    return found[0] if found else None


def _billed(conn: sa.Connection, first: date, last: date) -> dict[_Key, Sums]:
    """What the counted rows of the period add up to, per account, currency, product and batch."""
    a = aggregates
    query = (
        sa.select(a.c.account_id, a.c.currency, a.c.product, a.c.batch_id, *(a.c[m] for m in MEASURES))
        .select_from(a.join(batches, a.c.batch_id == batches.c.batch_id))
        .where(
            batches.c.state == BatchState.complete.value,
            batches.c.voided_at.is_(None),
            a.c.billing_day >= first,
            a.c.billing_day <= last,
        )
    )
    return _summed(conn.execute(query).mappings())


def _documented(conn: sa.Connection, period: str) -> tuple[dict[_Key, Sums], set[tuple[str, str]]]:
    """What the period's documents add up to, per account, currency, product and batch; and the pairs that have
    a document of the period."""
    d, b = schema.documents, document_batches
    query = (
        sa.select(d.c.account_id, d.c.currency, b.c.product, b.c.batch_id, *(b.c[m] for m in MEASURES))
        .select_from(b.join(d, b.c.number == d.c.number))
        .where(d.c.period == period)
    )
    pairs = sa.select(d.c.account_id, d.c.currency).where(d.c.period == period).distinct()
    return _summed(conn.execute(query).mappings()), {(r.account_id, r.currency) for r in conn.execute(pairs)}


def _summed(rows: Iterable[sa.RowMapping]) -> dict[_Key, Sums]:
    found: dict[_Key, Sums] = defaultdict(Sums)
    for row in rows:
        key = (row["account_id"], row["currency"], row["product"], row["batch_id"])
        found[key] = found[key] + Sums.of(row)
    return found


def _diff(billed: Mapping[_Key, Sums], documented: Mapping[_Key, Sums], key: _Key) -> Sums:
    return billed.get(key, Sums()) - documented.get(key, Sums())


def _differences(
    conn: sa.Connection, period: str, first: date, last: date
) -> tuple[list[Difference], dict[_Key, Sums]]:
    """What a close of ``period`` would issue, in ``(account_id, currency)`` order: per pair, its products whose
    change is not zero (only the pairs with such a product); and the per-batch changes they sum."""
    billed = _billed(conn, first, last)
    documented, pairs_documented = _documented(conn, period)
    changes = {key: change for key in billed.keys() | documented.keys() if (change := _diff(billed, documented, key))}
    per_line: dict[tuple[str, str], dict[str, list[tuple[str, Sums]]]] = defaultdict(lambda: defaultdict(list))
    for (account_id, currency, product, batch_id), change in sorted(changes.items()):
        per_line[account_id, currency][product].append((batch_id, change))
    differences = []
    for (account_id, currency), products in sorted(per_line.items()):
        lines = []
        for product, of_batches in sorted(products.items()):
            sums = sum((change for _, change in of_batches), Sums())
            if sums:
                lines.append(Line(product, sums, tuple(batch_id for batch_id, _ in of_batches)))
        if lines:
            kind: Kind = "adjustment" if (account_id, currency) in pairs_documented else "invoice"
            differences.append(Difference(kind, period, account_id, currency, tuple(lines)))
    return differences, changes


def _hashes(conn: sa.Connection, batch_ids: set[str]) -> dict[str, tuple[str | None, str | None]]:
    query = sa.select(batches.c.batch_id, batches.c.pricebook_hash, batches.c.taxes_hash).where(
        batches.c.batch_id.in_(sorted(batch_ids))
    )
    return {r.batch_id: (r.pricebook_hash, r.taxes_hash) for r in conn.execute(query)}


def _numbered(number: int, difference: Difference, now: datetime) -> Document:
    """A difference as a document numbered ``number``, not yet knowing its reference data (:func:`_insert`)."""
    d, sums = difference, difference.sums
    return Document(
        number, d.kind, d.period, d.account_id, d.currency, now, sums.net, sums.tax, sums.total, (), (), d.lines
    )


def _insert(conn: sa.Connection, issued: list[Document], changes: Mapping[_Key, Sums]) -> list[Document]:
    """Write the documents, their lines and the per-batch changes each line sums (one statement a table); the
    documents returned with the price book and tax table hashes of their lines' batches."""
    batch_hashes = _hashes(conn, {key[3] for key in changes})
    heads, lines, per_batch, written = [], [], [], []
    for doc in issued:
        for line in doc.lines:
            lines.append({"number": doc.number, "product": line.product, **line.sums.values()})
            per_batch += [
                {"number": doc.number, "product": line.product, "batch_id": batch_id}
                | changes[doc.account_id, doc.currency, line.product, batch_id].values()
                for batch_id in line.batches
            ]
        used = {batch_id for line in doc.lines for batch_id in line.batches}
        doc = dataclasses.replace(
            doc,
            pricebooks=tuple(sorted({h for b in used if (h := batch_hashes[b][0])})),
            tax_tables=tuple(sorted({h for b in used if (h := batch_hashes[b][1])})),
        )
        head = {f.name: getattr(doc, f.name) for f in dataclasses.fields(doc) if f.name != "lines"}
        heads.append({**head, "pricebooks": " ".join(doc.pricebooks), "tax_tables": " ".join(doc.tax_tables)})
        written.append(doc)
    for table, rows in ((schema.documents, heads), (document_lines, lines), (document_batches, per_batch)):
        for chunk in chunks(rows, CHUNK):
            conn.execute(sa.insert(table), chunk)
    return written


def _with_lines(conn: sa.Connection, heads: Sequence[sa.RowMapping]) -> list[Document]:
    if not heads:
        return []
    numbers = [head["number"] for head in heads]
    lines: dict[int, list[Line]] = defaultdict(list)
    batches_of: dict[tuple[int, str], list[str]] = defaultdict(list)
    for number_chunk in (numbers[i : i + 500] for i in range(0, len(numbers), 500)):
        query = sa.select(document_batches.c.number, document_batches.c.product, document_batches.c.batch_id)
        for found in conn.execute(query.where(document_batches.c.number.in_(number_chunk))):
            batches_of[found.number, found.product].append(found.batch_id)
        of_lines = sa.select(document_lines).where(document_lines.c.number.in_(number_chunk))
        for row in conn.execute(of_lines).mappings():
            batch_ids = tuple(sorted(batches_of[row["number"], row["product"]]))
            lines[row["number"]].append(Line(row["product"], Sums.of(row), batch_ids))
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
            lines=tuple(sorted(lines[head["number"]], key=lambda line: line.product)),
        )
        for head in heads
    ]
