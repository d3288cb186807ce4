"""What the reference model's documents must say beyond its own keys, computed from its rated rows: the tax per
rate of each document (``taxes``) and the prices of each line's price book (``unit``, ``unit_price``,
``offpeak_unit_price``), from the price books' CSV text as a test wrote it (read with ``csv`` only)."""

from __future__ import annotations

import csv
import hashlib
import io
from collections import defaultdict
from decimal import Decimal
from typing import Any

from benchmarks import reference_model as model

#: (account, currency, rate, region, product, price book, batch)
Key = tuple[str, str, str, str, str, str, str]


class TaxesByRate:
    """The ``taxes`` of the documents the model's closes issue: each close documents, for each pair it issues a
    document for, what its counted rows changed per rate since the last close; the entries of one rate name the
    regions whose rows changed, sorted by the rate's numeric value."""

    def __init__(self, ledger: model.Ledger) -> None:
        self.ledger = ledger
        self.documented: dict[tuple[str, Key], tuple[int, int]] = {}

    def billed(self, period: str) -> dict[Key, tuple[int, int]]:
        """Net and tax of the period's counted rows (batches not voided) per :data:`Key`."""
        sums: dict[Key, list[int]] = defaultdict(lambda: [0, 0])
        for batch_id, rated in self.ledger.rated.items():
            if batch_id in self.ledger.voided:
                continue
            for row, r in rated:
                if r.billing_day[:7] == period:
                    key = (row.account_id, r.currency, r.tax_rate, r.region, row.product, r.pricebook, batch_id)
                    sums[key][0] += r.net
                    sums[key][1] += r.tax
        return {k: (v[0], v[1]) for k, v in sums.items()}

    def close(self, period: str, issued: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """The ``taxes`` of each of ``issued`` (the model's documents of this close of ``period``, in order)."""
        now = self.billed(period)
        before = {k: v for (p, k), v in self.documented.items() if p == period}
        out = []
        for doc in issued:
            pair = (doc["account_id"], doc["currency"])
            by_rate: dict[str, list[Any]] = defaultdict(lambda: [set(), 0, 0])
            for key in {k for k in now.keys() | before.keys() if k[:2] == pair}:
                net = now.get(key, (0, 0))[0] - before.get(key, (0, 0))[0]
                tax = now.get(key, (0, 0))[1] - before.get(key, (0, 0))[1]
                if net or tax:
                    entry = by_rate[key[2]]
                    entry[0].add(key[3])
                    entry[1] += net
                    entry[2] += tax
            out.append(
                [
                    {"rate": rate, "regions": sorted(regions), "net": net, "tax": tax}
                    for rate, (regions, net, tax) in sorted(by_rate.items(), key=lambda item: Decimal(item[0]))
                ]
            )
        self.documented = {k: v for k, v in self.documented.items() if k[0] != period}
        self.documented.update({(period, k): v for k, v in now.items()})
        return out


def line_prices(books: list[str]) -> dict[tuple[str, str], dict[str, str]]:
    """(price book hash, product) -> the ``unit``, ``unit_price`` and ``offpeak_unit_price`` a line of that
    product and price book shows, from each price book's CSV text (``unit`` "unit" where the book has no such
    column; an empty off-peak price is the unit price)."""
    prices = {}
    for text in books:
        digest = hashlib.sha256(text.encode()).hexdigest()
        for row in csv.DictReader(io.StringIO(text)):
            unit_price = row["unit_price"].strip()
            prices[digest, row["product"].strip()] = {
                "unit": (row.get("unit") or "unit").strip(),
                "unit_price": unit_price,
                "offpeak_unit_price": row["offpeak_unit_price"].strip() or unit_price,
            }
    return prices
