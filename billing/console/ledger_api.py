"""The ledger in the JSON API (``/api``): documents (the JSON of ``billing documents list --format json``) and a
document's PDF, billing periods with their pending difference, and the two ledger actions, close and void,
behind the console token and CSRF (:mod:`billing.console.guard`), refused as the CLI refuses them (one line,
nothing changed). Money is an exact integer in minor units of the document's ``currency``."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Form, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from store import PERIOD_PATTERN, AlreadyVoided, Document, LedgerError, Period, Store

from ..ledger import closing_message, void_batch
from . import guard
from .api import ID_PATTERN, MONEY, SettingsDep, StoreDep, batch_json

router = APIRouter(prefix="/api", tags=["ledger"])

MAX_NUMBER = 2**63 - 1
DOCUMENT_PAGE = 1000
Number = Annotated[int, Path(ge=1, le=MAX_NUMBER, description="the document's number")]
PeriodName = Annotated[str, Path(pattern=PERIOD_PATTERN, description="YYYY-MM")]
#: A period to close: the close refuses a malformed one itself (400, one line), as ``billing close`` does.
ClosingPeriod = Annotated[str, Path(max_length=64, description="YYYY-MM")]


class LineOut(BaseModel):
    product: str
    transactions: int
    quantity: str = Field(description="exact decimal text")
    net: int = Field(description=MONEY)
    tax: int = Field(description=MONEY)
    total: int = Field(description=MONEY)
    batches: list[str] = Field(description="the batches whose rows changed this line")
    unit: str | None = Field(None, description="the price book's unit of the product")
    unit_price: str | None = Field(None, description="decimal text, as in the price book that rated the rows")
    offpeak_unit_price: str | None = Field(None, description="decimal text")
    pricebook: str | None = Field(None, description="SHA-256 of the price book that rated the line's rows")


class PartyOut(BaseModel):
    """A party as the document keeps it (a snapshot taken at issue)."""

    name: str
    address: str
    country: str = Field(description="ISO 3166-1 alpha-2")
    tax_id: str | None = None


class CustomerOut(PartyOut):
    account_id: str


class ServicePeriodOut(BaseModel):
    start: str = Field(alias="from", description="the period's first UTC day, ISO 8601")
    to: str = Field(description="the period's last UTC day, ISO 8601")


class TaxOut(BaseModel):
    """The document's changes at one tax rate."""

    rate: str | None = Field(description="decimal text (0.2 is 20 %); null: changes from before rates were recorded")
    regions: list[str]
    net: int = Field(description="the taxable amount; " + MONEY)
    tax: int = Field(description=MONEY)


Kind = Literal["invoice", "credit_note", "debit_note"]


class DifferenceOut(BaseModel):
    """What the next close would issue for one account and currency (signed)."""

    kind: Kind
    period: str
    account_id: str
    currency: str
    net: int = Field(description=MONEY)
    tax: int = Field(description=MONEY)
    total: int = Field(description=MONEY)
    corrects: list[int] = Field(
        default_factory=list, description="a note's earlier documents of its account, period and currency"
    )
    lines: list[LineOut]
    taxes: list[TaxOut] | None = Field(None, description="one entry per tax rate; they add up to net and tax")


class DocumentOut(DifferenceOut):
    """An issued document, never changed (``corrected_by`` grows as notes correct it)."""

    number: int
    issued_at: str = Field(description="ISO 8601, UTC")
    pricebooks: list[str] = Field(description="SHA-256 of the price books its lines were rated with")
    tax_tables: list[str] = Field(description="SHA-256 of the tax tables its lines were rated with")
    # Part 3 (absent from documents issued before it: left out of the JSON, not null)
    display_number: str | None = Field(None, description="the seller's prefix and the number padded to 6 digits")
    corrected_by: list[int] | None = Field(None, description="an invoice's (or note's) later notes")
    seller: PartyOut | None = Field(None, description="as at issue; null for documents issued before parties existed")
    customer: CustomerOut | None = Field(None, description="null: the account had no customer record")
    service_period: ServicePeriodOut | None = None
    due_date: str | None = Field(None, description="ISO 8601 date")


class PeriodOut(BaseModel):
    period: str
    state: Literal["open", "closed"] = Field(description="closed from its first close on")
    documents: int
    pending: list[DifferenceOut] = Field(description="what closing it now would issue")


class Closed(BaseModel):
    period: str
    issued: list[DocumentOut] = Field(description="in number order; empty when nothing changed since the last close")
    message: str


@router.get(
    "/documents",
    response_model=list[DocumentOut],
    summary="Issued documents by number, under filters",
    response_model_exclude_unset=True,
)
def list_documents(
    response: Response,
    store: StoreDep,
    period: Annotated[str | None, Query(pattern=PERIOD_PATTERN)] = None,
    account: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
    kind: Kind | None = None,
    limit: Annotated[int, Query(ge=1, le=DOCUMENT_PAGE)] = DOCUMENT_PAGE,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> list[dict[str, Any]]:
    """A JSON list as ``billing documents list --format json`` prints it; a full page has a ``Link`` header to
    the next one."""
    found = store.documents(period=period, account=account, kind=kind, limit=limit, offset=offset)
    if len(found) == limit:
        query = {k: v for k, v in (("period", period), ("account", account), ("kind", kind)) if v}
        following = urlencode({**query, "limit": limit, "offset": offset + limit})
        response.headers["Link"] = f'</api/documents?{following}>; rel="next"'
    return [doc.to_json_dict() for doc in found]


@router.get(
    "/documents/{number}", response_model=DocumentOut, summary="One document", response_model_exclude_unset=True
)
def one_document(store: StoreDep, number: Number) -> dict[str, Any]:
    return _document(store, number).to_json_dict()


@router.get(
    "/documents/{number}/pdf",
    response_class=Response,
    responses={200: {"content": {"application/pdf": {}}}},
    summary="One document as PDF",
)
def document_pdf(store: StoreDep, number: Number) -> Response:
    from .pdf import pdf  # ReportLab: only for this

    body = pdf(_document(store, number))
    disposition = f'inline; filename="document-{number}.pdf"'
    return Response(body, media_type="application/pdf", headers={"Content-Disposition": disposition})


def _document(store: Store, number: int) -> Document:
    found = store.document(number)
    if found is None:
        raise HTTPException(404, f"no document numbered {number}")
    return found


@router.get(
    "/periods",
    response_model=list[PeriodOut],
    summary="Billing periods, newest first: state, pending",
    response_model_exclude_unset=True,
)
def list_periods(store: StoreDep) -> list[dict[str, Any]]:
    return [period.to_json_dict() for period in store.periods()]


@router.get(
    "/periods/{period}",
    response_model=PeriodOut,
    summary="One billing period: state, pending difference",
    response_model_exclude_unset=True,
)
def one_period(store: StoreDep, period: PeriodName) -> dict[str, Any]:
    return period_state(store, period).to_json_dict()


def period_state(store: Store, period: str) -> Period:
    """A period as :meth:`store.Store.periods` has it; one without rows or documents open, nothing pending."""
    found = store.periods(period)
    return found[0] if found else Period(period, False, 0, ())


@router.get("/csrf", summary="A CSRF value for the actions (also set as the `billing_csrf` cookie)")
def csrf(request: Request) -> JSONResponse:
    value = guard.csrf_value(request)
    response = JSONResponse({"csrf": value})
    guard.set_csrf(response, value)
    return response


@router.post(
    "/periods/{period}/close",
    response_model=Closed,
    response_model_exclude_unset=True,
    summary="Close a period (console token and CSRF): issue its documents, as `billing close` does",
    responses={
        400: {"description": "malformed or not ended period, no seller, or (require_customers) a customer missing"},
        403: {"description": "token or CSRF refused"},
    },
)
async def close_period(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    period: ClosingPeriod,
    token: guard.Token = "",
    csrf: guard.Csrf = "",
    require_customers: Annotated[
        bool, Form(description="refuse (nothing issued) if an account to document has no customer record")
    ] = False,
) -> dict[str, Any]:
    guard.authorise(request, settings, token, csrf)
    try:
        issued = await run_in_threadpool(store.close_period, period, require_customers=require_customers)
    except LedgerError as exc:
        raise refusal(exc) from None
    message = closing_message(period, issued)
    return {"period": period, "issued": [doc.to_json_dict() for doc in issued], "message": message}


@router.post(
    "/batches/{batch_id}/void",
    summary="Void a complete batch (console token and CSRF), as `billing void` does",
    responses={
        400: {"description": "unknown or incomplete batch"},
        403: {"description": "token or CSRF refused"},
        409: {"description": "voided before"},
    },
)
async def void(
    request: Request,
    settings: SettingsDep,
    store: StoreDep,
    batch_id: Annotated[str, Path(pattern=ID_PATTERN)],
    token: guard.Token = "",
    csrf: guard.Csrf = "",
) -> dict[str, Any]:
    guard.authorise(request, settings, token, csrf)
    try:
        voided = await void_batch(settings, store, batch_id)
    except LedgerError as exc:
        raise refusal(exc) from None
    return batch_json(voided)


def refusal(exc: LedgerError) -> HTTPException:
    """A ledger refusal as HTTP: 409 for a batch voided before, 400 otherwise; its one line as the detail."""
    return HTTPException(409 if isinstance(exc, AlreadyVoided) else 400, str(exc))
