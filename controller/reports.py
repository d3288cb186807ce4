"""Reports of one batch, read from the store into pandas, and written as a table, CSV, JSON or Parquet.

Money columns (``net``, ``tax``, ``total``) hold Python ints (object dtype), never floats, whatever their
size; ``quantity`` is a plain decimal string ("12.5", "3", "0").
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

from .schema import EXACT
from .schema import aggregates as aggregates_table
from .schema import rejects as rejects_table
from .store import Store

MONEY_COLUMNS = ("net", "tax", "total")
AGGREGATE_COLUMNS = ["account_id", "product", "billing_day", "currency", "transactions", "quantity", *MONEY_COLUMNS]
INVOICE_COLUMNS = ["account_id", "billing_period", "currency", *MONEY_COLUMNS]
REJECT_COLUMNS = ["row", "reason", "raw"]
_ARROW_TYPES = {"transactions": pa.int64(), "row": pa.int64(), **{c: pa.decimal128(38, 0) for c in MONEY_COLUMNS}}
Format = Literal["table", "csv", "json", "parquet"]

#: A spreadsheet treats a cell starting with one of these as a formula.
_FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def aggregates(source: Store | sa.Engine, batch_id: str) -> pd.DataFrame:
    """The batch's aggregates per (account_id, product, billing_day), sorted by that key."""
    t = aggregates_table
    query = sa.select(
        t.c.account_id,
        t.c.product,
        t.c.billing_day,
        t.c.currency,
        t.c.transactions,
        t.c.quantity,
        t.c.net,
        t.c.tax,
        t.c.total,
    ).where(t.c.batch_id == batch_id)
    with _engine(source).connect() as conn:
        records = [
            (
                r.account_id,
                r.product,
                r.billing_day.isoformat(),
                r.currency,
                r.transactions,
                format_quantity(r.quantity),
                int(r.net),
                int(r.tax),
                int(r.total),
            )
            for r in conn.execute(query)
        ]
    return _frame(sorted(records), AGGREGATE_COLUMNS)  # sorted here: the same order whatever the SQL collation


class _AggregateRow(Protocol):
    """The fields of an :func:`aggregates` row that :func:`invoices` reads (money as Python ints)."""

    account_id: str
    billing_day: str
    currency: str
    net: int
    tax: int
    total: int


def invoices(source: Store | sa.Engine, batch_id: str) -> pd.DataFrame:
    """The batch's invoices per (account_id, billing_period YYYY-MM, currency): exact sums of its aggregates."""
    sums: dict[tuple[str, str, str], list[int]] = {}
    rows = cast("Iterable[_AggregateRow]", aggregates(source, batch_id).itertuples(index=False))
    for r in rows:
        totals = sums.setdefault((r.account_id, r.billing_day[:7], r.currency), [0, 0, 0])
        totals[0] += r.net
        totals[1] += r.tax
        totals[2] += r.total
    return _frame([(*key, *values) for key, values in sorted(sums.items())], INVOICE_COLUMNS)


def rejects(source: Store | sa.Engine, batch_id: str) -> pd.DataFrame:
    """The batch's rejected rows (1-based row number, reason code, raw row as JSON text), by row."""
    t = rejects_table
    query = sa.select(t.c.row, t.c.reason, t.c.raw).where(t.c.batch_id == batch_id).order_by(t.c.row)
    with _engine(source).connect() as conn:
        records = [tuple(r) for r in conn.execute(query)]
    return _frame(records, REJECT_COLUMNS)


def format_quantity(value: Decimal) -> str:
    """A plain decimal string without exponent or trailing zeros: ``12.500000`` → ``"12.5"``."""
    if value == 0:
        return "0"
    with localcontext(EXACT):
        return format(value.normalize(), "f")


def write_report(df: pd.DataFrame, fmt: Format, output: Path | None = None) -> str | None:
    """Render ``df`` as ``fmt``; return the text, or write it to ``output`` and return None.

    ``parquet`` needs ``output`` (money as ``decimal128(38, 0)``); ``csv`` neutralises spreadsheet
    formulas by prefixing text cells that start with ``= + - @`` with a single quote.
    """
    if fmt == "parquet":
        if output is None:
            raise ValueError("the parquet format needs an output path")
        pq.write_table(_arrow(df), output)
        return None
    if fmt == "table":
        text = df.to_string(index=False) if len(df) else "(no rows)\n" + "  ".join(df.columns)
    elif fmt == "csv":
        text = df.map(_csv_safe).to_csv(index=False, lineterminator="\n")
    elif fmt == "json":
        text = json.dumps(
            [{k: _json_value(v) for k, v in row.items()} for row in df.to_dict(orient="records")], indent=2
        )
    else:
        raise ValueError(f"unknown report format {fmt!r} (table, csv, json or parquet)")
    if output is None:
        return text
    output.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    return None


def _engine(source: Store | sa.Engine) -> sa.Engine:
    return source.engine if isinstance(source, Store) else source


def _frame(records: list[tuple[Any, ...]], columns: list[str]) -> pd.DataFrame:
    """A DataFrame whose money columns stay Python ints (object dtype) however large."""
    df = pd.DataFrame.from_records(records, columns=columns)
    for column in MONEY_COLUMNS:
        if column in df.columns:
            df[column] = pd.Series([int(v) for v in df[column]], index=df.index, dtype=object)
    return df


def _csv_safe(value: Any) -> Any:
    return "'" + value if isinstance(value, str) and value.startswith(_FORMULA_PREFIXES) else value


def _json_value(value: Any) -> Any:
    """Python natives for JSON: numpy scalars unwrapped; ints stay ints of any size."""
    return value.item() if isinstance(value, np.generic) else value


def _arrow(df: pd.DataFrame) -> pa.Table:
    """An Arrow table with money as exact ``decimal128(38, 0)``, counts as int64, everything else as text."""
    arrays = []
    for column in df.columns:
        kind = _ARROW_TYPES.get(column, pa.string())
        values = [Decimal(v) for v in df[column]] if pa.types.is_decimal(kind) else df[column].tolist()
        arrays.append(pa.array(values, type=kind))
    return pa.Table.from_arrays(arrays, names=list(df.columns))
