"""What a document sums: signed measures (:class:`Sums`), its lines per product and price book with the price book's
unit prices (:class:`Line`), and its tax per rate (:class:`Tax`, :func:`taxes_of`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, localcontext
from typing import Any

import sqlalchemy as sa

from ..pricebooks import PriceRow
from ..schema import EXACT

MEASURES = ("transactions", "quantity", "net", "tax", "total")


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

    @property
    def money_free(self) -> bool:
        """Net 0 and tax 0 (whatever the transactions and quantity)."""
        return self.net == 0 and self.tax == 0

    @classmethod
    def of(cls, row: sa.RowMapping) -> Sums:
        return cls(int(row["transactions"]), Decimal(row["quantity"]), *(int(row[m]) for m in ("net", "tax", "total")))

    def values(self) -> dict[str, Any]:
        return {m: getattr(self, m) for m in MEASURES}


@dataclass(frozen=True)
class Line:
    """A document's line: the change of one product's rows rated by one price book (``pricebook`` ``''`` for a
    line from before lines were split by price book), the batches whose rows changed it, and that price book's row
    of the product (None where the price book's rows are not recorded)."""

    product: str
    sums: Sums
    batches: tuple[str, ...]
    pricebook: str = ""
    price: PriceRow | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """``product``, ``transactions``, ``quantity`` (decimal text), ``net``, ``tax``, ``total``, ``batches``,
        ``pricebook`` and the price book's ``unit``, ``unit_price`` and ``offpeak_unit_price`` (decimal text; null
        where not known)."""
        price = self.price
        return {
            "product": self.product,
            "transactions": self.sums.transactions,
            "quantity": quantity_text(self.sums.quantity),
            "net": self.sums.net,
            "tax": self.sums.tax,
            "total": self.sums.total,
            "batches": list(self.batches),
            "pricebook": self.pricebook or None,
            "unit": None if price is None else price.unit,
            "unit_price": None if price is None else price.unit_price,
            "offpeak_unit_price": None if price is None else price.offpeak_unit_price,
        }


@dataclass(frozen=True)
class Tax:
    """A document's changes at one tax rate (``rate`` None: changes from before rates were recorded): the regions
    taxed at it, the taxable net and the tax."""

    rate: str | None
    regions: tuple[str, ...]
    net: int
    tax: int

    def to_json_dict(self) -> dict[str, Any]:
        return {"rate": self.rate, "regions": list(self.regions), "net": self.net, "tax": self.tax}


def taxes_of(changes: Iterable[tuple[str, str, Sums]]) -> tuple[Tax, ...]:
    """The tax per rate of changes given as ``(tax_rate, region, sums)`` (``''``: not recorded): one entry per
    distinct rate, its regions sorted (``''`` left out), by rate numerically, the unrecorded rate last."""
    regions: dict[str, set[str]] = {}
    sums: dict[str, Sums] = {}
    for rate, region, change in changes:
        regions.setdefault(rate, set()).add(region)
        sums[rate] = sums.get(rate, Sums()) + change
    return tuple(
        Tax(rate or None, tuple(sorted(regions[rate] - {""})), sums[rate].net, sums[rate].tax)
        for rate in sorted(sums, key=lambda r: (r == "", Decimal(r or 0)))
    )


def quantity_text(value: Decimal) -> str:
    """A plain decimal text without exponent or trailing zeros (``-12.5``, ``3``, ``0``)."""
    if value == 0:
        return "0"
    with localcontext(EXACT):
        return format(value.normalize(), "f")
