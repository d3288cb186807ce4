"""The register export (``billing documents export``): the issued documents, one record each, their lines, or
their tax per rate, as a CSV or Parquet file an accountant loads. Money in integer minor units
(``decimal128(38, 0)``: exact past 2^63, as the store keeps it); ``corrects`` a list in Parquet, space-separated
numbers in CSV, and a tax entry's ``regions`` likewise."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from shared.errors import InputError

if TYPE_CHECKING:
    from store import Document

What = Literal["documents", "lines", "taxes"]
Format = Literal["csv", "parquet"]
WHATS: tuple[What, ...] = ("documents", "lines", "taxes")
FORMATS: tuple[Format, ...] = ("csv", "parquet")
MONEY = pa.decimal128(38, 0)
QUANTITY = pa.decimal128(38, 6)


class ExportRefused(InputError):
    """A register that cannot be written where asked (one line)."""


def _documents(docs: Sequence[Document], fmt: Format) -> pa.Table:
    corrects: pa.Array = (
        pa.array([list(d.corrects) for d in docs], pa.list_(pa.int64()))
        if fmt == "parquet"
        else pa.array([" ".join(str(n) for n in d.corrects) for d in docs], pa.string())
    )
    return pa.table(
        {
            "number": pa.array([d.number for d in docs], pa.int64()),
            "display_number": pa.array([d.display_number for d in docs], pa.string()),
            "kind": pa.array([d.kind for d in docs], pa.string()),
            "period": pa.array([d.period for d in docs], pa.string()),
            "account_id": pa.array([d.account_id for d in docs], pa.string()),
            "name": pa.array([d.customer["name"] if d.customer else None for d in docs], pa.string()),
            "currency": pa.array([d.currency for d in docs], pa.string()),
            **{m: pa.array([Decimal(getattr(d, m)) for d in docs], MONEY) for m in ("net", "tax", "total")},
            "issued_at": pa.array([d.issued_at for d in docs], pa.timestamp("us", tz="UTC")),
            "due_date": pa.array([d.due_date for d in docs], pa.date32()),
            "corrects": corrects,
        }
    )


def _lines(docs: Sequence[Document], fmt: Format) -> pa.Table:
    from store import quantity_text

    rows = [(d, line) for d in docs for line in d.lines]
    quantities = [line.sums.quantity for _, line in rows]
    return pa.table(
        {
            "number": pa.array([d.number for d, _ in rows], pa.int64()),
            "display_number": pa.array([d.display_number for d, _ in rows], pa.string()),
            "product": pa.array([line.product for _, line in rows], pa.string()),
            "transactions": pa.array([line.sums.transactions for _, line in rows], pa.int64()),
            "quantity": pa.array(quantities, QUANTITY)
            if fmt == "parquet"
            else pa.array([quantity_text(q) for q in quantities], pa.string()),
            **{
                m: pa.array([Decimal(getattr(line.sums, m)) for _, line in rows], MONEY)
                for m in ("net", "tax", "total")
            },
            "pricebook": pa.array([line.pricebook or None for _, line in rows], pa.string()),
            **{
                name: pa.array([getattr(line.price, name) if line.price else None for _, line in rows], pa.string())
                for name in ("unit", "unit_price", "offpeak_unit_price")
            },
        }
    )


def _taxes(docs: Sequence[Document], fmt: Format) -> pa.Table:
    rows = [(d, tax) for d in docs for tax in d.taxes]
    regions: pa.Array = (
        pa.array([list(tax.regions) for _, tax in rows], pa.list_(pa.string()))
        if fmt == "parquet"
        else pa.array([" ".join(tax.regions) for _, tax in rows], pa.string())
    )
    return pa.table(
        {
            "number": pa.array([d.number for d, _ in rows], pa.int64()),
            "display_number": pa.array([d.display_number for d, _ in rows], pa.string()),
            "rate": pa.array([tax.rate for _, tax in rows], pa.string()),
            "regions": regions,
            **{m: pa.array([Decimal(getattr(tax, m)) for _, tax in rows], MONEY) for m in ("net", "tax")},
        }
    )


def register(docs: Sequence[Document], what: What, fmt: Format) -> pa.Table:
    """The documents (one row each), their lines (one row each, by document number, product and price book) or
    their tax entries (one row each, by document number and rate) as a table."""
    return {"documents": _documents, "lines": _lines, "taxes": _taxes}[what](docs, fmt)


def write_register(table: pa.Table, fmt: Format, out: Path) -> None:
    """Write ``table`` to ``out`` whole or not at all (a file beside it, then renamed over it);
    :class:`ExportRefused` where it cannot be written."""
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    except OSError as exc:
        raise ExportRefused(f"cannot write {out}: {exc.strerror or exc}") from None
    os.close(handle)
    try:
        if fmt == "parquet":
            pq.write_table(table, temporary)
        else:
            pa_csv.write_csv(table, temporary)
        os.replace(temporary, out)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise ExportRefused(f"cannot write {out}: {exc.strerror or exc}") from None
