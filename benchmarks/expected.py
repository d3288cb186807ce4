"""What a batch must bill, computed independently of the pipeline for ``billing soak``: the file read
with ``csv``/``json``/``pyarrow`` alone, each row checked and rated one at a time by the reference model
(:mod:`benchmarks.reference_model`, which shares no code with ``shared.rules``). It gives the accepted
and rejected counts and the aggregates per account, product, billing day and currency, to compare with
what the store holds."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from .reference_model import Row, check_batch, rate_row, read_prices, read_rates

#: (account_id, product, billing_day, currency) -> [transactions, quantity, net, tax, total]
Aggregates = dict[tuple[str, str, str, str], list[Any]]


@dataclass
class Expected:
    accepted: int = 0
    rejected: int = 0
    aggregates: Aggregates = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)  # the transaction ids the batch counts


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The file's rows as field -> text (a JSON number kept as its text)."""
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8-sig") as f:
            return list(csv.DictReader(f))
    if path.suffix == ".jsonl":
        return [json.loads(line, parse_float=str, parse_int=str) for line in path.read_text().splitlines() if line]
    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows


def expected(path: Path, price_book: str, tax_table: str, taken: set[str] | frozenset[str] = frozenset()) -> Expected:
    """What the batch in ``path`` must bill with this price book and tax table (CSV texts), ``taken`` the ids
    earlier batches of the ledger counted."""
    prices, rates = read_prices(price_book), read_rates(tax_table)
    raw = [{name: None if value is None else str(value) for name, value in row.items()} for row in read_rows(path)]
    out = Expected()
    for row in check_batch(raw, prices, rates, taken):
        if not isinstance(row, Row):
            out.rejected += 1
            continue
        out.accepted += 1
        out.ids.add(row.transaction_id)
        rated = rate_row(row, prices, rates)
        key = (row.account_id, row.product, rated.billing_day, rated.currency)
        sums = out.aggregates.setdefault(key, [0, Decimal(0), 0, 0, 0])
        for index, value in enumerate((1, row.quantity, rated.net, rated.tax, rated.total)):
            sums[index] += value
    return out
