"""What a batch must bill, computed independently of the pipeline for ``billing soak``: the file read
with ``csv``/``json``/``pyarrow`` alone, each row checked and rated one at a time with ``re``,
``datetime`` and ``decimal`` (ROUND_HALF_UP) from the rules in docs/billing-rules.md, sharing no code
with ``shared.rules``. It gives the accepted and rejected counts and the aggregates per account,
product, billing day and currency, to compare with what the store holds."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Context, Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

DIGITS = {"USD": 2, "EUR": 2, "GBP": 2, "CHF": 2, "JPY": 0, "KRW": 0, "BHD": 3, "KWD": 3}
FIELDS = ("transaction_id", "account_id", "timestamp", "product", "quantity", "region")
EXACT = Context(prec=100)
ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
TIMESTAMP = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?(Z|([+-])([0-9]{2}):([0-9]{2}))?"
)
QUANTITY = re.compile(r"[+-]?[0-9]+(\.([0-9]+))?")
PEAK_FROM, PEAK_TO = Decimal(8 * 3600), Decimal("71999.999999")

#: (account_id, product, billing_day, currency) -> [transactions, quantity, net, tax, total]
Aggregates = dict[tuple[str, str, str, str], list[Any]]


@dataclass
class Expected:
    accepted: int = 0
    rejected: int = 0
    aggregates: Aggregates = field(default_factory=dict)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The file's rows as field -> text (a JSON number kept as its text)."""
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8-sig") as f:
            return list(csv.DictReader(f))
    if path.suffix == ".jsonl":
        return [json.loads(line, parse_float=str, parse_int=str) for line in path.read_text().splitlines() if line]
    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows


def expected(path: Path, price_book: str, tax_table: str) -> Expected:
    """What the batch in ``path`` must bill with this price book and tax table (CSV texts)."""
    prices = {
        r["product"].strip(): (
            r["currency"].strip(),
            Decimal(r["unit_price"].strip()),
            Decimal(r["offpeak_unit_price"].strip() or r["unit_price"].strip()),
            Decimal(r["minimum_charge"].strip()) if r["minimum_charge"].strip() else None,
        )
        for r in csv.DictReader(io.StringIO(price_book))
    }
    rates = {r["region"].strip(): Decimal(r["tax_rate"].strip()) for r in csv.DictReader(io.StringIO(tax_table))}
    out = Expected()
    seen: set[str] = set()
    for raw in read_rows(path):
        row = _check({name: str(raw.get(name) or "").strip() for name in FIELDS}, prices, rates)
        if row is None or row[0] in seen:
            out.rejected += 1
            continue
        seen.add(row[0])
        out.accepted += 1
        _, account, (utc, fraction), product, quantity, region = row
        currency, peak_price, offpeak_price, minimum = prices[product]
        time_of_day = Decimal(utc.hour * 3600 + utc.minute * 60 + utc.second) + fraction
        peak = utc.weekday() < 5 and PEAK_FROM <= time_of_day <= PEAK_TO
        scale = Decimal(10) ** DIGITS[currency]
        net = _half_up(EXACT.multiply(EXACT.multiply(quantity, peak_price if peak else offpeak_price), scale))
        if minimum is not None and quantity > 0:
            net = max(net, _half_up(EXACT.multiply(minimum, scale)))
        tax = _half_up(EXACT.multiply(Decimal(net), rates[region]))
        sums = out.aggregates.setdefault((account, product, utc.date().isoformat(), currency), [0, Decimal(0), 0, 0, 0])
        for index, value in enumerate((1, quantity, net, tax, net + tax)):
            sums[index] += value
    return out


def _check(
    f: dict[str, str], prices: dict[str, Any], rates: dict[str, Decimal]
) -> tuple[str, str, tuple[datetime, Decimal], str, Decimal, str] | None:
    """The row's parsed fields, or None when it breaks a rule (repeated ids aside)."""
    if any(not f[name] for name in FIELDS[:5]):
        return None
    if not ID.fullmatch(f["transaction_id"]) or not ID.fullmatch(f["account_id"]):
        return None
    instant = _instant(f["timestamp"])
    if instant is None or f["product"] not in prices:
        return None
    m = QUANTITY.fullmatch(f["quantity"])
    if m is None or (m.group(2) is not None and len(m.group(2)) > 6):
        return None
    quantity = Decimal(f["quantity"]) + 0
    if quantity < 0 or quantity > 1_000_000_000:
        return None
    region = f["region"] or "*"
    if region not in rates:
        return None
    return f["transaction_id"], f["account_id"], instant, f["product"], quantity, region


def _instant(text: str) -> tuple[datetime, Decimal] | None:
    """The UTC second and the fraction of a second, or None when the timestamp is invalid or has no offset."""
    m = TIMESTAMP.fullmatch(text)
    if m is None or m.group(8) is None:
        return None
    try:
        year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
        local = datetime(year, month, day, hour, minute, second)
    except ValueError:
        return None
    offset = timedelta(0)
    if m.group(8) != "Z":
        hours, minutes = int(m.group(10)), int(m.group(11))
        if hours > 23 or minutes > 59:
            return None
        offset = timedelta(hours=hours, minutes=minutes) * (-1 if m.group(9) == "-" else 1)
    try:
        utc = local - offset
    except OverflowError:
        return None
    return utc, Decimal("0." + m.group(7)) if m.group(7) else Decimal(0)


def _half_up(value: Decimal) -> int:
    return int(value.quantize(Decimal(1), rounding=ROUND_HALF_UP, context=EXACT))
