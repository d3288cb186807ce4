"""Exact arithmetic on aggregates in Arrow: a batch's partial aggregates as one table (:func:`checked`), summed
per key (:func:`fold`), never wrapping on overflow (:func:`sum_fits`), into what the store keeps (:func:`daily`,
:func:`regional`).

A partial aggregate's key is (account, product, billing day, tax region, price book); its values are a currency,
the tax rate and sums. The store keeps a batch's sums per day without the region (``aggregates``: the reports), and
per billing period with the region and rate (``period_aggregates``: the documents), each folded straight from the
partials.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import localcontext
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from shared.rules.schemas import PARTIAL_SCHEMA

from .schema import EXACT

AGGREGATE_VALUES = ("currency", "tax_rate", "transactions", "quantity", "net", "tax", "total")
#: The values summed.
SUMMED = AGGREGATE_VALUES[2:]
#: The keys of a batch's rows of ``aggregates`` and of ``period_aggregates`` (their ``batch_id`` is the batch's).
DAILY_KEY = ("account_id", "product", "billing_day", "pricebook")
PERIOD_KEY = ("account_id", "product", "period", "pricebook", "region", "tax_rate")


def checked(tables: Sequence[pa.Table]) -> pa.Table:
    """Partial aggregates (``PARTIAL_SCHEMA`` tables) as one table; a null sum or a billing day that is no date
    raises ``ValueError``."""
    table = pa.concat_tables(tables) if tables else PARTIAL_SCHEMA.empty_table()
    for name in SUMMED:
        if table[name].null_count:
            raise ValueError(f"partial aggregates with a null {name}")
    try:
        table["billing_day"].cast(pa.date32())
    except pa.ArrowInvalid as exc:
        raise ValueError(f"partial aggregates with a billing day that is no date: {exc}") from exc
    return table


def fold(table: pa.Table, key: Sequence[str], kept: Sequence[str] = ("currency",)) -> pa.Table:
    """``table``'s rows summed per ``key``, exactly, in key order (key, the first of each ``kept`` column not null,
    sums).

    Arrow's integer and decimal sums wrap silently on overflow, so a column whose sum might not fit its
    type is summed in a wider one; a sum that does not fit the stored type then raises ``ValueError``.
    """
    summed = {}
    for name in SUMMED:
        column = table[name]
        summed[name] = column if sum_fits(column) else column.cast(_wider(column.type))
    grouped = (
        pa.table({**{name: table[name] for name in (*key, *kept)}, **summed})
        .group_by(list(key), use_threads=False)
        .aggregate([*((name, "first") for name in kept), *((name, "sum") for name in SUMMED)])
    )
    folded = pa.table(
        {
            **{name: grouped[name] for name in key},
            **{name: grouped[f"{name}_first"] for name in kept},
            **{name: grouped[f"{name}_sum"].cast(table.schema.field(name).type) for name in SUMMED},
        }
    )
    return folded.sort_by([(name, "ascending") for name in key])


def daily(table: pa.Table) -> pa.Table:
    """Partial aggregates (:func:`checked`), or an earlier :func:`daily`, summed per :data:`DAILY_KEY`: a batch's rows
    of ``aggregates``."""
    return fold(table, DAILY_KEY)


def regional(table: pa.Table) -> pa.Table:
    """Partial aggregates (:func:`checked`), or an earlier :func:`regional`, summed per :data:`PERIOD_KEY` (the
    period ``YYYY-MM`` of the billing day, a rate not recorded as ``''``): a batch's rows of ``period_aggregates``."""
    if "period" not in table.column_names:
        table = table.append_column("period", pc.utf8_slice_codeunits(table["billing_day"], 0, 7)).set_column(
            table.schema.get_field_index("tax_rate"), "tax_rate", pc.fill_null(table["tax_rate"], "")
        )
    return fold(table, PERIOD_KEY)


def sum_fits(column: pa.ChunkedArray) -> bool:
    """Whether Arrow sums any rows of ``column`` without overflow: rows × largest magnitude within its type."""
    bounds = pc.min_max(column)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None:
        return True
    kind = column.type
    if not pa.types.is_decimal(kind):
        largest: int = max(abs(low), abs(high))
        return len(column) * largest < 2**63
    with localcontext(EXACT):
        largest = int(max(abs(low), abs(high)).scaleb(kind.scale))
    limit: int = 10**kind.precision
    return len(column) * largest < limit


def _wider(kind: pa.DataType) -> pa.DataType:
    """A type no sum of fewer than 2^63 values of ``kind`` can overflow."""
    return pa.decimal256(76, kind.scale) if pa.types.is_decimal(kind) else pa.decimal128(38, 0)


def sql_values(column: pa.ChunkedArray) -> list[Any]:
    """Python values to bind: ints stay ints; decimals and dates become their canonical text."""
    values: list[Any] = (column if pa.types.is_integer(column.type) else column.cast(pa.string())).to_pylist()
    return values
