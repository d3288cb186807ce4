"""Billing periods closed into documents: what a billing team sends out, numbered, never changed once issued.

:func:`close` issues a period's documents in ONE transaction. What is billed of a period is every counted row
of it: the aggregates of the batches ``complete`` at that moment and not voided. What is documented of it is
the sum of its documents, kept per batch (table ``document_batches``), and of the changes settled without one
(table ``settled_changes``): the difference, per ``(account_id, currency)`` and product, is what the close
issues; both are kept per product, price book, tax region and tax rate (as ``period_aggregates`` are), so that a
document has a line per product and price book and its tax per rate. Each pair with a change gets one document
(:mod:`store.ledger.documents`: an ``invoice`` the first time, then a ``credit_note`` or ``debit_note`` by the sign
of its total, correcting the earlier ones), a line per product and price book whose change is not zero, naming
the batches whose rows changed it, and a tax entry per rate of those changes; a pair whose every line is at net 0
and tax 0 gets none, its change settled all the same. Documents are numbered 1, 2, 3, … across the
whole ledger from the gap-free counter ``document_number`` (:func:`store.ledger.numbers.take_numbers`),
within one close in ``(account_id, currency)`` order by code point, and snapshot the seller and the
customer in force (:mod:`store.ledger.parties`).

Only an ended period closes (its last day before today, UTC), and only once a seller is registered; with
``require_customers`` only when every account to document has a customer record. Closes are serialised: a
PostgreSQL advisory lock held to the end of the transaction, ``BEGIN IMMEDIATE`` on SQLite. A close records
its period as closed (:func:`store.ledger.periods.mark_closed`): rows of it counted later are late.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime, timedelta
from typing import cast

import sqlalchemy as sa

from .. import schema
from ..batches import BatchState
from ..engine import CHUNK, chunks, writing
from ..pricebooks import PriceRow
from ..pricebooks import read as price_rows
from ..schema import batches, document_batches, document_lines, period_aggregates, settled_changes
from .documents import Difference, Document, Kind, Period, display_number, period_days
from .lines import MEASURES, Line, Sums, taxes_of
from .numbers import LedgerError, take_numbers
from .parties import Customer, Seller, current_seller, customers_of
from .periods import CLOSE_LOCK, mark_closed

#: The counter of document numbers.
DOCUMENT_NUMBER = "document_number"
NO_SELLER = "no seller registered: register one first (billing seller set --name N --address A --country CC --tax-id T)"
#: How many accounts without a customer record a refusal names.
NAMED = 5

#: (account_id, currency, product, pricebook, region, tax_rate, batch_id); ``''``: not recorded
_Key = tuple[str, str, str, str, str, str, str]
_KEY = ("account_id", "currency", "product", "pricebook", "region", "tax_rate", "batch_id")
#: A document's line: (account_id, currency, product, pricebook)
_LineKey = tuple[str, str, str, str]


def ended(period: str, now: datetime) -> tuple[date, date]:
    """The first and last day of ``period`` if it has ended by ``now`` (UTC); :class:`LedgerError` else."""
    today = now.astimezone(UTC).date()
    first, last = period_days(period, today)
    if last >= today:
        raise LedgerError(
            f"billing period {period} has not ended (today is {today.isoformat()}): "
            f"it can be closed from {(last + timedelta(days=1)).isoformat()} on"
        )
    return first, last


def close(
    engine: sa.Engine, period: str, *, now: datetime | None = None, require_customers: bool = False
) -> list[Document]:
    """Issue the documents of ``period`` (see the module), in one transaction; those issued, in number order
    (none when nothing changed since the period's last close). :class:`LedgerError`, nothing written, for a
    period that cannot be closed, no seller, or (``require_customers``) an account without a customer record."""
    now = now or datetime.now(UTC)
    ended(period, now)
    with writing(engine) as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(CLOSE_LOCK)))
        seller = current_seller(conn)
        if seller is None:
            raise LedgerError(NO_SELLER)
        differences, settled, changes = _differences(conn, period)
        known = customers_of(conn, {d.account_id for d in differences})
        if require_customers:
            _refuse_unknown(sorted({d.account_id for d in differences} - known.keys()))
        mark_closed(conn, period, now)
        _settle(conn, period, settled)
        if not differences:
            return []
        number = take_numbers(conn, DOCUMENT_NUMBER, len(differences))
        numbered = [_numbered(number + i, d, now, seller, known.get(d.account_id)) for i, d in enumerate(differences)]
        issued = _insert(conn, numbered, changes)
    return issued


def _refuse_unknown(missing: list[str]) -> None:
    if missing:
        named = ", ".join(missing[:NAMED]) + (", …" if len(missing) > NAMED else "")
        raise LedgerError(
            f"{len(missing)} account(s) to document have no customer record ({named}): import them "
            "(billing customers import FILE) or close without --require-customers; nothing issued"
        )


def pending(engine: sa.Engine, period: str, *, today: date | None = None) -> list[Difference]:
    """What closing ``period`` now would issue, in the order it would number them; nothing is written.
    :class:`LedgerError` for a malformed or future period."""
    period_days(period, today or datetime.now(UTC).date())
    with engine.connect() as conn:
        return _differences(conn, period)[0]


def periods(engine: sa.Engine, only: str | None = None) -> list[Period]:
    """Every period with billed rows (complete batches, not voided) or documents, newest first; or only the
    period ``only`` (none when it has neither)."""
    a = period_aggregates
    billed = (
        sa.select(a.c.period)
        .distinct()
        .select_from(a.join(batches, a.c.batch_id == batches.c.batch_id))
        .where(batches.c.state == BatchState.complete.value, batches.c.voided_at.is_(None))
    )
    issued = sa.select(schema.documents.c.period, sa.func.count()).group_by(schema.documents.c.period)
    if only is not None:
        period_days(only)
        billed = billed.where(a.c.period == only)
        issued = issued.where(schema.documents.c.period == only)
    found = []
    with engine.connect() as conn:
        counts = {row[0]: int(row[1]) for row in conn.execute(issued)}
        closed = set(conn.execute(sa.select(schema.closed_periods.c.period)).scalars())
        names = set(conn.execute(billed).scalars()) | counts.keys()
        names |= closed if only is None else closed & {only}
        for name in sorted(names, reverse=True):
            differences = _differences(conn, name)[0]
            found.append(Period(name, name in closed, counts.get(name, 0), tuple(differences)))
    return found


def _billed(conn: sa.Connection, period: str) -> dict[_Key, Sums]:
    """What the counted rows of the period add up to, per :data:`_Key`."""
    a = period_aggregates
    query = (
        sa.select(*(a.c[k] for k in _KEY), *(a.c[m] for m in MEASURES))
        .select_from(a.join(batches, a.c.batch_id == batches.c.batch_id))
        .where(batches.c.state == BatchState.complete.value, batches.c.voided_at.is_(None), a.c.period == period)
    )
    return _summed(conn.execute(query).mappings())


def _documented(conn: sa.Connection, period: str) -> tuple[dict[_Key, Sums], dict[tuple[str, str], list[int]]]:
    """What the period's documents and settled changes add up to, per :data:`_Key`; and per pair, the numbers of
    its documents of the period, ascending."""
    d, b, s = schema.documents, document_batches, settled_changes
    query = (
        sa.select(d.c.account_id, d.c.currency, *(b.c[k] for k in _KEY[2:]), *(b.c[m] for m in MEASURES))
        .select_from(b.join(d, b.c.number == d.c.number))
        .where(d.c.period == period)
    )
    settled = sa.select(*(s.c[k] for k in _KEY), *(s.c[m] for m in MEASURES))
    documented = _summed(
        [*conn.execute(query).mappings(), *conn.execute(settled.where(s.c.period == period)).mappings()]
    )
    numbers: dict[tuple[str, str], list[int]] = defaultdict(list)
    of_pairs = sa.select(d.c.account_id, d.c.currency, d.c.number).where(d.c.period == period).order_by(d.c.number)
    for row in conn.execute(of_pairs):
        numbers[row.account_id, row.currency].append(int(row.number))
    return documented, numbers


def _summed(rows: Iterable[sa.RowMapping]) -> dict[_Key, Sums]:
    found: dict[_Key, Sums] = defaultdict(Sums)
    for row in rows:
        key = _key_of(row)
        found[key] = found[key] + Sums.of(row)
    return found


def _key_of(row: sa.RowMapping) -> _Key:
    return cast("_Key", tuple(row[k] for k in _KEY))


def _diff(billed: Mapping[_Key, Sums], documented: Mapping[_Key, Sums], key: _Key) -> Sums:
    return billed.get(key, Sums()) - documented.get(key, Sums())


def _differences(conn: sa.Connection, period: str) -> tuple[list[Difference], dict[_Key, Sums], dict[_Key, Sums]]:
    """What a close of ``period`` would issue, in ``(account_id, currency)`` order: per pair, its lines (product
    and price book) whose change is not zero and the tax per rate of their changes (only the pairs with such a
    line, and not those whose every line is at net 0 and tax 0); the per-key changes those money-free pairs
    settle; and the per-key changes the documents sum."""
    billed = _billed(conn, period)
    documented, numbers = _documented(conn, period)
    changes = {key: change for key in billed.keys() | documented.keys() if (change := _diff(billed, documented, key))}
    prices = price_rows(conn, {key[3] for key in changes} - {""})
    per_line: dict[tuple[str, str], dict[tuple[str, str], list[_Key]]] = defaultdict(lambda: defaultdict(list))
    for key in sorted(changes):
        per_line[key[0], key[1]][key[2], key[3]].append(key)
    differences: list[Difference] = []
    settled: dict[_Key, Sums] = {}
    for (account_id, currency), of_lines in sorted(per_line.items()):
        lines, keys = _lines(of_lines, changes, prices)
        if lines and all(line.sums.money_free for line in lines):
            settled |= {key: changes[key] for key in keys}
        elif lines:
            earlier = tuple(numbers.get((account_id, currency), ()))
            total = sum(line.sums.total for line in lines)
            kind: Kind = "invoice" if not earlier else "credit_note" if total < 0 else "debit_note"
            taxes = taxes_of((key[5], key[4], changes[key]) for key in keys)
            differences.append(Difference(kind, period, account_id, currency, tuple(lines), earlier, taxes))
    return differences, settled, changes


def _lines(
    of_lines: Mapping[tuple[str, str], list[_Key]],
    changes: Mapping[_Key, Sums],
    prices: Mapping[tuple[str, str], PriceRow],
) -> tuple[list[Line], list[_Key]]:
    """A pair's lines whose change is not zero, by product and price book, and the keys of their changes."""
    lines, keys = [], []
    for (product, pricebook), of_line in sorted(of_lines.items()):
        sums = sum((changes[key] for key in of_line), Sums())
        if sums:
            batch_ids = tuple(sorted({key[6] for key in of_line}))
            lines.append(Line(product, sums, batch_ids, pricebook, prices.get((pricebook, product))))
            keys += of_line
    return lines, keys


def _settle(conn: sa.Connection, period: str, settled: Mapping[_Key, Sums]) -> None:
    """Add the changes settled without a document to table ``settled_changes``."""
    s = settled_changes
    of_period = conn.execute(sa.select(s).where(s.c.period == period)).mappings()
    before = {_key_of(r): Sums.of(r) for r in of_period}
    for key, change in sorted(settled.items()):
        names = dict(zip(_KEY, key, strict=True))
        if key in before:
            where = [s.c.period == period, *(s.c[name] == value for name, value in names.items())]
            conn.execute(sa.update(s).where(*where).values((before[key] + change).values()))
        else:
            conn.execute(sa.insert(s).values(period=period, **names, **change.values()))


def _tax_tables(conn: sa.Connection, batch_ids: set[str]) -> dict[str, str | None]:
    query = sa.select(batches.c.batch_id, batches.c.taxes_hash).where(batches.c.batch_id.in_(sorted(batch_ids)))
    return {r.batch_id: r.taxes_hash for r in conn.execute(query)}


def _numbered(
    number: int, difference: Difference, now: datetime, seller: Seller, customer: Customer | None
) -> Document:
    """A difference as a document numbered ``number``, not yet knowing its reference data (:func:`_insert`)."""
    d, sums = difference, difference.sums
    return Document(
        number,
        d.kind,
        d.period,
        d.account_id,
        d.currency,
        now,
        sums.net,
        sums.tax,
        sums.total,
        (),
        (),
        d.lines,
        display_number=display_number(seller.prefix, number),
        taxes=d.taxes,
        corrects=d.corrects,
        seller=seller.snapshot(),
        customer=None if customer is None else customer.snapshot(),
        due_date=now.astimezone(UTC).date() + timedelta(days=seller.payment_terms_days),
    )


def _insert(conn: sa.Connection, issued: list[Document], changes: Mapping[_Key, Sums]) -> list[Document]:
    """Write the documents, their lines and the per-key changes each line sums (one statement a table); the
    documents returned with the price books of their lines and the tax tables of their lines' batches."""
    tax_tables = _tax_tables(conn, {key[6] for key in changes})
    of_line: dict[_LineKey, list[_Key]] = defaultdict(list)
    for key in changes:
        of_line[key[:4]].append(key)
    heads, lines, per_batch, written = [], [], [], []
    for doc in issued:
        for line in doc.lines:
            lines.append({"number": doc.number, "product": line.product, "pricebook": line.pricebook})
            lines[-1] |= line.sums.values()
            per_batch += [
                {"number": doc.number, **dict(zip(_KEY[2:], key[2:], strict=True))} | changes[key].values()
                for key in of_line[doc.account_id, doc.currency, line.product, line.pricebook]
            ]
        used = {batch_id for line in doc.lines for batch_id in line.batches}
        doc = dataclasses.replace(
            doc,
            pricebooks=tuple(sorted({line.pricebook for line in doc.lines} - {""})),
            tax_tables=tuple(sorted({h for b in used if (h := tax_tables[b])})),
        )
        heads.append(_head(doc))
        written.append(doc)
    for table, rows in ((schema.documents, heads), (document_lines, lines), (document_batches, per_batch)):
        for chunk in chunks(rows, CHUNK):
            conn.execute(sa.insert(table), chunk)
    return written


def _head(doc: Document) -> dict[str, object]:
    """The document's row of table ``documents``."""
    same = ("number", "kind", "period", "account_id", "currency", "issued_at", "net", "tax", "total")
    return {name: getattr(doc, name) for name in same} | {
        "pricebooks": " ".join(doc.pricebooks),
        "tax_tables": " ".join(doc.tax_tables),
        "display_number": doc.display_number,
        "corrects": " ".join(str(n) for n in doc.corrects),
        "due_date": doc.due_date,
        "seller": None if doc.seller is None else json.dumps(doc.seller, sort_keys=True),
        "customer": None if doc.customer is None else json.dumps(doc.customer, sort_keys=True),
    }
