"""The HTTP API and the console's pages of ``billing serve`` (``billing.console.app``), in process over ASGI, on
real SQLite and PostgreSQL stores filled by ``support.reports`` and the session's Azurite for queues and poison.

Schemathesis generates requests from the app's own OpenAPI document: none may answer 500.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

import pyarrow.parquet as pq
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from billing.console.app import LOOPBACK_HOSTS, create_app
from shared.settings import Settings
from store import Store
from support.reports import BIG, HOSTILE, fill


@pytest.fixture
def app(migrated_url: str, settings_env: Settings) -> Iterator[FastAPI]:
    with Store(migrated_url) as store:
        fill(store)
        yield create_app(settings_env, store)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as opened:
        yield opened


@pytest.fixture
def api_schema(app: FastAPI) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_generated_request_gets_a_server_error(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[not_a_server_error])


def test_invoices_across_batches_with_paging(client: TestClient) -> None:
    first = client.get("/api/invoices", params={"period": "2026-03", "limit": 2}).json()
    assert [(r["account_id"], r["currency"], r["total"]) for r in first["rows"]] == [
        ("acct-1", "USD", 2 * BIG + 58),
        ("acct-3", "JPY", 1357),
    ]
    assert first["rows"][0]["batches"] == ["b1", "b2"] and first["next_offset"] == 2
    assert first["excluded"] == [{"batch_id": "b3", "state": "processing"}]
    rest = client.get("/api/invoices", params={"period": "2026-03", "limit": 2, "offset": 2}).json()
    assert [(r["account_id"], r["total"]) for r in rest["rows"]] == [("acct-9", 1)] and rest["next_offset"] is None
    named = client.get("/api/invoices", params=[("batch", "b3"), ("account", "acct-1")]).json()
    assert named["rows"] == [] and named["batches"] == []  # still running: its aggregates come when it completes
    assert named["excluded"] == [{"batch_id": "b3", "state": "processing"}]
    assert client.get("/api/invoices", params={"period": "2026-13"}).status_code == 422
    assert client.get("/api/aggregates", params={"account": "<script>"}).status_code == 422
    backwards = client.get("/api/aggregates", params={"from": "2026-03-31", "to": "2026-03-01"})
    assert backwards.status_code == 422 and backwards.json()["detail"] == (
        "the range is reversed: from 2026-03-31 is after to 2026-03-01"
    )


def test_batches_and_one_batch(client: TestClient) -> None:
    listed = client.get("/api/batches").json()
    assert {b["batch_id"]: (b["state"], b["progress"]) for b in listed["items"]} == {
        "b1": ("complete", 1.0),
        "b2": ("complete", 1.0),
        "b3": ("processing", 0.5),
        "evil": ("complete", 1.0),
    }
    assert all(b["accepted_at"] for b in listed["items"])
    assert [b["batch_id"] for b in client.get("/api/batches", params={"state": "processing"}).json()["items"]] == ["b3"]

    evil = client.get("/api/batches/evil").json()
    assert evil["rejects_by_reason"] == {"invalid_account_id": 1}
    assert [(t["currency"], t["net"], t["total"]) for t in evil["totals"]] == [("USD", 1, 1)]
    assert client.get("/api/batches/evil/rejects").json()["items"] == [
        {"row": 2, "reason": "invalid_account_id", "raw": HOSTILE}
    ]
    assert client.get("/api/batches/nope").status_code == 404


def test_downloads_stream_exact_money(client: TestClient) -> None:
    text = client.get("/api/downloads/invoices.csv", params={"period": "2026-03"}).text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert (rows[0]["account_id"], rows[0]["total"], rows[0]["batches"]) == ("acct-1", str(2 * BIG + 58), "b1 b2")

    response = client.get("/api/downloads/aggregates.parquet", params={"account": "acct-1"})
    table = pq.read_table(io.BytesIO(response.content))
    assert str(table.schema.field("net").type) == "decimal128(38, 0)"
    assert [int(v) for v in table["net"].to_pylist()] == [2 * BIG, 50]

    rejects = client.get("/api/downloads/rejects.csv", params={"batch": "evil"}).text
    assert HOSTILE.replace('"', '""') in rejects  # CSV-quoted, whole
    assert client.get("/api/downloads/rejects.csv").status_code == 422


def test_roles_queues_cost_and_no_secret(client: TestClient, settings_env: Settings) -> None:
    queues = client.get("/api/queues").json()["queues"]
    assert [q["queue"] for q in queues] == settings_env.all_queues
    cost = client.get("/api/cost", params={"daily_transactions": 1000}).json()
    assert cost["measured"]["batches"] == 3 and cost["projection"]["workload"]["daily_transactions"] == 1000
    assert client.get("/api/roles").json() == {"roles": []}
    secret = settings_env.storage_connection_string
    assert secret is not None
    key = secret.get_secret_value().split("AccountKey=")[1].split(";")[0]
    for path in ("/api/queues", "/api/poison", "/api/roles", "/api/cost", "/openapi.json", "/roles", "/poison"):
        assert key not in client.get(path).text, path


def test_pages_escape_batch_data_and_format_money(client: TestClient) -> None:
    page = client.get("/batches/evil")
    assert page.status_code == 200 and "Content-Security-Policy" in page.headers
    assert "<script>document" not in page.text and "<img src=x" not in page.text
    assert "&lt;script&gt;document.title=" in page.text and "&lt;img src=x onerror=" in page.text
    invoices = client.get("/invoices", params={"period": "2026-03"}).text
    assert "180,000,000,000,000,000.58 USD" in invoices and "1,357 JPY" in invoices
    assert "b3 (processing)" in invoices  # excluded, and named
    for path in ("/batches", "/batches/b1", "/invoices?batch=b1", "/accounts/acct-1", "/roles", "/poison"):
        assert client.get(path).status_code == 200, path


def test_poison_actions_need_a_configured_token_and_the_csrf_value(
    app: FastAPI, client: TestClient, settings_env: Settings
) -> None:
    form = {"queue": settings_env.all_queues[0], "entry_id": "x", "token": "t", "csrf": "c"}
    read_only = client.post("/poison/replay", data=form)
    assert read_only.status_code == 403 and "read-only" in read_only.text

    app.state.settings = Settings(console_token="right-token")
    page = client.get("/poison")
    csrf = page.cookies.get("billing_csrf") or client.cookies.get("billing_csrf")
    assert csrf
    assert client.post("/poison/purge", data={**form, "token": "right-token"}).status_code == 403  # csrf "c"
    wrong = client.post("/poison/purge", data={**form, "token": "wrong", "csrf": csrf})
    assert wrong.status_code == 403 and "wrong console token" in wrong.text
    done = client.post("/poison/purge", data={**form, "token": "right-token", "csrf": csrf}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/poison?done=purged+0"
    assert client.get("/poison/purge").status_code == 405  # never by GET


def test_a_loopback_server_answers_loopback_hosts_only(migrated_url: str, settings_env: Settings) -> None:
    """What ``billing serve`` builds on 127.0.0.1: a page elsewhere that rebinds its name to 127.0.0.1 is refused."""
    with Store(migrated_url) as store:
        app = create_app(settings_env, store, allowed_hosts=LOOPBACK_HOSTS)
        assert TestClient(app, base_url="http://127.0.0.1:8080").get("/api/batches").status_code == 200
        assert TestClient(app, base_url="http://localhost:8080").get("/batches").status_code == 200
        assert TestClient(app, base_url="http://attacker.example").get("/api/batches").status_code == 400
