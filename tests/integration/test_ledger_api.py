"""The ledger in the API and the console of ``billing serve``, in process over ASGI, on real SQLite and PostgreSQL
stores and the session's Azurite: documents as ``billing documents list --format json`` prints them, a
document's PDF, periods with their pending difference, and close and void behind the console token and CSRF,
refused as the CLI refuses them; a close and a void through the API change the ledger as the CLI's do."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient

from billing.client import VOIDED
from billing.console.app import create_app
from billing.console.ledger_api import DocumentOut
from shared.messaging.storage import Storage
from shared.rules.reference import money
from shared.settings import Settings
from store import Store
from store.schema import batches, counters
from support.documents import CORRECTED, CREDIT, OLD
from support.ledger import with_seller
from support.records import manifest, partial, result

TOKEN = "ledger-test-token"
BIG = 9 * 10**18


def fill(store: Store) -> None:
    """``b1`` and ``b2`` complete (March and April rows, USD and JPY), ``running`` not complete yet; the seller
    registered."""
    with_seller(store)
    store.apply(
        [manifest("b1"), manifest("b2"), manifest("running", work_items=2)],
        [
            result(
                "w1",
                partial("acct-1", product="CPU", day="2026-03-01", net=BIG, tax=1),
                partial("acct-1", product="GPU", day="2026-03-31", net=12345, tax=2469),
                partial("acct-3", day="2026-03-15", currency="JPY", net=1234, tax=123),
                partial("acct-2", day="2026-04-01", net=7, tax=0),
                batch_id="b1",
            ),
            result("w2", partial("acct-1", product="CPU", day="2026-03-02", net=50, tax=5), batch_id="b2"),
            result("r1", partial("acct-9", day="2026-03-02", net=1, tax=0), batch_id="running"),
        ],
    )


@pytest.fixture
def store(migrated_url: str) -> Iterator[Store]:
    with Store(migrated_url) as opened:
        fill(opened)
        yield opened


@pytest.fixture
def app(store: Store, settings_env: Settings) -> FastAPI:
    return create_app(settings_env, store)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as opened:
        yield opened


def with_token(app: FastAPI, client: TestClient) -> str:
    """Configure the console token; the CSRF value the API hands out."""
    app.state.settings = Settings(console_token=TOKEN)
    value = client.get("/api/csrf").json()["csrf"]
    assert client.cookies.get("billing_csrf") == value
    return str(value)


def ledger_state(store: Store) -> dict[str, Any]:
    """Everything a close or void changes: the documents (without issue times), the batches' void marks, the
    counters."""
    with store.engine.connect() as conn:
        voided = {r.batch_id: r.voided_at is not None for r in conn.execute(sa.select(batches))}
        numbers = {r.name: r.value for r in conn.execute(sa.select(counters))}
    docs = [{k: v for k, v in d.to_json_dict().items() if k != "issued_at"} for d in store.documents()]
    return {"documents": docs, "voided": voided, "counters": numbers}


def test_documents_periods_and_the_pending_difference(client: TestClient, store: Store) -> None:
    issued = store.close_period("2026-03")
    assert [(d.number, d.account_id, d.currency) for d in issued] == [(1, "acct-1", "USD"), (2, "acct-3", "JPY")]
    listed = client.get("/api/documents").json()
    assert listed == [d.to_json_dict() for d in store.documents()], "the JSON of billing documents list"
    assert client.get("/api/documents", params={"account": "acct-3"}).json() == listed[1:]
    assert client.get("/api/documents", params={"kind": "credit_note"}).json() == []
    assert client.get("/api/documents", params={"period": "2026-04"}).json() == []
    first = client.get("/api/documents", params={"limit": 1})
    assert first.json() == listed[:1] and first.headers["link"] == '</api/documents?limit=1&offset=1>; rel="next"'
    assert client.get("/api/documents/2").json() == listed[1]
    assert listed[0]["total"] == BIG + 12345 + 2469 + 1 + 50 + 5, "exact past 2^63"
    missing = client.get("/api/documents/99")
    assert missing.status_code == 404 and missing.json()["detail"] == "no document numbered 99"
    for bad in ("/api/documents/0", f"/api/documents/{2**64}", "/api/periods/2026-13", "/api/documents?kind=x"):
        assert client.get(bad).status_code == 422, bad
    shown = client.get("/api/documents/1/pdf")
    assert shown.headers["content-type"] == "application/pdf" and shown.content.startswith(b"%PDF-")

    # rows of the closed March arrive, and a batch goes: the difference is pending until the next close
    store.apply(
        [], [result("r2", partial("acct-9", product="GPU", day="2026-03-03", net=4, tax=1), batch_id="running")]
    )
    store.apply(
        [manifest("b3")],
        [result("w3", partial("acct-3", day="2026-03-20", currency="JPY", net=9, tax=1), batch_id="b3")],
    )
    periods = {p["period"]: p for p in client.get("/api/periods").json()}
    assert list(periods) == ["2026-04", "2026-03"]
    april, march = periods["2026-04"], periods["2026-03"]
    assert (april["state"], april["documents"], [d["kind"] for d in april["pending"]]) == ("open", 0, ["invoice"])
    assert (march["state"], march["documents"]) == ("closed", 2)
    assert march["pending"] == [d.to_json_dict() for d in store.pending("2026-03")]
    assert [(d["kind"], d["account_id"], d["total"], d["lines"][0]["batches"]) for d in march["pending"]] == [
        ("debit_note", "acct-3", 10, ["b3"]),
        ("invoice", "acct-9", 6, ["running"]),
    ]
    assert client.get("/api/periods/2026-03").json() == march
    assert client.get("/api/periods/2025-01").json() == {
        "period": "2025-01",
        "state": "open",
        "documents": 0,
        "pending": [],
    }
    for path, shown in (("/periods", "0.06 USD"), ("/periods/2026-03", "10 JPY"), ("/documents/1", "123.45 USD")):
        page = client.get(path)
        assert page.status_code == 200 and shown in page.text, path
        assert "<form" not in page.text, "read-only without a token"
    assert '<a href="/documents/2">INV-000002</a>' in client.get("/periods/2026-03").text, "the display number"
    march_row = re.search(r'<tr data-period="2026-03".*?</tr>', client.get("/periods").text, re.DOTALL)
    assert march_row is not None
    for pending in march["pending"]:  # each labelled by its own kind, not by the period's state
        label = f"1 {pending['kind'].replace('_', ' ')}(s): {money(pending['total'], pending['currency'])}"
        assert label in march_row.group(), (label, march_row.group())
    late_batch = client.get("/batches/b3").text
    b3 = store.batch("b3")
    assert b3 is not None and b3.seq is not None and b3.late == {"2026-03": 1}
    assert f'<dd id="seq">{b3.seq}</dd>' in late_batch
    assert '<span class="nowrap" data-period="2026-03">1 of 2026-03</span>' in late_batch
    assert '<dd id="late">none</dd>' in client.get("/batches/b1").text
    second = [d.to_json_dict() for d in store.close_period("2026-03")]
    assert [{k: v for k, v in d.items() if k in march["pending"][0]} for d in second] == march["pending"]
    assert client.get("/api/periods/2026-03").json()["pending"] == []


def test_close_and_void_need_the_token_and_csrf_and_are_refused_as_the_cli_refuses(
    app: FastAPI, client: TestClient, store: Store
) -> None:
    before = ledger_state(store)
    read_only = client.post("/api/periods/2026-03/close", data={"token": TOKEN, "csrf": "x"})
    assert read_only.status_code == 403 and "read-only" in read_only.json()["detail"]
    csrf = with_token(app, client)
    for form, words in (
        ({"token": TOKEN}, "CSRF"),
        ({"token": TOKEN, "csrf": "forged"}, "CSRF"),
        ({"token": "wrong", "csrf": csrf}, "wrong console token"),
        ({"csrf": csrf}, "wrong console token"),
    ):
        for path in ("/api/periods/2026-03/close", "/api/batches/b1/void", "/periods/2026-03/close"):
            refused = client.post(path, data=form)
            assert refused.status_code == 403 and words in refused.json()["detail"], (path, form)
    assert client.get("/api/periods/2026-03/close").status_code == 405, "never by GET"
    assert ledger_state(store) == before, "nothing changed"

    right = {"token": TOKEN, "csrf": csrf}
    for path, status, words in (
        ("/api/periods/2999-01/close", 400, "in the future"),
        (f"/api/periods/{datetime.now(UTC):%Y-%m}/close", 400, "has not ended"),
        ("/api/periods/2026-3/close", 400, "YYYY-MM"),
        ("/periods/2026-13/close", 400, "YYYY-MM"),
        ("/api/batches/nope/void", 400, "unknown"),
        ("/api/batches/running/void", 400, "not complete"),
    ):
        refused = client.post(path, data=right)
        detail = refused.json()["detail"]
        assert refused.status_code == status and words in detail and "\n" not in detail, (path, detail)
    needing = client.post("/api/periods/2026-03/close", data={**right, "require_customers": "true"})
    assert needing.status_code == 400 and "2 account(s) to document have no customer record" in needing.json()["detail"]
    assert ledger_state(store) == before, "refused: nothing changed"

    closed = client.post("/api/periods/2026-03/close", data=right).json()
    assert closed["message"] == "period 2026-03: issued 2 document(s), numbers 1 to 2"
    assert closed["issued"] == [d.to_json_dict() for d in store.documents()]
    again = client.post("/api/periods/2026-03/close", data=right).json()
    assert again["issued"] == [] and "nothing to issue" in again["message"]
    voided = client.post("/api/batches/b2/void", data=right)
    assert voided.status_code == 200 and voided.json()["voided"] is True
    after_void = ledger_state(store)
    twice = client.post("/api/batches/b2/void", data=right)
    assert twice.status_code == 409 and "voided before" in twice.json()["detail"]
    assert ledger_state(store) == after_void

    page = client.post("/periods/2026-03/close", data=right, follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/periods/2026-03?issued=1"
    assert [d.kind for d in store.documents()] == ["invoice", "invoice", "credit_note"], "b2's credit"
    shown = client.get("/periods/2026-03?issued=1").text
    assert "Closed: 1 document(s) issued." in shown and 'action="/periods/2026-03/close"' in shown
    document = client.get("/documents/1").text
    assert 'action="/batches/b1/void"' in document and 'href="/batches/b2"' in document
    assert 'action="/batches/b2/void"' not in document, "b2 is voided: no void button"
    assert 'action="/batches/b2/void"' not in client.get("/batches/b2").text


def _cli(settings: Settings, sql_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings.as_env(), "BILLING_SQL_URL": sql_url}
    done = subprocess.run(
        [sys.executable, "-m", "billing", *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done


async def _voided_mark(settings: Settings, batch_id: str) -> bool:
    async with Storage(settings) as storage:
        return bool(await storage.container(settings.inbox_container).get_blob_client(VOIDED.format(batch_id)).exists())


def test_a_close_and_a_void_through_the_api_change_the_ledger_as_the_cli_does(
    settings_env: Settings, tmp_path: Path
) -> None:
    by_api, by_cli = f"sqlite:///{tmp_path / 'api.db'}", f"sqlite:///{tmp_path / 'cli.db'}"
    with Store(by_api) as api_store, Store(by_cli) as cli_store:
        fill(api_store)
        fill(cli_store)
        app = create_app(settings_env, api_store)
        with TestClient(app) as client:
            form = {"token": TOKEN, "csrf": with_token(app, client)}
            assert client.post("/api/periods/2026-03/close", data=form).status_code == 200
            assert client.post("/api/batches/b2/void", data=form).status_code == 200
            assert asyncio.run(_voided_mark(settings_env, "b2")), "its id refused when submitted again"
            assert client.post("/api/periods/2026-03/close", data=form).status_code == 200
        for args in (("close", "--period", "2026-03"), ("void", "b2"), ("close", "--period", "2026-03")):
            _cli(settings_env, by_cli, *args)
        assert ledger_state(api_store) == ledger_state(cli_store)
        assert [d["kind"] for d in ledger_state(api_store)["documents"]] == ["invoice", "invoice", "credit_note"]
        listed = json.loads(_cli(settings_env, by_api, "documents", "list", "--format", "json").stdout)
        assert listed == TestClient(create_app(settings_env, api_store)).get("/api/documents").json()


@pytest.mark.parametrize("doc", [CREDIT, CORRECTED, OLD], ids=["credit-note", "corrected-invoice", "before-part-3"])
def test_the_api_passes_a_document_s_json_through_whole(doc: dict[str, Any]) -> None:
    """What the API's response model keeps of a document is its JSON, every Part 3 key included; a document issued
    before Part 3 keeps none it lacks (no nulls added)."""
    assert DocumentOut.model_validate(doc).model_dump(by_alias=True, exclude_unset=True) == doc
