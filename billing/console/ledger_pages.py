"""The ledger's console pages: billing periods (open or closed, the pending difference), a period's documents
with its close button, a document that reads and prints as an invoice (:mod:`billing.console.invoice`), and the
close and void actions behind the console token and CSRF (:mod:`billing.console.guard`); the buttons only when
a token is configured."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from store import BatchState, Period, Store

from . import guard, invoice, ledger_api, render
from .api import ID_PATTERN, SettingsDep, StoreDep
from .ledger_api import Number, PeriodName, period_state

router = APIRouter(include_in_schema=False)

Count = Annotated[int | None, Query(ge=0, le=10**9)]


def pending_totals(period: Period) -> list[dict[str, Any]]:
    """The pending difference summed per currency: documents (and how many of each kind, in kind order), net, tax,
    total (minor units)."""
    sums: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"documents": 0, "kinds": defaultdict(int), "net": 0, "tax": 0, "total": 0}
    )
    for difference in period.pending:
        of_currency, money = sums[difference.currency], difference.sums
        of_currency["documents"] += 1
        of_currency["kinds"][difference.kind] += 1
        for measure in ("net", "tax", "total"):
            of_currency[measure] += getattr(money, measure)
    return [
        {
            "currency": currency,
            **values,
            "kinds": sorted(values["kinds"].items(), key=lambda kind: _kind_order(kind[0])),
        }
        for currency, values in sorted(sums.items())
    ]


def _kind_order(kind: str) -> tuple[int, str]:
    """Kinds in the order of :data:`~billing.console.invoice.TITLES`, any other after them."""
    return (list(invoice.TITLES).index(kind) if kind in invoice.TITLES else len(invoice.TITLES), kind)


@router.get("/periods")
def periods_page(store: StoreDep) -> HTMLResponse:
    found = store.periods()
    rows = [{"period": p, "totals": pending_totals(p)} for p in found]
    return HTMLResponse(render.page("periods.html", periods=rows))


@router.get("/periods/{period}")
def period_page(
    request: Request, store: StoreDep, settings: SettingsDep, period: PeriodName, issued: Count = None
) -> HTMLResponse:
    state = period_state(store, period)
    docs = store.documents(period=period)
    return guard.form_page(
        request,
        settings,
        render.page,
        "period.html",
        period=state,
        totals=pending_totals(state),
        documents=docs,
        issued=issued,
    )


@router.post("/periods/{period}/close")
async def close_action(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    period: ledger_api.ClosingPeriod,
    token: guard.Token = "",
    csrf: guard.Csrf = "",
) -> RedirectResponse:
    """Close the period as the API does, then show it with how many documents were issued."""
    closed = await ledger_api.close_period(request, store, settings, period, token, csrf)
    return RedirectResponse(f"/periods/{period}?issued={len(closed['issued'])}", status_code=303)


@router.get("/documents/{number}")
def document_page(request: Request, store: StoreDep, settings: SettingsDep, number: Number) -> HTMLResponse:
    found = store.document(number)
    if found is None:
        raise HTTPException(404, f"no document numbered {number}")
    return guard.form_page(
        request, settings, invoice.html, found, voidable=voidable(store, invoice.view(found).batches)
    )


def voidable(store: Store, batch_ids: Iterable[str]) -> frozenset[str]:
    """Of these batches, those a void would take: complete and not voided (a voided one shows no void button)."""
    statuses = (store.batch(batch_id) for batch_id in batch_ids)
    return frozenset(s.batch_id for s in statuses if s is not None and s.state == BatchState.complete and not s.voided)


@router.post("/batches/{batch_id}/void")
async def void_action(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    batch_id: Annotated[str, Path(pattern=ID_PATTERN)],
    token: guard.Token = "",
    csrf: guard.Csrf = "",
) -> RedirectResponse:
    """Void the batch as the API does, then show it."""
    await ledger_api.void(request, settings, store, batch_id, token, csrf)
    return RedirectResponse(f"/batches/{batch_id}?voided=1", status_code=303)
