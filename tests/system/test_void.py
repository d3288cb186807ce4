"""``billing void`` as a user runs it, on batches the real roles completed: sequence numbers in a batch's
status, a voided batch gone from every report, refusals on one line that change nothing, and its id
refused when submitted again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from billing.sample import generate
from shared.settings import Settings
from support.exact import billing, expected, read_raw, sorted_records, status
from support.roles import Roles


def attempt(*args: str) -> subprocess.CompletedProcess[str]:
    """``billing`` that may fail (``support.exact.billing`` asserts it does not)."""
    return subprocess.run(
        [sys.executable, "-m", "billing", *args], capture_output=True, text=True, env=os.environ, timeout=120
    )


def refused_on_one_line(done: subprocess.CompletedProcess[str], words: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_voided_batch_leaves_every_report_and_its_id_stays_taken(
    settings_env: Settings, roles: Roles, tmp_path: Path
) -> None:
    files = {"one": tmp_path / "one.csv", "two": tmp_path / "two.csv"}
    for seed, path in enumerate(files.values(), start=31):
        generate(300, path, seed=seed, reject_rate=0.05)
    billing("reference", "set", "--sample")
    for batch_id, path in files.items():
        billing("submit", str(path), "--batch-id", batch_id)
    refused_on_one_line(attempt("void", "one"), "unknown")  # submitted, not yet debatched
    for role in ("initiator", "processor", "controller"):
        roles.burst(role)
    one, two = status("one"), status("two")
    assert (one["state"], two["state"]) == ("complete", "complete")
    assert sorted([one["seq"], two["seq"]]) == [1, 2] and not one["voided"] and not two["voided"]

    done = billing("void", "one")
    assert "one" in done.stdout and "voided" in done.stdout

    after = status("one")
    assert after["voided"] is True and after["seq"] == one["seq"] and after["state"] == "complete"
    _, invoices, _ = expected(read_raw(files["two"]))
    shown = billing("report", "invoices", "--format", "json")
    assert sorted_records({k: v for k, v in r.items() if k != "batches"} for r in json.loads(shown.stdout)) == invoices
    assert "batch excluded (voided): one" in shown.stderr
    assert json.loads(billing("report", "aggregates", "--batch", "one", "--format", "json").stdout) == []

    refused_on_one_line(attempt("void", "one"), "voided before")
    refused_on_one_line(attempt("void", "nosuch"), "unknown")
    refused_on_one_line(attempt("submit", str(files["one"]), "--batch-id", "one"), "was voided")
    assert status("one") == after and status("two") == two
