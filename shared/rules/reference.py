"""Reference data: the price book and the tax table, validated when loaded.

Every amount is kept as an exact integer number of micro-units (10^-6): ``1.5`` is ``1_500_000``.
Both tables are immutable values identified by the SHA-256 of their CSV bytes; the aligned numpy
arrays they carry make vectorised validation and rating a simple index lookup.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

import numpy as np
import pyarrow as pa

from ..errors import ReferenceDataError

#: ISO 4217 minor digits of the currencies the price book may use.
CURRENCY_DIGITS: dict[str, int] = {"USD": 2, "EUR": 2, "GBP": 2, "CHF": 2, "JPY": 0, "KRW": 0, "BHD": 3, "KWD": 3}

#: The tax table's default region, used when a transaction has no region.
DEFAULT_REGION = "*"

MICRO = 1_000_000
MAX_PRICE_MICRO = 1_000_000 * MICRO
MAX_RATE_MICRO = MICRO
#: The longest region code a tax table may list (what the store keeps of it per aggregate).
MAX_REGION = 64

_DECIMAL = re.compile(r"([+-]?)([0-9]+)(?:\.([0-9]+))?")
_PRICE_COLUMNS = ("product", "currency", "unit_price", "offpeak_unit_price", "minimum_charge")
#: The price book's optional column: what a product's quantity counts (text of 1 to 32 characters).
_UNIT_COLUMN = "unit"
DEFAULT_UNIT = "unit"
_MAX_UNIT = 32
_TAX_COLUMNS = ("region", "tax_rate")


def money(minor: int, currency: str) -> str:
    """Minor units in the currency's own units (its ISO 4217 exponent) with thousands separators and its code,
    exactly (integers only): ``123456, "USD"`` → ``1,234.56 USD``; ``1234, "JPY"`` → ``1,234 JPY``."""
    digits = CURRENCY_DIGITS[currency]
    sign = "-" if minor < 0 else ""
    whole, fraction = divmod(abs(minor), 10**digits)
    return f"{sign}{whole:,}" + (f".{fraction:0{digits}d}" if digits else "") + f" {currency}"


def percent(rate: str | None) -> str:
    """A tax rate's decimal text as a percentage (``0.2`` -> ``20 %``, ``0.0725`` -> ``7.25 %``); None (a rate not
    recorded) -> ``not recorded``."""
    if rate is None:
        return "not recorded"
    try:
        value = (Decimal(rate) * 100).normalize()
    except InvalidOperation:
        return rate
    return f"{value:f} %"


def decimal_text(micro: int) -> str:
    """Micro-units as a normalised decimal text: no trailing zeros, no point for a whole number
    (``200_000`` → ``0.2``, ``0`` → ``0``, ``1_000_000`` → ``1``)."""
    whole, fraction = divmod(micro, MICRO)
    return f"{whole}.{fraction:06d}".rstrip("0") if fraction else str(whole)


@dataclass(frozen=True)
class ProductPrice:
    """One product's prices, in micro-units of ``currency``, and as the price book writes them (``texts``: unit
    price, off-peak unit price (the unit price's where empty), minimum charge (empty for none))."""

    currency: str
    digits: int
    unit_price: int
    offpeak_price: int
    minimum_charge: int | None
    unit: str = DEFAULT_UNIT
    texts: tuple[str, str, str] = ("", "", "")


@dataclass(frozen=True)
class PriceBook:
    """A validated price book; ``products[i]`` has price ``prices[i]``."""

    content_hash: str
    products: tuple[str, ...]
    prices: tuple[ProductPrice, ...]
    #: Derived columns aligned with ``products`` (for vectorised lookups).
    currency: np.ndarray = field(init=False, repr=False, compare=False)  # object (str)
    digits: np.ndarray = field(init=False, repr=False, compare=False)  # int64
    unit_micro: np.ndarray = field(init=False, repr=False, compare=False)  # int64
    offpeak_micro: np.ndarray = field(init=False, repr=False, compare=False)  # int64
    minimum_minor: np.ndarray = field(init=False, repr=False, compare=False)  # int64, -1 = no minimum

    def __post_init__(self) -> None:
        p = self.prices
        derived = {
            "currency": np.array([x.currency for x in p], dtype=object),
            "digits": np.array([x.digits for x in p], dtype=np.int64),
            "unit_micro": np.array([x.unit_price for x in p], dtype=np.int64),
            "offpeak_micro": np.array([x.offpeak_price for x in p], dtype=np.int64),
            "minimum_minor": np.array(
                [-1 if x.minimum_charge is None else _half_up(x.minimum_charge * 10**x.digits, MICRO) for x in p],
                dtype=np.int64,
            ),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    @functools.cached_property
    def product_array(self) -> pa.Array:
        """``products`` as an Arrow array (made when first rated with: from Python objects, Arrow imports pandas)."""
        return pa.array(self.products, pa.string())

    def get(self, product: str) -> ProductPrice | None:
        """The prices of ``product``, or None if the book does not list it."""
        try:
            return self.prices[self.products.index(product)]
        except ValueError:
            return None


@dataclass(frozen=True)
class TaxTable:
    """A validated tax table; ``regions[i]`` has rate ``rates[i]`` (micro-units, 0..10^6)."""

    content_hash: str
    regions: tuple[str, ...]
    rates: tuple[int, ...]
    rate_micro: np.ndarray = field(init=False, repr=False, compare=False)  # int64

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate_micro", np.array(self.rates, dtype=np.int64))

    @functools.cached_property
    def region_array(self) -> pa.Array:
        """``regions`` as an Arrow array (made when first rated with: from Python objects, Arrow imports pandas)."""
        return pa.array(self.regions, pa.string())

    def rate(self, region: str) -> int | None:
        """The rate of ``region`` in micro-units, or None if the table does not list it."""
        try:
            return self.rates[self.regions.index(region)]
        except ValueError:
            return None


def load_price_book(data: bytes) -> PriceBook:
    """Parse and validate a price book CSV; :class:`ReferenceDataError` names the first problem."""
    products: list[str] = []
    prices: list[ProductPrice] = []
    seen: dict[str, int] = {}
    for line, row in _rows(data, "price book", _PRICE_COLUMNS, optional=(_UNIT_COLUMN,)):
        product = row["product"]
        if not product:
            raise ReferenceDataError(f"price book line {line}: product is empty")
        if product in seen:
            raise ReferenceDataError(
                f"price book line {line}: duplicate product {product!r} (first on line {seen[product]})"
            )
        seen[product] = line
        currency = row["currency"]
        if currency not in CURRENCY_DIGITS:
            raise ReferenceDataError(f"price book line {line}: unknown currency {currency!r}")
        unit = _amount(row["unit_price"], f"price book line {line}: unit_price", MAX_PRICE_MICRO)
        offpeak_text, minimum_text = row["offpeak_unit_price"], row["minimum_charge"]
        offpeak = (
            _amount(offpeak_text, f"price book line {line}: offpeak_unit_price", MAX_PRICE_MICRO)
            if offpeak_text
            else unit
        )
        minimum = (
            _amount(minimum_text, f"price book line {line}: minimum_charge", MAX_PRICE_MICRO) if minimum_text else None
        )
        products.append(product)
        texts = (row["unit_price"], offpeak_text or row["unit_price"], minimum_text)
        prices.append(
            ProductPrice(currency, CURRENCY_DIGITS[currency], unit, offpeak, minimum, _unit(row, line), texts)
        )
    if not products:
        raise ReferenceDataError("price book has no products")
    return PriceBook(hashlib.sha256(data).hexdigest(), tuple(products), tuple(prices))


def load_tax_table(data: bytes) -> TaxTable:
    """Parse and validate a tax table CSV (a ``*`` default row is required)."""
    regions: list[str] = []
    rates: list[int] = []
    seen: dict[str, int] = {}
    for line, row in _rows(data, "tax table", _TAX_COLUMNS):
        region = row["region"]
        if not region:
            raise ReferenceDataError(f"tax table line {line}: region is empty")
        if region in seen:
            raise ReferenceDataError(
                f"tax table line {line}: duplicate region {region!r} (first on line {seen[region]})"
            )
        if len(region) > MAX_REGION:
            raise ReferenceDataError(f"tax table line {line}: region {region!r} is longer than {MAX_REGION} characters")
        seen[region] = line
        regions.append(region)
        rates.append(_amount(row["tax_rate"], f"tax table line {line}: tax_rate", MAX_RATE_MICRO))
    if DEFAULT_REGION not in seen:
        raise ReferenceDataError(f"tax table has no default row (region {DEFAULT_REGION!r})")
    return TaxTable(hashlib.sha256(data).hexdigest(), tuple(regions), tuple(rates))


def _unit(row: dict[str, str], line: int) -> str:
    """A price book row's unit: its ``unit`` cell, :data:`DEFAULT_UNIT` where the column or the cell is empty."""
    unit = row.get(_UNIT_COLUMN) or DEFAULT_UNIT
    if len(unit) > _MAX_UNIT:
        raise ReferenceDataError(f"price book line {line}: unit {unit!r} is longer than {_MAX_UNIT} characters")
    return unit


def _rows(
    data: bytes, what: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, stripped cells by column) for each non-empty data row of a CSV: the ``required`` columns, and
    those of ``optional`` the header has."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReferenceDataError(f"{what} is not UTF-8 (byte {exc.start})") from None
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""), strict=True)
    try:
        header = [name.strip() for name in next(reader, [])]
        missing = [name for name in required if name not in header]
        if missing:
            raise ReferenceDataError(f"{what} line 1: missing column(s) {', '.join(missing)}")
        if len(set(header)) != len(header):
            raise ReferenceDataError(f"{what} line 1: duplicate column names")
        positions = {name: header.index(name) for name in (*required, *optional) if name in header}
        for cells in reader:
            if not cells:
                continue
            if len(cells) > len(header):
                raise ReferenceDataError(f"{what} line {reader.line_num}: more cells than columns")
            yield reader.line_num, {name: cells[i].strip() if i < len(cells) else "" for name, i in positions.items()}
    except csv.Error as exc:
        raise ReferenceDataError(f"{what} line {reader.line_num}: malformed CSV ({exc})") from None


def _amount(text: str, where: str, maximum: int) -> int:
    """A decimal string as micro-units, checked against 0..``maximum`` and 6 fractional digits."""
    match = _DECIMAL.fullmatch(text)
    if match is None:
        raise ReferenceDataError(f"{where}: {text!r} is not a decimal number")
    sign, whole, fraction = match.group(1), match.group(2), match.group(3) or ""
    if len(fraction) > 6:
        raise ReferenceDataError(f"{where}: {text!r} has more than 6 fractional digits")
    value = int(whole) * MICRO + int(fraction.ljust(6, "0"))
    if sign == "-" and value:
        raise ReferenceDataError(f"{where}: {text!r} is negative")
    if value > maximum:
        raise ReferenceDataError(f"{where}: {text!r} is above {maximum // MICRO:,}")
    return value


def _half_up(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` rounded half-up, for non-negative integers."""
    return (numerator + denominator // 2) // denominator
