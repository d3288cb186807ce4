"""The read-only JSON API (``/api``): batches, aggregates and invoices across batches, roles, queues, poison,
cost, and streamed CSV/Parquet downloads. Money (``net``, ``tax``, ``total``) is always an exact integer in minor
units of the row's ``currency``; ``quantity`` is exact decimal text."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict
from datetime import date
from decimal import Decimal
from typing import Annotated, Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from azure.core.exceptions import ResourceNotFoundError
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from shared.messaging.processes import role_states
from shared.messaging.storage import Storage
from shared.settings import Settings, poison_queue_name
from store import MONEY_COLUMNS, PERIOD_PATTERN, BatchState, Filters, Result, Store, quantity_text

from .. import cost, poison

ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
PRODUCT_PATTERN = r"^[^\x00-\x1f\x7f]{1,255}$"
MONEY = "exact integer in minor units of `currency` (cents for USD, yen for JPY, fils for KWD); may pass 2^63"
PAGE_ROWS = 1000
DOWNLOAD_PAGE = 20_000

router = APIRouter(prefix="/api", tags=["api"])

BatchId = Annotated[str, Path(pattern=ID_PATTERN, description="The batch id")]


class BatchRef(BaseModel):
    batch_id: str
    state: str


class Row(BaseModel):
    """One group: its key (the dimensions asked for, always ``currency``), measures and the batches summed."""

    batch_id: str | None = None
    account_id: str | None = None
    product: str | None = None
    billing_day: date | None = None
    billing_period: str | None = None
    currency: str
    transactions: int
    quantity: str = Field(description="exact decimal text")
    net: int = Field(description=MONEY)
    tax: int = Field(description=MONEY)
    total: int = Field(description=MONEY)
    batches: list[str] = Field(description="the batches this row sums")


class Report(BaseModel):
    """Rows in key order, the batches they include, and those left out (not complete) that had matching rows."""

    rows: list[Row]
    batches: list[BatchRef]
    excluded: list[BatchRef]
    offset: int
    limit: int
    next_offset: int | None = Field(description="pass as `offset` for the next page; null on the last page")


class Page(BaseModel):
    items: list[dict[str, Any]]
    offset: int
    limit: int
    next_offset: int | None


def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
Limit = Annotated[int, Query(ge=1, le=PAGE_ROWS)]
Offset = Annotated[int, Query(ge=0, le=10**9)]


def filters(
    account: Annotated[list[str], Query(description="account ids (repeat)")] = [],  # noqa: B006 (FastAPI query lists)
    product: Annotated[list[str], Query(description="products (repeat)")] = [],  # noqa: B006
    currency: Annotated[list[str], Query(description="ISO 4217 codes (repeat)")] = [],  # noqa: B006
    batch: Annotated[list[str], Query(description="only these batches, whatever their state (repeat)")] = [],  # noqa: B006
    start: Annotated[date | None, Query(alias="from", description="first billing day (UTC)")] = None,
    end: Annotated[date | None, Query(alias="to", description="last billing day (UTC)")] = None,
    period: Annotated[str | None, Query(pattern=PERIOD_PATTERN, description="YYYY-MM")] = None,
) -> Filters:
    """The report filters from the query string (values that cannot exist are refused with 422)."""
    for values, pattern, name in (
        (account, ID_PATTERN, "account"),
        (batch, ID_PATTERN, "batch"),
        (product, PRODUCT_PATTERN, "product"),
        (currency, r"^[A-Z]{3}$", "currency"),
    ):
        if any(re.fullmatch(pattern, value) is None for value in values):
            raise HTTPException(422, f"{name}: every value must match {pattern}")
    try:
        return Filters(tuple(account), tuple(product), tuple(currency), tuple(batch), start, end, period)
    except ValueError as exc:  # a reversed range
        raise HTTPException(422, str(exc)) from exc


FiltersDep = Annotated[Filters, Depends(filters)]


def report_json(result: Result, offset: int = 0, limit: int | None = None) -> dict[str, Any]:
    """A query result as JSON: days as ISO text, quantity as exact text, money as ints; ``limit`` None: unpaged."""
    return {
        "rows": [row_json(row) for row in result.rows],
        "batches": [asdict(b) for b in result.batches],
        "excluded": [asdict(b) for b in result.excluded],
        "offset": offset,
        "limit": len(result.rows) if limit is None else limit,
        "next_offset": None if limit is None else _next(offset, limit, len(result.rows)),
    }


def _next(offset: int, limit: int, found: int) -> int | None:
    return offset + limit if found == limit else None


def row_json(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    if "billing_day" in out:
        out["billing_day"] = out["billing_day"].isoformat()
    out["quantity"] = quantity_text(row["quantity"])
    return out


def batch_json(status: Any) -> dict[str, Any]:
    """A batch's stored status (phase timestamps, counts) plus ``progress`` (0..1 of its work items, or null)."""
    found: dict[str, Any] = status.to_json_dict()
    found["progress"] = (
        round((status.completed_items + status.poisoned_items) / status.work_items, 4) if status.work_items else None
    )
    return found


@router.get("/batches", response_model=Page, summary="Batches, newest accepted first, with state and phase times")
def list_batches(
    store: StoreDep,
    state: Annotated[BatchState | None, Query()] = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> dict[str, Any]:
    found = [s for s in reversed(store.batches()) if state is None or s.state == state]
    page = found[offset : offset + limit]
    return {
        "items": [batch_json(s) for s in page],
        "offset": offset,
        "limit": limit,
        "next_offset": offset + limit if offset + limit < len(found) else None,
    }


@router.get("/batches/{batch_id}", summary="One batch: status, totals by currency, rejects by reason, poisoned items")
def one_batch(store: StoreDep, batch_id: BatchId) -> dict[str, Any]:
    return batch_detail(store, batch_id)


def batch_detail(store: Store, batch_id: str) -> dict[str, Any]:
    """What the API and the console show of one batch (404 when unknown)."""
    status = store.batch(batch_id)
    if status is None:
        raise HTTPException(404, "no such batch")
    selection = Filters(batches=(batch_id,))
    return {
        "batch": batch_json(status),
        "totals": [row_json(row) for row in store.totals([], selection).rows],
        "rejects_by_reason": store.rejects_by_reason(batch_id),
        "poisoned_items": [
            {**item, "recorded_at": item["recorded_at"].isoformat()} for item in store.poisoned_items(batch_id)
        ],
        "downloads": {
            f"{kind}.{fmt}": f"/api/downloads/{kind}.{fmt}?batch={batch_id}"
            for kind in ("aggregates", "invoices", "rejects")
            for fmt in ("csv", "parquet")
        },
    }


@router.get("/batches/{batch_id}/rejects", response_model=Page, summary="A batch's rejected rows, by row number")
def batch_rejects(store: StoreDep, batch_id: BatchId, limit: Limit = 100, offset: Offset = 0) -> dict[str, Any]:
    rows = store.rejected_rows(batch_id, limit=limit, offset=offset)
    return {
        "items": rows,
        "offset": offset,
        "limit": limit,
        "next_offset": offset + limit if len(rows) == limit else None,
    }


@router.get(
    "/aggregates",
    response_model=Report,
    response_model_exclude_unset=True,
    summary="Aggregates per account, product, billing day and currency",
)
def aggregates(store: StoreDep, selection: FiltersDep, limit: Limit = PAGE_ROWS, offset: Offset = 0) -> dict[str, Any]:
    return report_json(store.aggregates(selection, limit=limit, offset=offset), offset, limit)


@router.get(
    "/invoices",
    response_model=Report,
    response_model_exclude_unset=True,
    summary="Invoices per account, billing period and currency (complete batches unless named)",
)
def invoices(store: StoreDep, selection: FiltersDep, limit: Limit = PAGE_ROWS, offset: Offset = 0) -> dict[str, Any]:
    return report_json(store.invoices(selection, limit=limit, offset=offset), offset, limit)


@router.get(
    "/daily",
    response_model=Report,
    response_model_exclude_unset=True,
    summary="Totals per billing day and currency (and product)",
)
def daily(store: StoreDep, selection: FiltersDep, by_product: bool = False) -> dict[str, Any]:
    return report_json(store.daily(selection, by_product=by_product))


@router.get(
    "/top",
    response_model=Report,
    response_model_exclude_unset=True,
    summary="The accounts or products with the largest net, per currency",
)
def top(
    store: StoreDep,
    selection: FiltersDep,
    dimension: Literal["account_id", "product"] = "account_id",
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
) -> dict[str, Any]:
    return report_json(store.top(dimension, selection, limit=limit))


@router.get("/roles", summary="The live role processes: listeners, dequeue tasks, storage requests by kind")
def roles(settings: SettingsDep) -> dict[str, Any]:
    return {"roles": role_states(settings)}


@router.get("/queues", summary="Approximate depth of every pipeline queue and its poison queue")
async def queues(settings: SettingsDep) -> dict[str, Any]:
    return {"queues": await queue_depths(settings)}


async def queue_depths(settings: Settings) -> list[dict[str, Any]]:
    """Every pipeline queue with its approximate depth and its poison queue's (null: the queue does not exist)."""
    async with Storage(settings) as storage:

        async def depth(name: str) -> int | None:
            try:
                properties = await storage.queue(name).get_queue_properties()
            except ResourceNotFoundError:
                return None
            return properties.approximate_message_count or 0

        return [
            {"queue": q, "depth": await depth(q), "poison_depth": await depth(poison_queue_name(q))}
            for q in settings.all_queues
        ]


@router.get("/poison", summary="Poisoned messages per queue (the first ones, with their reasons)")
async def poisoned(settings: SettingsDep) -> list[dict[str, Any]]:
    found = await poison.overview(settings)
    return [{"queue": q, "count": n, "entries": [asdict(e) for e in entries]} for q, n, entries in found]


@router.get(
    "/cost", summary="Monthly cost projected from the requests measured per 1,000 transactions of complete batches"
)
def cost_projection(
    store: StoreDep,
    daily_transactions: Annotated[int, Query(ge=0, le=10**12)] = 10_000_000,
    idle_hours: Annotated[float, Query(ge=0, le=24)] = 22.0,
    idle_requests_per_hour: Annotated[float, Query(ge=0, le=10**9, description="per processor")] = 12.0,
    processors: Annotated[int, Query(ge=1, le=10_000)] = 1,
) -> dict[str, Any]:
    complete = [s for s in store.batches() if s.state == BatchState.complete and s.accepted]
    accepted = sum(s.accepted for s in complete)
    per_1000 = sum(s.requests for s in complete) * 1000 / accepted if accepted else 0.0
    workload = cost.Workload(
        requests_per_1000=per_1000,
        idle_requests_per_hour=idle_requests_per_hour,
        daily_transactions=daily_transactions,
        idle_hours=idle_hours,
        processors=processors,
    )
    return {
        "measured": {"batches": len(complete), "accepted": accepted, "requests_per_1000": round(per_1000, 3)},
        "projection": cost.project(workload, cost.Prices.load()),
    }


@router.get("/downloads/{name}", summary="A report as a streamed CSV or Parquet file (money: exact minor units)")
def download(
    store: StoreDep,
    selection: FiltersDep,
    name: Annotated[str, Path(pattern=r"^(aggregates|invoices|rejects)\.(csv|parquet)$")],
) -> StreamingResponse:
    kind, fmt = name.split(".")
    if kind == "rejects" and not selection.batches:
        raise HTTPException(422, "rejects are per batch: give batch=")
    rows = _reject_rows(store, selection) if kind == "rejects" else _report_rows(store, kind, selection)
    media = "text/csv; charset=utf-8" if fmt == "csv" else "application/vnd.apache.parquet"
    body = _csv(rows) if fmt == "csv" else _parquet(rows)
    return StreamingResponse(body, media_type=media, headers={"Content-Disposition": f'attachment; filename="{name}"'})


def _report_rows(store: Store, kind: str, selection: Filters) -> Iterator[list[dict[str, Any]]]:
    query = store.invoices if kind == "invoices" else store.aggregates
    offset = 0
    while True:
        rows = query(selection, limit=DOWNLOAD_PAGE, offset=offset).rows
        yield [{**row_json(row), "batches": " ".join(row["batches"])} for row in rows]
        if len(rows) < DOWNLOAD_PAGE:
            return
        offset += DOWNLOAD_PAGE


def _reject_rows(store: Store, selection: Filters) -> Iterator[list[dict[str, Any]]]:
    for batch_id in sorted(set(selection.batches)):
        offset = 0
        while True:
            rows = store.rejected_rows(batch_id, limit=DOWNLOAD_PAGE, offset=offset)
            yield [{"batch_id": batch_id, **row} for row in rows]
            if len(rows) < DOWNLOAD_PAGE:
                break
            offset += DOWNLOAD_PAGE


async def _csv(pages: Iterator[list[dict[str, Any]]]) -> AsyncIterator[str]:
    """CSV text page by page; cells a spreadsheet would read as a formula start with a quote."""
    writer_columns: list[str] | None = None
    for rows in pages:
        out = io.StringIO()
        for row in rows:
            if writer_columns is None:
                writer_columns = list(row)
                csv.writer(out, lineterminator="\n").writerow(writer_columns)
            csv.writer(out, lineterminator="\n").writerow([_csv_cell(v) for v in row.values()])
        yield out.getvalue()


def _csv_cell(value: Any) -> Any:
    return "'" + value if isinstance(value, str) and value.startswith(("=", "+", "-", "@", "\t", "\r")) else value


class _Spool(io.RawIOBase):
    """A write-only sink that hands over what was written so far and still counts every byte (Parquet's
    footer records offsets from ``tell``)."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._chunks.append(chunk)
        self._written += len(chunk)
        return len(chunk)

    def tell(self) -> int:
        return self._written

    def take(self) -> bytes:
        data, self._chunks = b"".join(self._chunks), []
        return data


async def _parquet(pages: Iterator[list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    """Parquet written row group by row group (money as ``decimal128(38, 0)``), each sent as it is written."""
    sink = _Spool()
    writer: pq.ParquetWriter | None = None
    for rows in pages:
        if not rows:
            continue
        table = pa.Table.from_pylist([_arrow_row(row) for row in rows])
        if writer is None:
            writer = pq.ParquetWriter(pa.PythonFile(sink, mode="w"), _arrow_schema(table.schema))
        writer.write_table(table.cast(writer.schema))
        yield sink.take()
    if writer is None:  # nothing matched: a valid file without rows
        writer = pq.ParquetWriter(pa.PythonFile(sink, mode="w"), pa.schema([("batch_id", pa.string())]))
    writer.close()
    yield sink.take()


def _arrow_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: Decimal(v) if k in MONEY_COLUMNS else v for k, v in row.items()}


def _arrow_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, pa.decimal128(38, 0)) if f.name in MONEY_COLUMNS else f for f in schema])
