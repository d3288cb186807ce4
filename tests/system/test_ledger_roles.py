"""The ledger through the real roles: three batch files that share transaction ids, rows in two periods,
closes, a batch with late rows whose controller is SIGKILLed while a close runs, a void and a re-submission;
every document equal to the reference model's, late rows as the model counts them, and for every account,
period, currency and product the documents' lines equal to a fresh computation after the last closes."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from benchmarks import reference_model as model
from benchmarks.recovery import wait_complete
from billing.cli import cli
from billing.sample import sample_price_book_bytes, sample_tax_table_bytes
from shared.settings import Settings
from store import Store
from support.exact import read_raw
from support.ledger import SELLER_ARGS, as_issued
from support.roles import Roles
from support.waiting import wait_until

FIELDS = ("transaction_id", "account_id", "timestamp", "product", "quantity", "region")
PRODUCTS = ("compute.vcpu-hour", "storage.gb-month", "transfer.jp-gb", "api.request")  # USD, EUR, JPY, GBP
PERIODS = ("2026-02", "2026-03")
VISIBILITY = 3  # seconds: what the killed controller held is seen again soon (roles poll: pull mode)


def write_batch(path: Path, ids: list[str], seed: int) -> Path:
    """One row per id, dated from late February to early March 2026, some rejected."""
    pick = random.Random(seed)
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, FIELDS)
        writer.writeheader()
        for number, transaction_id in enumerate(ids):
            day, hour = pick.choice([("02-26", 9), ("02-28", 23), ("03-01", 0), ("03-09", 14)])
            writer.writerow(
                {
                    "transaction_id": transaction_id,
                    "account_id": f"acct-{pick.randrange(4)}",
                    "timestamp": f"2026-{day}T{hour:02d}:{pick.randrange(60):02d}:00Z",
                    "product": pick.choice(PRODUCTS),
                    "quantity": "-1" if number % 17 == 5 else f"{pick.randrange(1, 5000) / 100}",
                    "region": pick.choice(["", "DE", "JP"]),
                }
            )
    return path


def billing(*args: str, code: int = 0) -> Result:
    """A ``billing`` command in this process (the roles are processes of their own); its exit code checked."""
    done = CliRunner().invoke(cli, list(args))
    assert done.exit_code == code, done.output
    return done


def documents() -> list[dict[str, Any]]:
    return list(json.loads(billing("documents", "list", "--format", "json").output))


def status(batch_id: str) -> dict[str, Any]:
    return dict(json.loads(billing("status", batch_id, "--json").output))


def line_sums(docs: list[dict[str, Any]], period: str) -> dict[tuple[str, str, str], list[Decimal]]:
    sums: dict[tuple[str, str, str], list[Decimal]] = defaultdict(lambda: [Decimal(0)] * 5)
    for doc in (d for d in docs if d["period"] == period):
        for line in doc["lines"]:
            values = (line["transactions"], Decimal(line["quantity"]), line["net"], line["tax"], line["total"])
            sums[doc["account_id"], doc["currency"], line["product"]] = [
                a + b for a, b in zip(sums[doc["account_id"], doc["currency"], line["product"]], values, strict=True)
            ]
    return {key: s for key, s in sums.items() if any(s)}


def fresh(ledger: model.Ledger, period: str) -> dict[tuple[str, str, str], list[Decimal]]:
    """The period's counted rows of the complete, not voided batches, summed afresh from the model's rows."""
    sums: dict[tuple[str, str, str], list[Decimal]] = defaultdict(lambda: [Decimal(0)] * 5)
    for batch_id, rows in ledger.rated.items():
        for row, rated in rows if batch_id not in ledger.voided else ():
            if rated.billing_day[:7] == period:
                values = (1, row.quantity, rated.net, rated.tax, rated.total)
                key = (row.account_id, rated.currency, row.product)
                sums[key] = [a + b for a, b in zip(sums[key], values, strict=True)]
    return dict(sums)


def batch_files(folder: Path) -> dict[str, Path]:
    """Three files: ``two`` shares ids with ``one``, ``three`` with ``two``."""
    ids = {
        "one": [f"a{i}" for i in range(150)] + [f"s{i}" for i in range(50)],
        "two": [f"s{i}" for i in range(25, 75)] + [f"b{i}" for i in range(100)],
        "three": [f"s{i}" for i in range(60, 80)] + [f"b{i}" for i in range(50, 70)] + [f"c{i}" for i in range(300)],
    }
    return {
        name: write_batch(folder / f"{name}.csv", of_file, seed) for seed, (name, of_file) in enumerate(ids.items())
    }


def submit_and_close(files: dict[str, Path], ledger: model.Ledger) -> list[dict[str, Any]]:
    """Batches ``one`` and ``two`` completed, both periods closed: the documents, as the model's."""
    for batch_id in ("one", "two"):
        billing("submit", str(files[batch_id]), "--batch-id", batch_id, "--wait", "--timeout", "120")
        fates = ledger.batch(batch_id, read_raw(files[batch_id]))
        assert status(batch_id)["rejected"] == sum(isinstance(fate, str) for fate in fates)
    assert status("two")["rejected"] > 25, "the ids two shares with one are duplicates"
    billing("seller", "set", *SELLER_ARGS)
    for period in PERIODS:
        billing("close", "--period", period)
        ledger.close(period)
    issued = documents()
    assert model.as_model(issued) == ledger.documents and issued
    return issued


def late_batch_killed(settings: Settings, roles: Roles, path: Path, ledger: model.Ledger) -> None:
    """Batch ``three``, rows of both closed periods, its controller SIGKILLed while it runs and March is being
    closed; the model told in the order the store took them (a close takes the batches complete then)."""
    issued_before = len(documents())
    billing("submit", str(path), "--batch-id", "three")
    closing = subprocess.Popen([sys.executable, "-m", "billing", "close", "--period", "2026-03"], env=os.environ)
    with Store(settings.sql_url_value) as store:
        assert wait_until(lambda: store.batch("three") is not None, 60), "the controller took it on"
    roles.kill("controller")
    assert closing.wait(timeout=120) == 0
    roles.restart("controller")
    wait_complete(settings, "three", timeout=120)
    if any("three" in line["batches"] for d in documents()[issued_before:] for line in d["lines"]):
        ledger.batch("three", read_raw(path))  # complete before the close took what is billed
        ledger.close("2026-03")
    else:
        ledger.close("2026-03")
        ledger.batch("three", read_raw(path))
    assert ledger.late["three"]["2026-02"] > 0
    assert status("three")["late"] == ledger.late["three"]
    late_text = ",".join(f"{period}:{rows}" for period, rows in sorted(ledger.late["three"].items()))
    assert f"late={late_text}" in billing("status", "three").output
    assert model.as_model(documents()) == ledger.documents


def test_overlapping_batches_closes_a_killed_controller_a_void_and_a_resubmission_are_exact(
    settings_env: Settings, roles: Roles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    knobs = {
        "VISIBILITY_TIMEOUT": VISIBILITY,
        "WORK_ITEM_SIZE": 100,
        "MAX_IDLE_INTERVAL": 0.5,
        "TRIGGER_BACKEND": "none",
    }
    for name, value in knobs.items():
        monkeypatch.setenv(f"BILLING_{name}", str(value))
    settings = Settings()
    files = batch_files(tmp_path)
    ledger = model.Ledger(
        model.read_prices(sample_price_book_bytes().decode()), model.read_rates(sample_tax_table_bytes().decode())
    )
    billing("reference", "set", "--sample")
    with roles.running(settings):
        first = submit_and_close(files, ledger)
        late_batch_killed(settings, roles, files["three"], ledger)
        billing("void", "two")
        ledger.void("two")
        assert "voided" in billing("submit", str(files["two"]), "--batch-id", "two", code=2).output
        billing("submit", str(files["two"]), "--batch-id", "two-again", "--wait", "--timeout", "120")
        ledger.batch("two-again", read_raw(files["two"]))
    for period in PERIODS:
        billing("close", "--period", period)
        ledger.close(period)
    final = documents()
    assert as_issued(final[: len(first)]) == as_issued(first), "issued documents never change"
    assert model.as_model(final) == ledger.documents
    assert [d["number"] for d in final] == list(range(1, len(final) + 1))
    for period in PERIODS:
        assert line_sums(final, period) == fresh(ledger, period)
    assert status("two-again")["late"] == ledger.late["two-again"] and ledger.late["two-again"]
