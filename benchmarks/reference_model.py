"""An independent, deliberately simple model of validation and rating: one row at a time,
``re``, ``datetime`` and ``decimal`` (ROUND_HALF_UP) only. Tests compare the vectorised code to it.

Reference data is dated: a :class:`Version` is a price book and tax table in force from a UTC date on, and a row is
checked and rated with the version in force on its UTC date (none before the first: ``no_reference_data``).

It reads the reference CSVs itself (assuming they are valid) and shares no code with ``shared``; the tests
and ``billing soak`` (:mod:`benchmarks.expected`) check the pipeline against it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_UP, Context, Decimal
from typing import Any

import pyarrow as pa

DIGITS = {"USD": 2, "EUR": 2, "GBP": 2, "CHF": 2, "JPY": 0, "KRW": 0, "BHD": 3, "KWD": 3}
FIELDS = ("transaction_id", "account_id", "timestamp", "product", "quantity", "region")
EXACT = Context(prec=100)

ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
TIMESTAMP = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?(Z|([+-])([0-9]{2}):([0-9]{2}))?"
)
QUANTITY = re.compile(r"[+-]?[0-9]+(\.([0-9]+))?")
PEAK_FROM, PEAK_TO = Decimal(8 * 3600), Decimal("71999.999999")


@dataclass(frozen=True)
class Price:
    currency: str
    unit: Decimal
    offpeak: Decimal
    minimum: Decimal | None
    #: As the price book writes them: the unit's name, the unit and off-peak prices (the unit price's where empty).
    texts: tuple[str, str, str] = ("unit", "", "")


@dataclass(frozen=True)
class Instant:
    """A UTC instant: the whole second as a datetime plus the exact fraction of a second."""

    second: datetime
    fraction: Decimal


@dataclass(frozen=True)
class Row:
    """A row that passed every rule but the duplicate check."""

    transaction_id: str
    account_id: str
    instant: Instant
    product: str
    quantity: Decimal
    region: str


@dataclass(frozen=True)
class Rated:
    net: int
    tax: int
    total: int
    currency: str
    billing_day: str
    region: str = "*"
    tax_rate: str = ""  # the rate as normalised decimal text
    pricebook: str = ""  # the content hash of the price book that rated it ("" where not known)


@dataclass(frozen=True)
class Version:
    """A price book and tax table in force from ``effective_from`` (a UTC date; None: every date) on."""

    effective_from: date | None
    prices: dict[str, Price]
    rates: dict[str, Decimal]
    pricebook: str = ""  # the price book's content hash


def read_version(effective_from: date | None, prices_csv: str, rates_csv: str) -> Version:
    """A version from the price book's and tax table's CSV text (the hash is that of the UTF-8 text)."""
    digest = hashlib.sha256(prices_csv.encode()).hexdigest()
    return Version(effective_from, read_prices(prices_csv), read_rates(rates_csv), digest)


def in_force(versions: list[Version], day: date) -> Version | None:
    """The version with the latest ``effective_from`` on or before ``day``; None before the first."""
    found = None
    for version in sorted(versions, key=lambda v: v.effective_from or date.min):
        if version.effective_from is None or version.effective_from <= day:
            found = version
    return found


def rate_text(rate: Decimal) -> str:
    """A tax rate as normalised decimal text: ``0.20`` is ``0.2``, ``0.0`` is ``0``."""
    return "0" if rate == 0 else format(rate.normalize(), "f")


def read_prices(csv_text: str) -> dict[str, Price]:
    prices = {}
    for r in csv.DictReader(io.StringIO(csv_text)):
        unit = Decimal(r["unit_price"].strip())
        offpeak = r["offpeak_unit_price"].strip()
        minimum = r["minimum_charge"].strip()
        texts = ((r.get("unit") or "").strip() or "unit", r["unit_price"].strip(), offpeak or r["unit_price"].strip())
        prices[r["product"].strip()] = Price(
            r["currency"].strip(),
            unit,
            Decimal(offpeak) if offpeak else unit,
            Decimal(minimum) if minimum else None,
            texts,
        )
    return prices


def read_rates(csv_text: str) -> dict[str, Decimal]:
    return {r["region"].strip(): Decimal(r["tax_rate"].strip()) for r in csv.DictReader(io.StringIO(csv_text))}


def parse_timestamp(text: str) -> Instant | str:
    """The instant, or the reason code."""
    m = TIMESTAMP.fullmatch(text)
    if m is None:
        return "invalid_timestamp"
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    try:
        local = datetime(year, month, day, hour, minute, second)
    except ValueError:
        return "invalid_timestamp"
    if m.group(8) is None:
        return "timestamp_without_timezone"
    offset = timedelta(0)
    if m.group(8) != "Z":
        hours, minutes = int(m.group(10)), int(m.group(11))
        if hours > 23 or minutes > 59:
            return "invalid_timestamp"
        offset = timedelta(hours=hours, minutes=minutes) * (-1 if m.group(9) == "-" else 1)
    try:
        utc = local - offset
    except OverflowError:
        return "invalid_timestamp"
    return Instant(utc, Decimal("0." + m.group(7)) if m.group(7) else Decimal(0))


def quantity_reason(text: str) -> str | None:
    m = QUANTITY.fullmatch(text)
    if m is None:
        return "invalid_quantity"
    value = Decimal(text)
    if value < 0:
        return "negative_quantity"
    if value > 1_000_000_000:
        return "quantity_out_of_range"
    if m.group(2) is not None and len(m.group(2)) > 6:
        return "too_many_decimals"
    return None


def check_row(raw: dict[str, str | None], prices: dict[str, Price], rates: dict[str, Decimal]) -> Row | str:
    """The row, or the reason code of the first rule it breaks (duplicates aside)."""
    return check_dated(raw, [Version(None, prices, rates)])


def check_dated(raw: dict[str, str | None], versions: list[Version]) -> Row | str:
    """The row, or the reason code of the first rule it breaks (duplicates aside), its product and region checked
    against the version in force on its UTC date."""
    f = {name: (raw.get(name) or "").strip() for name in FIELDS}
    if any(not f[name] for name in FIELDS[:5]):
        return "missing_field"
    if not ID.fullmatch(f["transaction_id"]):
        return "invalid_transaction_id"
    if not ID.fullmatch(f["account_id"]):
        return "invalid_account_id"
    instant = parse_timestamp(f["timestamp"])
    if isinstance(instant, str):
        return instant
    version = in_force(versions, instant.second.date())
    if version is not None and f["product"] not in version.prices:
        return "unknown_product"
    reason = quantity_reason(f["quantity"])
    if reason:
        return reason
    region = f["region"] or "*"
    if version is not None and region not in version.rates:
        return "unknown_region"
    if version is None:
        return "no_reference_data"
    return Row(f["transaction_id"], f["account_id"], instant, f["product"], Decimal(f["quantity"]) + 0, region)


def check_batch(
    rows: list[dict[str, str | None]],
    prices: dict[str, Price],
    rates: dict[str, Decimal],
    taken: set[str] | frozenset[str] = frozenset(),
) -> list[Row | str]:
    """Every row of a batch in order, with ``duplicate_transaction_id`` after the first valid one, and for every
    valid row whose id is ``taken`` (counted in an earlier batch of the ledger)."""
    return check_batch_dated(rows, [Version(None, prices, rates)], taken)


def check_batch_dated(
    rows: list[dict[str, str | None]], versions: list[Version], taken: set[str] | frozenset[str] = frozenset()
) -> list[Row | str]:
    """:func:`check_batch` with dated reference data."""
    seen: set[str] = set(taken)
    out: list[Row | str] = []
    for raw in rows:
        result = check_dated(raw, versions)
        if isinstance(result, Row):
            if result.transaction_id in seen:
                result = "duplicate_transaction_id"
            else:
                seen.add(result.transaction_id)
        out.append(result)
    return out


def half_up(value: Decimal) -> int:
    return int(value.quantize(Decimal(1), rounding=ROUND_HALF_UP, context=EXACT))


def is_peak(instant: Instant) -> bool:
    t = instant.second
    time_of_day = Decimal(t.hour * 3600 + t.minute * 60 + t.second) + instant.fraction
    return t.weekday() < 5 and PEAK_FROM <= time_of_day <= PEAK_TO


def rate_row(row: Row, prices: dict[str, Price], rates: dict[str, Decimal]) -> Rated:
    price = prices[row.product]
    scale = Decimal(10) ** DIGITS[price.currency]
    unit = price.unit if is_peak(row.instant) else price.offpeak
    net = half_up(EXACT.multiply(EXACT.multiply(row.quantity, unit), scale))
    if price.minimum is not None and row.quantity > 0:
        net = max(net, half_up(EXACT.multiply(price.minimum, scale)))
    tax = half_up(EXACT.multiply(Decimal(net), rates[row.region]))
    billing_day: date = row.instant.second.date()
    return Rated(net, tax, net + tax, price.currency, billing_day.isoformat(), row.region, rate_text(rates[row.region]))


def rate_dated(row: Row, versions: list[Version]) -> Rated:
    """A checked row rated with the version in force on its UTC date."""
    version = in_force(versions, row.instant.second.date())
    assert version is not None, "a checked row has a version"
    rated = rate_row(row, version.prices, version.rates)
    return Rated(**{**rated.__dict__, "pricebook": version.pricebook})


def raw_chunk(rows: list[dict[str, str | None]], first_row: int = 1) -> pa.Table:
    """A chunk as the batch readers hand it to validation: raw string fields, ``row`` and ``raw``."""
    columns = {name: pa.array([r.get(name) for r in rows], pa.string()) for name in FIELDS}
    columns["row"] = pa.array(range(first_row, first_row + len(rows)), pa.int64())
    columns["raw"] = pa.array([json.dumps(r, ensure_ascii=False) for r in rows], pa.string())
    return pa.table(columns)


# -- Part 2: periods closed into documents -------------------------------------------------------------------------

MEASURES = ("transactions", "quantity", "net", "tax", "total")
#: The keys of a document (or pending difference) the model computes; :func:`as_model` keeps only those.
DOCUMENT_KEYS = (
    "number",
    "kind",
    "period",
    "account_id",
    "currency",
    "net",
    "tax",
    "total",
    "corrects",
    "lines",
    "taxes",
)
#: The keys of a line the model computes; with ``priced``, :data:`PRICE_KEYS` too.
LINE_KEYS = ("product", "transactions", "quantity", "net", "tax", "total", "batches")
PRICE_KEYS = ("pricebook", "unit", "unit_price", "offpeak_unit_price")


def as_model(docs: list[dict[str, Any]], *, numbered: bool = True, priced: bool = False) -> list[dict[str, Any]]:
    """Documents' JSON as the model has them: only :data:`DOCUMENT_KEYS` (no ``number`` unless ``numbered``:
    pending differences have none), their lines only :data:`LINE_KEYS` (and :data:`PRICE_KEYS` where ``priced``: a
    model that knows the price books' hashes, :attr:`Ledger.priced`)."""
    keys = [k for k in DOCUMENT_KEYS if numbered or k != "number"]
    line_keys = LINE_KEYS + PRICE_KEYS if priced else LINE_KEYS
    return [
        {k: [{n: line[n] for n in line_keys} for line in d[k]] if k == "lines" else d[k] for k in keys if k in d}
        for d in docs
    ]


def _taxes(changes: list[tuple[str, str, list[Decimal]]]) -> list[dict[str, Any]]:
    """The tax per rate of a document's changes ``(rate, region, measures)``: rates numerically, regions sorted."""
    by_rate: dict[str, tuple[set[str], list[int]]] = {}
    for rate, region, change in changes:
        regions, sums = by_rate.setdefault(rate, (set(), [0, 0]))
        regions.add(region)
        sums[0] += int(change[2])
        sums[1] += int(change[3])
    return [
        {"rate": rate, "regions": sorted(by_rate[rate][0]), "net": by_rate[rate][1][0], "tax": by_rate[rate][1][1]}
        for rate in sorted(by_rate, key=Decimal)
    ]


@dataclass
class Ledger:
    """Documents as a close must issue them, from the batches' raw rows, one row at a time (each transaction id
    counted once across the batches, in the order they are given): what the counted rows of a period add up to
    (complete batches, not voided), less what its documents already say, per account, currency, product, price
    book, tax region, tax rate and batch; a line per product and price book, a tax entry per rate; numbered on from
    1 in (account, currency) order within a close. A batch's counted rows of a period closed before it completed are
    late (``late``: batch -> period -> rows)."""

    prices: dict[str, Price]
    rates: dict[str, Decimal]
    #: Dated reference data; None: ``prices`` and ``rates`` on every date.
    versions: list[Version] | None = None

    def __post_init__(self) -> None:
        if self.versions is None:
            self.versions = [Version(None, self.prices, self.rates)]
        self.rated: dict[str, list[tuple[Row, Rated]]] = {}
        self.voided: set[str] = set()
        self.closed: set[str] = set()
        self.late: dict[str, dict[str, int]] = {}
        self.documents: list[dict[str, object]] = []
        #: (period, account, currency, product, pricebook, region, rate, batch) -> measures documented so far
        self.documented: dict[tuple[str, ...], list[Decimal]] = {}

    @property
    def priced(self) -> bool:
        """Whether the model knows its price books' hashes (versions read with :func:`read_version`): then its
        lines name their price book and its prices."""
        assert self.versions is not None
        return all(version.pricebook for version in self.versions)

    def batch(self, batch_id: str, rows: list[dict[str, str | None]]) -> list[Row | str]:
        """A batch completed with these rows, after every batch given before (the order of sequence numbers):
        an id counted in one of them, not voided, is a duplicate here. Each row's fate is returned."""
        assert self.versions is not None
        checked = check_batch_dated(rows, self.versions, self.counted_ids())
        counted = [r for r in checked if isinstance(r, Row)]
        self.rated[batch_id] = [(row, rate_dated(row, self.versions)) for row in counted]
        late: dict[str, int] = {}
        for _, rated in self.rated[batch_id]:
            if rated.billing_day[:7] in self.closed:
                late[rated.billing_day[:7]] = late.get(rated.billing_day[:7], 0) + 1
        self.late[batch_id] = late
        return checked

    def counted_ids(self) -> set[str]:
        """The transaction ids counted in the ledger: those of batches not voided (a void releases them)."""
        return {row.transaction_id for b, rated in self.rated.items() if b not in self.voided for row, _ in rated}

    def void(self, batch_id: str) -> None:
        self.voided.add(batch_id)

    def close(self, period: str) -> list[dict[str, object]]:
        """The documents the close of ``period`` issues (JSON shape, only the keys of :data:`DOCUMENT_KEYS`): an
        ``invoice`` first for a pair, then a ``credit_note`` (total below zero) or ``debit_note`` that ``corrects``
        the pair's earlier documents; a pair whose every line is at net 0 and tax 0 gets none."""
        self.closed.add(period)
        changes = self._changes(period)
        lines: dict[tuple[str, str], dict[tuple[str, str], list[Decimal]]] = {}
        for (_, account, currency, product, pricebook, *_), change in changes.items():
            line = lines.setdefault((account, currency), {}).setdefault((product, pricebook), [Decimal(0)] * 5)
            for i, value in enumerate(change):
                line[i] += value
        issued: list[dict[str, object]] = []
        for account, currency in sorted(lines):
            of_lines = {k: s for k, s in lines[account, currency].items() if any(s)}
            keys = [k for k in changes if k[1:3] == (account, currency) and (k[3], k[4]) in of_lines]
            for key in keys:
                documented = self.documented.setdefault(key, [Decimal(0)] * 5)
                for i, value in enumerate(changes[key]):
                    documented[i] += value
            doc_lines = [
                self._line(product, pricebook, of_lines[product, pricebook], keys)
                for product, pricebook in sorted(of_lines)
            ]
            if all(line["net"] == 0 and line["tax"] == 0 for line in doc_lines):
                continue  # no zero documents: the change is settled (documented above) all the same
            earlier = [
                d["number"]
                for d in self.documents
                if (d["period"], d["account_id"], d["currency"]) == (period, account, currency)
            ]
            total = sum(line["total"] for line in doc_lines)
            issued.append(
                {
                    "number": len(self.documents) + len(issued) + 1,
                    "kind": "invoice" if not earlier else "credit_note" if total < 0 else "debit_note",
                    "period": period,
                    "account_id": account,
                    "currency": currency,
                    **{m: sum(line[m] for line in doc_lines) for m in ("net", "tax", "total")},
                    "corrects": earlier,
                    "lines": doc_lines,
                    "taxes": _taxes([(k[6], k[5], changes[k]) for k in keys]),
                }
            )
        self.documents.extend(issued)
        return issued

    def _changes(self, period: str) -> dict[tuple[str, ...], list[Decimal]]:
        """What the period's counted rows add up to, less what is documented, per key (not all zero)."""
        billed: dict[tuple[str, ...], list[Decimal]] = {}
        for batch_id, rated in self.rated.items():
            if batch_id in self.voided:
                continue
            for row, r in rated:
                if r.billing_day[:7] != period:
                    continue
                of_row = (period, row.account_id, r.currency, row.product, r.pricebook, r.region, r.tax_rate, batch_id)
                sums = billed.setdefault(of_row, [Decimal(0)] * 5)
                for i, value in enumerate((Decimal(1), row.quantity, Decimal(r.net), Decimal(r.tax), Decimal(r.total))):
                    sums[i] += value
        changes: dict[tuple[str, ...], list[Decimal]] = {}
        for key in billed.keys() | {k for k in self.documented if k[0] == period}:
            now, before = billed.get(key, [Decimal(0)] * 5), self.documented.get(key, [Decimal(0)] * 5)
            change = [a - b for a, b in zip(now, before, strict=True)]
            if any(change):
                changes[key] = change
        return changes

    def _line(self, product: str, pricebook: str, s: list[Decimal], keys: list[tuple[str, ...]]) -> dict[str, Any]:
        """A document's line of ``product`` rated by ``pricebook``, with that price book's prices of it where the model
        knows them (:attr:`priced`)."""
        assert self.versions is not None
        books = {version.pricebook: version.prices for version in self.versions}
        price = books.get(pricebook, {}).get(product) if pricebook else None
        texts = price.texts if price else (None, None, None)
        line = {
            "product": product,
            "transactions": int(s[0]),
            "quantity": "0" if s[1] == 0 else format(s[1].normalize(), "f"),
            **{m: int(s[i]) for i, m in enumerate(MEASURES) if i >= 2},
            "batches": sorted({k[7] for k in keys if (k[3], k[4]) == (product, pricebook)}),
        }
        if not self.priced:  # lines as as_model keeps them without priced
            return line
        return line | {"pricebook": pricebook or None} | dict(zip(PRICE_KEYS[1:], texts, strict=True))
