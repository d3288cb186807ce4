"""Vectorised rating (``docs/billing-rules.md``, "Rating one transaction"), exact to the minor unit.

Amounts are integers: quantities and prices in micro-units (10^-6), money in minor units. A row's
``quantity × price`` reaches 10^27 micro², beyond int64, so it is split into 10^6-sized limbs whose
partial products all stay below 2^63 (bounds in :func:`_net`); every per-row result fits int64
(net ≤ 10^18 + 1, total ≤ 2 × 10^18 + 2). Sums of many rows may not, and are taken in decimal128.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from ..errors import InputError, ReferenceDataError
from .reference import MICRO
from .schemas import PARTIAL_SCHEMA
from .versions import Rates

US_PER_DAY = 86_400 * MICRO
#: Peak is Monday–Friday, UTC time of day from PEAK_START_US to PEAK_END_US inclusive.
PEAK_START_US = 8 * 3600 * MICRO
PEAK_END_US = 20 * 3600 * MICRO - 1
MAX_QUANTITY_MICRO = 1_000_000_000 * MICRO
_MONEY = pa.decimal128(38, 0)
#: The amounts summed per aggregate key.
_SUMS = ("quantity", "net", "tax", "total")


def aggregate(accepted: pa.Table, rates: Rates) -> pa.Table:
    """Partial aggregates in ``PARTIAL_SCHEMA``: one row per (account_id, product, billing_day, region, price book),
    in order of account, then product, day and region as rated (sorted by their numbers, not their texts: cheaper,
    and as dense on the wire)."""
    keys = ["account_id", "product", "day", "region"]
    groups = (
        _rated(accepted, rates)
        .group_by(keys, use_threads=False)
        .aggregate([("net", "count"), ("quantity", "sum"), ("net", "sum"), ("tax", "sum"), ("total", "sum")])
        .sort_by([(key, "ascending") for key in keys])
    )
    sums = [groups.column(f"{name}_sum").combine_chunks() for name in _SUMS]
    return _partials(groups, groups.column("net_count"), sums, rates)


def itemise(accepted: pa.Table, rates: Rates) -> pa.Table:
    """Each transaction as partial aggregates of its own (``PARTIAL_SCHEMA``, one transaction a row), in
    ``accepted``'s order: rows held until their batch decides whether they are duplicates."""
    rows = _rated(accepted, rates)
    sums = [rows.column(name).combine_chunks() for name in _SUMS]
    return _partials(rows, pa.array(np.ones(rows.num_rows, dtype=np.int64)), sums, rates)


def _rated(accepted: pa.Table, rates: Rates) -> pa.Table:
    """Per row: account, product and region (indexes into ``rates``' tables laid end to end), UTC day number and the
    amounts, the sums as ``decimal128(38, 0)``."""
    product, region, day, net, tax = _rate(accepted, rates)
    return pa.table(
        {
            "account_id": accepted.column("account_id"),
            "product": pa.array(product, pa.int32()),
            "region": pa.array(region, pa.int32()),
            "day": pa.array(day, pa.int32()),
            "quantity": _column(accepted, "quantity_micro").cast(_MONEY),
            "net": pa.array(net).cast(_MONEY),
            "tax": pa.array(tax).cast(_MONEY),
            "total": pa.array(net + tax).cast(_MONEY),
        }
    )


def _partials(keys: pa.Table, transactions: pa.Array | pa.ChunkedArray, sums: list[pa.Array], rates: Rates) -> pa.Table:
    """A ``PARTIAL_SCHEMA`` table from ``keys``' account, product and region indexes and day, and the sums of
    ``_SUMS``."""
    quantity, net, tax, total = sums
    product = pa.array(keys.column("product").to_numpy())
    region = pa.array(keys.column("region").to_numpy())
    return pa.table(
        {
            "account_id": keys.column("account_id"),
            "product": rates.product_array.take(product),
            "billing_day": _day_strings(keys.column("day").to_numpy()),
            "region": rates.region_array.take(region),
            "pricebook": rates.pricebook_array.take(product),
            "currency": pa.array(rates.column("currency")[product.to_numpy()], pa.string()),
            "tax_rate": rates.rate_text_array.take(region),
            "transactions": transactions,
            # the sum of micro-units, unscaled, is the quantity at scale 6
            "quantity": quantity.view(pa.decimal128(38, 6)),
            "net": net,
            "tax": tax,
            "total": total,
        }
    ).cast(PARTIAL_SCHEMA)


def _rate(accepted: pa.Table, rates: Rates) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(product index, region index, UTC day number, net, tax) per row, as int64 arrays; each row rated with the
    version in force on its day."""
    quantity = _column(accepted, "quantity_micro").to_numpy(zero_copy_only=False)
    if len(quantity) and (quantity.min() < 0 or quantity.max() > MAX_QUANTITY_MICRO):
        raise InputError("a quantity_micro is outside 0..10^15: not a validated transaction")
    timestamp = _column(accepted, "timestamp_us").to_numpy(zero_copy_only=False)
    day, time_of_day = np.divmod(timestamp, US_PER_DAY)
    version = rates.in_force(day)
    if len(version) and version.min() < 0:
        raise InputError("a row is dated before its first reference data version: not a validated transaction")
    books = [f"price book {book.content_hash}" for book in rates.books]
    product = _lookup(accepted, "product", version, rates.products, books)
    tables = [f"tax table {table.content_hash}" for table in rates.tables]
    region = _lookup(accepted, "region", version, rates.regions, tables)
    weekday = (day + 3) % 7  # 1970-01-01 was a Thursday; Monday = 0
    peak = (weekday < 5) & (time_of_day >= PEAK_START_US) & (time_of_day <= PEAK_END_US)
    price = np.where(peak, rates.column("unit_micro")[product], rates.column("offpeak_micro")[product])
    net = _net(quantity, price, 10 ** rates.column("digits")[product])
    minimum = rates.column("minimum_minor")[product]
    net = np.where((quantity > 0) & (minimum >= 0), np.maximum(net, minimum), net)
    return product, region, day, net, _tax(net, rates.column("rate_micro")[region])


def _net(quantity: np.ndarray, price: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``round_half_up(quantity × price × scale / 10^12)`` exactly in int64.

    With q = qh·10^6 + ql (qh ≤ 10^9) and p = ph·10^6 + pl (ph ≤ 10^6), q·p = A·10^12 + B·10^6 + C
    where A = qh·ph ≤ 10^15, B = qh·pl + ql·ph < 1.001·10^15, C = ql·pl < 10^12. With
    B = B1·10^6 + B0: q·p = (A + B1)·10^12 + R, R = B0·10^6 + C < 2·10^12, and scale ≤ 10^3 keeps
    (A + B1)·scale and R·scale far below 2^63.
    """
    qh, ql = np.divmod(quantity, MICRO)
    ph, pl = np.divmod(price, MICRO)
    b1, b0 = np.divmod(qh * pl + ql * ph, MICRO)
    remainder = b0 * MICRO + ql * pl
    net: np.ndarray = (qh * ph + b1) * scale + (remainder * scale + MICRO * MICRO // 2) // (MICRO * MICRO)
    return net


def _tax(net: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """``round_half_up(net × rate / 10^6)`` exactly: net = n1·10^6 + n0, n1·rate ≤ 1.001·10^18."""
    n1, n0 = np.divmod(net, MICRO)
    tax: np.ndarray = n1 * rate + (n0 * rate + MICRO // 2) // MICRO
    return tax


def _lookup(
    accepted: pa.Table,
    name: str,
    version: np.ndarray,
    positions: Callable[[pa.Array, np.ndarray], np.ndarray],
    sources: list[str],
) -> np.ndarray:
    """Each row's value of column ``name`` as a position by ``positions``; :class:`ReferenceDataError` for one its
    version does not know."""
    values = _column(accepted, name)
    found = positions(values, version)
    unknown = np.flatnonzero(found < 0)
    if len(unknown):
        raise ReferenceDataError(f"{name} {values[int(unknown[0])]!s} is not in {sources[version[unknown[0]]]}")
    return found


def _day_strings(day: np.ndarray) -> pa.Array:
    """``YYYY-MM-DD`` of day numbers since 1970-01-01."""
    return pa.array(day.astype(np.int32), pa.int32()).cast(pa.date32()).cast(pa.string())


def _column(table: pa.Table, name: str) -> pa.Array:
    return table.column(name).combine_chunks()
