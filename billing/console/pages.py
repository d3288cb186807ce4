"""The console's HTML pages, rendered on the server from the same queries as the API (``api``).

Poison replay and purge here, close and void in :mod:`billing.console.ledger_pages`, are the actions that change
anything; each passes :func:`billing.console.guard.authorise` (the console token, a POST, a CSRF value).
"""

from __future__ import annotations

import itertools
from datetime import date, datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Form, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from shared.messaging.processes import role_states
from store import PERIOD_PATTERN, BatchState, Filters

from .. import poison
from . import charts, guard, render
from .api import ID_PATTERN, SettingsDep, StoreDep, batch_detail, batch_json, queue_depths, row_json

router = APIRouter(include_in_schema=False)

INVOICE_PAGE = 500  # invoice rows per page
#: Marks between which a batch's phases run, in the order they happen.
PHASES = (
    ("uploaded_at", "uploaded"),
    ("accepted_at", "accepted"),
    ("first_item_sent_at", "first work item sent"),
    ("last_item_sent_at", "last work item sent"),
    ("debatched_at", "debatched"),
    ("completed_at", "complete"),
)


def _html(template: str, **context: Any) -> HTMLResponse:
    return HTMLResponse(render.page(template, **context))


@router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse("/batches")


@router.get("/batches")
def batches_page(store: StoreDep) -> HTMLResponse:
    found = [batch_json(s) for s in reversed(store.batches())]
    per_1000: dict[date | datetime, float] = {
        datetime.fromisoformat(b["accepted_at"]): b["requests_per_1000"]
        for b in found
        if b["accepted_at"] and b["requests_per_1000"] is not None and b["state"] == BatchState.complete
    }
    drawn = (
        [charts.lines({"requests / 1,000 tx": per_1000}, title="Storage requests per 1,000 transactions", unit="")]
        if per_1000
        else []
    )
    return _html("batches.html", batches=found, charts=drawn)


@router.get("/batches/{batch_id}")
def batch_page(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    batch_id: Annotated[str, Path(pattern=ID_PATTERN)],
    voided: bool = False,
) -> HTMLResponse:
    detail = batch_detail(store, batch_id)
    batch = detail["batch"]
    drawn = []
    spans = _phase_spans(batch)
    if spans:
        drawn.append(charts.timeline(spans, title="Phases"))
    if detail["rejects_by_reason"]:
        reasons = detail["rejects_by_reason"]
        drawn.append(charts.bars(list(reasons), list(reasons.values()), title="Rejects by reason", unit="rows"))
    rejected = store.rejected_rows(batch_id, limit=100)
    context = {
        "detail": detail,
        "batch": batch,
        "charts": drawn,
        "rejected": rejected,
        "just_voided": voided,
        "stalled_after": f"{settings.stalled_after.total_seconds():.0f} s",
    }
    return guard.form_page(request, settings, render.page, "batch.html", **context)


def _phase_spans(batch: dict[str, Any]) -> list[tuple[str, float, float]]:
    marks = [(label, datetime.fromisoformat(batch[key])) for key, label in PHASES if batch.get(key)]
    if len(marks) < 2:
        return []
    zero = min(moment for _, moment in marks)
    marks.sort(key=lambda mark: mark[1])
    return [
        (f"→ {label}", (before - zero).total_seconds(), (moment - zero).total_seconds())
        for (_, before), (label, moment) in itertools.pairwise(marks)
    ]


@router.get("/invoices")
def invoices_page(
    store: StoreDep,
    period: Annotated[str | None, Query(pattern=f"^({PERIOD_PATTERN[1:-1]})?$")] = None,
    batch: Annotated[str | None, Query(pattern=ID_PATTERN)] = None,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> HTMLResponse:
    """Invoices of a billing period over every complete batch (this month by default), or of one batch; a page of
    :data:`INVOICE_PAGE` rows at a time, the chart over the top accounts of all of them."""
    if batch:
        selection, subject = Filters(batches=(batch,), period=period or None), f"batch {batch}"
    else:
        period = period or date.today().strftime("%Y-%m")
        selection, subject = Filters(period=period), period
    result = store.invoices(selection, limit=INVOICE_PAGE, offset=offset)
    rows = [row_json(row) for row in result.rows]
    leaders = store.top("account_id", selection, limit=charts.LIMIT).rows
    drawn = render.net_by_chart(leaders, "account_id", title=f"Net by account (top {charts.LIMIT}), {subject}")
    query = urlencode({k: v for k, v in (("period", period), ("batch", batch)) if v})
    return _html(
        "invoices.html",
        period=period,
        batch=batch,
        subject=subject,
        query=query,
        result=result,
        rows=rows,
        charts=drawn,
        offset=offset,
        previous_offset=max(offset - INVOICE_PAGE, 0) if offset else None,
        next_offset=offset + INVOICE_PAGE if len(rows) == INVOICE_PAGE else None,
    )


@router.get("/accounts/{account_id}")
def account_page(store: StoreDep, account_id: Annotated[str, Path(pattern=ID_PATTERN)]) -> HTMLResponse:
    mine = Filters(accounts=(account_id,))
    daily = store.daily(mine, by_product=True)
    drawn = render.daily_net_chart(daily.rows, title="Daily net by product")
    invoices = store.invoices(mine)
    return _html(
        "account.html",
        account_id=account_id,
        charts=drawn,
        invoices=[row_json(r) for r in invoices.rows],
        result=invoices,
    )


@router.get("/roles")
async def roles_page(settings: SettingsDep) -> HTMLResponse:
    states = role_states(settings)
    roles = [
        {
            "role": s["role"],
            "pid": str(s["pid"]),  # an id, not a quantity
            "dequeue tasks": sum(listener["active_tasks"] for listener in s["listeners"]),
            "requests": s["requests"].get("total", 0),
            "peak RSS MiB": round(s.get("peak_rss_mib", 0.0)),
            "updated": s["updated_at"],
        }
        for s in states
    ]
    return _html("roles.html", roles=roles, queues=await queue_depths(settings))


@router.get("/poison")
async def poison_page(request: Request, settings: SettingsDep, done: str | None = None) -> HTMLResponse:
    found = await poison.overview(settings)
    queues = [(q, n, entries) for q, n, entries in found if n or entries]
    return guard.form_page(request, settings, render.page, "poison.html", queues=queues, done=done)


@router.get("/poison/{queue}/{entry_id}")
async def poison_entry_page(
    settings: SettingsDep,
    queue: Annotated[str, Path(pattern=ID_PATTERN)],
    entry_id: Annotated[str, Path(pattern=ID_PATTERN)],
) -> HTMLResponse:
    if queue not in settings.all_queues:
        raise HTTPException(404, "no such queue")
    entries = await poison.act(settings, "show", queues=[queue], ids=[entry_id])
    if not entries:
        raise HTTPException(404, "no such poisoned message")
    return _html("poison_entry.html", entry=entries[0])


@router.post("/poison/{action}")
async def poison_action(
    request: Request,
    settings: SettingsDep,
    action: Literal["replay", "purge"],
    queue: Annotated[str, Form()],
    entry_id: Annotated[str, Form()],
    token: guard.Token = "",
    csrf: guard.Csrf = "",
) -> Response:
    """Replay or purge one poisoned message: needs the console token and the CSRF value of the poison page."""
    guard.authorise(request, settings, token, csrf)
    if queue not in settings.all_queues:
        raise HTTPException(404, "no such queue")
    entries = await poison.act(settings, action, queues=[queue], ids=[entry_id])
    verb = {"replay": "replayed", "purge": "purged"}[action]
    return RedirectResponse(f"/poison?done={verb}+{len(entries)}", status_code=303)
