"""Exact checks of pipeline output: the ``billing`` command (in this process, or as a process of its own), batch
files read with nothing from ``shared``, the expected aggregates, invoices and rejects from the independent
``reference_model``, and a batch's state and reports to compare them with (read in this process by the store
code behind ``billing status`` and ``billing report``)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from click.testing import CliRunner

from benchmarks import reference_model as model
from billing import reports
from billing.cli import cli
from billing.sample import sample_price_book_bytes, sample_tax_table_bytes
from shared.settings import Settings
from store import Store


def billing(*args: str) -> subprocess.CompletedProcess[str]:
    """``billing ARGS...`` run in this process, which has loaded what the command imports (a process of its own
    would load it all again), on the settings of the environment; it must succeed. The roles it talks to are
    processes of their own; what only a process of its own shows (its exit status on an error, telemetry set up
    once per process) is :func:`billing_process`'s. It runs on a thread of its own: this one may be running an
    event loop (an async test's, the browser's)."""
    with ThreadPoolExecutor(1) as thread:
        done = thread.submit(CliRunner().invoke, cli, list(args)).result()
    assert done.exit_code == 0, f"{done.output}{done.exception!r}"
    return subprocess.CompletedProcess(["billing", *args], done.exit_code, done.stdout, done.stderr)


def billing_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``billing ARGS...`` as a process of its own; it must succeed."""
    result = subprocess.run([sys.executable, "-m", "billing", *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result


def read_raw(path: Path) -> list[dict[str, Any]]:
    """The file's rows as field -> text, read with nothing from ``shared``."""
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    if path.suffix == ".jsonl":
        return [json.loads(line, parse_float=str, parse_int=str) for line in path.read_text().splitlines() if line]
    return pq.read_table(path).to_pylist()


def expected(
    rows: list[dict[str, Any]], taken: set[str] | frozenset[str] = frozenset()
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Aggregates, invoices and rejects as the report JSON should show them (``taken``: ids counted in earlier
    batches of the ledger)."""
    prices = model.read_prices(sample_price_book_bytes().decode())
    rates = model.read_rates(sample_tax_table_bytes().decode())
    aggregates: dict[tuple[str, ...], dict[str, Any]] = {}
    invoices: dict[tuple[str, ...], dict[str, int]] = defaultdict(lambda: {"net": 0, "tax": 0, "total": 0})
    rejects = []
    for number, result in enumerate(model.check_batch(rows, prices, rates, taken), start=1):
        if isinstance(result, str):
            rejects.append({"row": number, "reason": result})
            continue
        rated = model.rate_row(result, prices, rates)
        key = (result.account_id, result.product, rated.billing_day, rated.currency)
        agg = aggregates.setdefault(key, {"transactions": 0, "quantity": Decimal(0), "net": 0, "tax": 0, "total": 0})
        agg["transactions"] += 1
        agg["quantity"] += result.quantity
        invoice = invoices[(result.account_id, rated.billing_day[:7], rated.currency)]
        for money in ("net", "tax", "total"):
            agg[money] += getattr(rated, money)
            invoice[money] += getattr(rated, money)
    names = ("account_id", "product", "billing_day", "currency")
    return (
        sorted_records({**dict(zip(names, k, strict=True)), **v} for k, v in aggregates.items()),
        sorted_records(
            {"account_id": k[0], "billing_period": k[1], "currency": k[2], **v} for k, v in invoices.items()
        ),
        rejects,
    )


KEY_FIELDS = ("account_id", "product", "billing_day", "billing_period", "currency")


def sorted_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Aggregate or invoice records in one order, by their key fields (account, product, day or
    period, currency): the order :func:`expected` returns, so a report compares with ``==``."""
    return sorted(records, key=lambda record: tuple(str(v) for k, v in record.items() if k in KEY_FIELDS))


def _reading() -> Store:
    """The store the roles write, opened to read: they migrated it, so no schema check per look."""
    return Store(Settings().sql_url_value, migrate=False)


def report(kind: str, batch_id: str) -> list[dict[str, Any]]:
    """What ``billing report KIND --batch ID --format json`` prints."""
    with _reading() as store:
        frame = getattr(reports, kind)(store, batch_id)
    records: list[dict[str, Any]] = json.loads(reports.write_report(frame, "json") or "")
    return records


def status(batch_id: str) -> dict[str, Any]:
    """What ``billing status ID --json`` prints."""
    with _reading() as store:
        found = store.batch(batch_id)
    assert found is not None, f"batch {batch_id} is unknown"
    printed: dict[str, Any] = json.loads(json.dumps(found.to_json_dict()))
    return printed


def assert_batch_exact(batch_id: str, path: Path, taken: set[str] | frozenset[str] = frozenset()) -> None:
    """Batch ``batch_id`` (submitted from ``path``) is complete, nothing poisoned, every row counted once,
    and its aggregates and invoices equal the reference model's (``taken``: ids counted in earlier batches)."""
    aggregates, invoices, rejects = expected(read_raw(path), taken)
    state = status(batch_id)
    assert state["state"] == "complete", state
    assert state["poisoned_items"] == 0
    assert (state["accepted"], state["rejected"]) == (sum(a["transactions"] for a in aggregates), len(rejects))
    assert state["completed_items"] == state["work_items"]
    got = report("aggregates", batch_id)
    for record in got:
        record["quantity"] = Decimal(record["quantity"])
    assert sorted_records(got) == aggregates
    assert sorted_records(report("invoices", batch_id)) == invoices
