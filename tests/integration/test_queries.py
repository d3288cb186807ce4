"""Queries across batches (``store.queries``) and ``billing report``'s filters, on SQLite and PostgreSQL.

Stores are filled with the store's own ``apply`` from ``support.records`` builders: for the cross-batch
invoices, with the reference model's aggregates of real sample batch files (rated row by row, nothing from
the pipeline), so the store's grouping is checked against independent figures.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from billing import reports
from billing.sample import generate
from shared.messages import PoisonNotice
from store import Filters, Store
from support.benchmarks import run_benchmark
from support.exact import expected, read_raw
from support.records import manifest, partial, result
from support.reports import BIG, HOSTILE, fill


def _load_reference_batch(store: Store, batch_id: str, path: Path, *, items: int, recorded: int | None = None) -> Any:
    """Record the reference model's aggregates of ``path`` as batch ``batch_id`` in ``items`` work items (only
    the first ``recorded`` of them: the batch stays processing); the model's invoices."""
    aggregates, invoices, _ = expected(read_raw(path))
    rows = [
        partial(
            r["account_id"],
            product=r["product"],
            day=r["billing_day"],
            currency=r["currency"],
            transactions=r["transactions"],
            quantity=r["quantity"],
            net=r["net"],
            tax=r["tax"],
        )
        for r in aggregates
    ]
    chunks = [rows[i::items] for i in range(items)]
    results = [result(f"{batch_id}:{i}", *chunk, batch_id=batch_id) for i, chunk in enumerate(chunks)]
    accepted = sum(r["transactions"] for r in aggregates)
    store.apply([manifest(batch_id, work_items=items, rows=accepted)], results[:recorded])
    return invoices


def _summed(*invoice_lists: list[dict[str, Any]]) -> dict[tuple[str, str, str], tuple[int, int, int]]:
    sums: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for invoices in invoice_lists:
        for i in invoices:
            totals = sums[(i["account_id"], i["billing_period"], i["currency"])]
            for n, name in enumerate(("net", "tax", "total")):
                totals[n] += i[name]
    return {key: (net, tax, total) for key, (net, tax, total) in sums.items()}


def test_period_invoices_sum_every_complete_batch_and_name_the_others(store: Store, tmp_path: Path) -> None:
    expected_invoices = []
    for seed in (1, 2, 3):
        path = tmp_path / f"march-{seed}.csv"
        generate(600, path, seed=seed, reject_rate=0.01)
        expected_invoices.append(_load_reference_batch(store, f"march-{seed}", path, items=3))
    failed, processing = tmp_path / "failed.csv", tmp_path / "processing.csv"
    generate(300, failed, seed=7)
    generate(300, processing, seed=8)
    _load_reference_batch(store, "failed", failed, items=2, recorded=1)
    store.apply([], [], [PoisonNotice("failed", "failed:1", "max_dequeue_count")])
    _load_reference_batch(store, "slow", processing, items=2, recorded=1)

    found = store.invoices(Filters(period="2026-03"))

    got = {(r["account_id"], r["billing_period"], r["currency"]): (r["net"], r["tax"], r["total"]) for r in found.rows}
    assert got == _summed(*expected_invoices)
    assert all(type(r["total"]) is int for r in found.rows)
    assert [(b.batch_id, b.state) for b in found.batches] == [(f"march-{s}", "complete") for s in (1, 2, 3)]
    assert [(b.batch_id, b.state) for b in found.excluded] == [("failed", "failed"), ("slow", "processing")]
    assert {batch for row in found.rows for batch in row["batches"]} == {"march-1", "march-2", "march-3"}

    per_batch = store.invoices(Filters(batches=("march-2",)))
    assert {
        (r["account_id"], r["billing_period"], r["currency"]): (r["net"], r["tax"], r["total"]) for r in per_batch.rows
    } == _summed(expected_invoices[1])
    named = store.invoices(Filters(batches=("failed", "slow")))  # a failed batch named counts what it did
    assert [(b.batch_id, b.state) for b in named.batches] == [("failed", "failed")] and named.rows
    assert [(b.batch_id, b.state) for b in named.excluded] == [("slow", "processing")]  # nothing written yet
    assert store.invoices(Filters(period="2026-04")).rows == []


def test_filters_sums_and_order(store: Store) -> None:
    fill(store)

    march = store.aggregates(Filters(accounts=("acct-1",), period="2026-03"))
    assert [(r["product"], r["billing_day"], r["net"], str(r["quantity"]), r["batches"]) for r in march.rows] == [
        ("CPU", date(2026, 3, 1), 2 * BIG, "3.750000", ["b1", "b2"]),
        ("GPU", date(2026, 3, 31), 50, "1.500000", ["b1"]),
    ]
    assert [b.batch_id for b in march.excluded] == ["b3"]
    ranged = store.totals(["account_id"], Filters(start=date(2026, 3, 31), end=date(2026, 4, 1)))
    assert [(r["account_id"], r["net"]) for r in ranged.rows] == [("acct-1", 50), ("acct-2", 7)]
    assert [b.batch_id for b in ranged.excluded] == ["b3"]  # still running: left out, whatever its days
    assert [r["currency"] for r in store.totals([], Filters(currencies=("JPY",))).rows] == ["JPY"]
    gpu = store.totals(["product"], Filters(products=("GPU",)))
    assert [(r["product"], r["total"]) for r in gpu.rows] == [("GPU", 55)]

    daily = store.daily()
    assert [(r["billing_day"].isoformat(), r["currency"], r["net"]) for r in daily.rows] == [
        ("2026-03-01", "USD", 2 * BIG),
        ("2026-03-02", "USD", 1),  # batch evil's; b3's 99 are not counted: it is not complete
        ("2026-03-15", "JPY", 1234),
        ("2026-03-31", "USD", 50),
        ("2026-04-01", "USD", 7),
    ]
    top = store.top("account_id", limit=1)
    assert [(r["account_id"], r["currency"], r["net"]) for r in top.rows] == [
        ("acct-3", "JPY", 1234),
        ("acct-1", "USD", 2 * BIG + 50),
    ]
    paged = [store.aggregates(limit=2, offset=offset).rows for offset in (0, 2, 4, 6)]
    assert [len(page) for page in paged] == [2, 2, 1, 0]
    assert [r for page in paged for r in page] == store.aggregates().rows


def test_invalid_period_is_refused() -> None:
    with pytest.raises(ValueError, match="YYYY-MM"):
        Filters(period="2026-3")
    with pytest.raises(ValueError, match="reversed: from 2026-03-31 is after to 2026-03-01"):
        Filters(start=date(2026, 3, 31), end=date(2026, 3, 1))
    assert Filters(start=date(2026, 3, 1), end=date(2026, 3, 1)).days == (date(2026, 3, 1), date(2026, 3, 1))


def test_the_report_indexes_exist(store: Store) -> None:
    names = {index["name"] for index in sa.inspect(store.engine).get_indexes("aggregates")}
    assert {"ix_aggregates_account_day", "ix_aggregates_product_day", "ix_aggregates_day"} <= names


def _billing(sql_url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"BILLING_SQL_URL": sql_url, "BILLING_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "billing", *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_billing_report_filters_and_html(store: Store, migrated_url: str, tmp_path: Path) -> None:
    fill(store)

    done = _billing(
        migrated_url, tmp_path, "report", "invoices", "--period", "2026-03", "--account", "acct-1", "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        {
            "account_id": "acct-1",
            "billing_period": "2026-03",
            "currency": "USD",
            "net": 2 * BIG + 50,
            "tax": 8,
            "total": 2 * BIG + 58,
            "batches": "b1 b2",
        }
    ]
    assert "batches included: b1, b2" in done.stderr and "batch excluded (processing): b3" in done.stderr

    out = tmp_path / "report.html"
    done = _billing(
        migrated_url,
        tmp_path,
        "report",
        "aggregates",
        "--from",
        "2026-03-01",
        "--to",
        "2026-03-31",
        "--product",
        "CPU",
        "--format",
        "html",
        "--output",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    assert "180,000,000,000,000,000.00 USD" in html and "1,234 JPY" in html and "<svg" in html
    assert set(re.findall(r"https?://[^/\"]*", html)) <= {"http://www.w3.org"}, "nothing to fetch: namespaces only"
    assert "<script" not in html

    rejects = tmp_path / "rejects.html"
    assert (
        _billing(
            migrated_url, tmp_path, "report", "rejects", "--batch", "evil", "--format", "html", "--output", str(rejects)
        ).returncode
        == 0
    )
    assert "&lt;script&gt;document.title" in rejects.read_text() and "<script" not in rejects.read_text()
    assert "<img" not in rejects.read_text() and list(reports.rejects(store, "evil")["raw"]) == [HOSTILE]

    refused = _billing(migrated_url, tmp_path, "report", "invoices", "--period", "March")
    assert refused.returncode == 2 and "YYYY-MM" in refused.stderr
    reversed_range = _billing(
        migrated_url, tmp_path, "report", "aggregates", "--from", "2026-03-31", "--to", "2026-03-01"
    )
    assert reversed_range.returncode == 2 and reversed_range.stdout == ""
    assert (
        "from 2026-03-31 is after to 2026-03-01" in reversed_range.stderr and "Traceback" not in reversed_range.stderr
    )


@pytest.mark.postgres
def test_query_benchmark_runs_at_a_small_size(postgres_url: str, tmp_path: Path) -> None:
    """``benchmarks.queries`` end to end at 20,000 rows (the 10,000,000-row figure is measured by hand)."""
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    name = f"bench_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        url = sa.make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
        options = ["--sql-url", url, "--rows", "20000", "--accounts", "50", "--repeat", "5"]
        measured = run_benchmark("queries", *options, output=tmp_path / "bench.json")
        assert measured["rows"] == 20000 and measured["median_ms"] > 0
        assert measured["invoice_rows_per_query"] >= 1  # each account has March rows in one or two currencies
        with Store(url) as store:
            march = store.invoices(Filters(accounts=("acct-000000",), period="2026-03"))
            assert all(b.state == "complete" for b in march.batches) and len(march.batches) == 31
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
