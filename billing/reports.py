"""Reports of one batch or across batches (the store's reads), as pandas frames written as a table, CSV,
JSON or Parquet.

Money columns (``net``, ``tax``, ``total``) hold Python ints (object dtype), never floats, whatever their
size; ``quantity`` is a plain decimal string ("12.5", "3", "0"). CSV, JSON and Parquet keep money in integer
minor units; the terminal table shows it in each row's currency units and says so.
"""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from shared.errors import InputError
from shared.rules.reference import money
from store import MONEY_COLUMNS, Filters, Result, Store, quantity_text

AGGREGATE_COLUMNS = ["account_id", "product", "billing_day", "currency", "transactions", "quantity", *MONEY_COLUMNS]
INVOICE_COLUMNS = ["account_id", "billing_period", "currency", *MONEY_COLUMNS]
REJECT_COLUMNS = ["row", "reason", "raw"]
#: What a table with money says under it.
MONEY_NOTE = "net, tax and total in each row's currency units (CSV, JSON and Parquet: integer minor units)"
_ARROW_TYPES = {"transactions": pa.int64(), "row": pa.int64(), **{c: pa.decimal128(38, 0) for c in MONEY_COLUMNS}}
Format = Literal["table", "csv", "json", "parquet"]

#: A spreadsheet treats a cell starting with one of these as a formula.
_FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def aggregates(store: Store, selection: str | Filters) -> pd.DataFrame:
    """Aggregates per (account_id, product, billing_day, currency), sorted by that key: of one batch (its id),
    or summed over the batches ``selection`` (:class:`~store.Filters`) counts."""
    return _report(store.aggregates(_filters(selection)), selection, AGGREGATE_COLUMNS)


def invoices(store: Store, selection: str | Filters) -> pd.DataFrame:
    """Invoices per (account_id, billing_period YYYY-MM, currency): exact sums of the aggregates of one batch
    (its id), or of the batches ``selection`` counts (by default every complete batch)."""
    return _report(store.invoices(_filters(selection)), selection, INVOICE_COLUMNS)


def rejects(store: Store, selection: str | Filters) -> pd.DataFrame:
    """The rejected rows (1-based row number, reason code, raw row as JSON text) of one batch, by row; or of
    the batches ``selection`` names (with a ``batch_id`` column)."""
    batch_ids = _filters(selection).batches
    if not batch_ids:
        raise InputError("rejects are per batch: name the batch(es)")
    records = [
        (batch_id, row["row"], row["reason"], row["raw"])
        for batch_id in sorted(set(batch_ids))
        for row in store.rejected_rows(batch_id)
    ]
    if isinstance(selection, str):
        return _frame([record[1:] for record in records], REJECT_COLUMNS)
    return _frame(records, ["batch_id", *REJECT_COLUMNS])


def write_report(df: pd.DataFrame, fmt: Format, output: Path | None = None) -> str | None:
    """Render ``df`` as ``fmt``; return the text, or write it to ``output`` and return None.

    ``parquet`` needs ``output`` (money as ``decimal128(38, 0)``); ``csv`` neutralises spreadsheet
    formulas by prefixing text cells that start with ``= + - @`` with a single quote; ``table`` shows money in
    the currency's units (:func:`in_units`).
    """
    if fmt == "parquet":
        if output is None:
            raise ValueError("the parquet format needs an output path")
        pq.write_table(_arrow(df), output)
        return None
    if fmt == "table":
        text = in_units(df).to_string(index=False) if len(df) else "(no rows)\n" + "  ".join(df.columns)
        if len(df) and MONEY_COLUMNS[0] in df.columns:
            text += "\n" + MONEY_NOTE
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


def in_units(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` with its money columns as text in each row's currency units (``1,234.56 USD``)."""
    shown = df.copy()
    for column in MONEY_COLUMNS:
        if column in shown.columns:
            shown[column] = [money(v, c) for v, c in zip(shown[column], shown["currency"], strict=True)]
    return shown


def _filters(selection: str | Filters) -> Filters:
    return Filters(batches=(selection,)) if isinstance(selection, str) else selection


def _report(result: Result, selection: str | Filters, columns: list[str]) -> pd.DataFrame:
    """``result`` as a frame of ``columns`` (quantity as plain text), with a ``batches`` column (the batch ids
    each row sums, space-separated) unless it is one batch's; ``attrs`` keep the batches included and excluded."""
    one_batch = isinstance(selection, str)
    records = [
        (
            *(_text(row[name]) for name in columns),
            *(() if one_batch else (" ".join(row["batches"]),)),
        )
        for row in result.rows
    ]
    df = _frame(records, columns if one_batch else [*columns, "batches"])
    df.attrs.update(batches=result.batches, excluded=result.excluded)
    return df


def _text(value: Any) -> Any:
    """Report cells: days as ISO text, quantities as plain decimal text, the rest as they are."""
    if isinstance(value, date):
        return value.isoformat()
    return quantity_text(value) if isinstance(value, Decimal) else value


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
