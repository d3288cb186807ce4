"""Exact arithmetic on aggregates in Arrow: partial aggregates of batches as one table (:func:`of_batches`), summed
per key (:func:`fold`), never wrapping on overflow (:func:`sum_fits`), and grouped into what the store keeps
(:func:`daily`, :func:`regional`).

A partial aggregate's key is (batch, account, product, billing day, tax region, price book); its values are a
currency, the tax rate and sums. The store keeps them per day without the region (``aggregates``: the reports), and
per billing period with the region and rate (``period_aggregates``: the documents).
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import localcontext
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from shared.rules.schemas import PARTIAL_SCHEMA

from .schema import EXACT

AGGREGATE_KEY = ("batch_id", "account_id", "product", "billing_day", "region", "pricebook")
AGGREGATE_VALUES = ("currency", "tax_rate", "transactions", "quantity", "net", "tax", "total")
#: The values the key determines (the first of them is kept), and those summed.
KEPT = AGGREGATE_VALUES[:2]
SUMMED = AGGREGATE_VALUES[2:]
#: The keys of the rows of ``aggregates`` and of ``period_aggregates``.
DAILY_KEY = ("batch_id", "account_id", "product", "billing_day", "pricebook")
PERIOD_KEY = ("batch_id", "account_id", "product", "period", "pricebook", "region", "tax_rate")
#: How aggregate columns are held in Arrow while folding.
ARROW_TYPES = {**{f.name: f.type for f in PARTIAL_SCHEMA}, "batch_id": pa.string(), "billing_day": pa.date32()}
#: A fold's table (see :func:`fold`).
FOLD_SCHEMA = pa.schema([(name, ARROW_TYPES[name]) for name in AGGREGATE_KEY + AGGREGATE_VALUES])


def of_batches(tables: Sequence[tuple[str, pa.Table]]) -> pa.Table:
    """Partial aggregates (``PARTIAL_SCHEMA`` tables, by batch) as one table with a ``batch_id`` column and
    ``billing_day`` as a date (checked); a null sum raises ``ValueError``."""
    if not tables:
        return FOLD_SCHEMA.empty_table()
    table = pa.concat_tables([partial for _, partial in tables])
    for name in SUMMED:
        if table[name].null_count:
            raise ValueError(f"partial aggregates with a null {name}")
    batch_ids = pa.chunked_array([pa.repeat(batch_id, partial.num_rows) for batch_id, partial in tables], pa.string())
    day = table.schema.get_field_index("billing_day")
    return table.set_column(day, "billing_day", table["billing_day"].cast(pa.date32())).add_column(
        0, "batch_id", batch_ids
    )


def fold(table: pa.Table, key: Sequence[str] = AGGREGATE_KEY, kept: Sequence[str] = KEPT) -> pa.Table:
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


def daily(folded: pa.Table) -> pa.Table:
    """A batch's fold (:func:`fold`) summed per :data:`DAILY_KEY`: the rows of ``aggregates``."""
    return fold(folded, DAILY_KEY, ("currency",))


def regional(folded: pa.Table) -> pa.Table:
    """A batch's fold (:func:`fold`) summed per :data:`PERIOD_KEY` (the period ``YYYY-MM`` of the billing day, a
    rate not recorded as ``''``): the rows of ``period_aggregates``."""
    period = pc.utf8_slice_codeunits(folded["billing_day"].cast(pa.string()), 0, 7)
    rate = pc.fill_null(folded["tax_rate"], "")
    table = folded.append_column("period", period).set_column(
        folded.schema.get_field_index("tax_rate"), "tax_rate", rate
    )
    return fold(table, PERIOD_KEY, ("currency",))


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
