"""`billing bench` end to end at a CI-sized scale: a fresh local stack per run, the optimised and the
naive design on the same batch, the listener measurements; the JSON and the chart it writes must
hold figures that agree with each other (numbers are measured, so only their relations are checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_bench_measures_both_designs_and_reconciles(tmp_path: Path) -> None:
    output = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "billing",
            "bench",
            "--rows",
            "4000",
            "--compare-rows",
            "400",
            "--idle-seconds",
            "3",
            "--data-dir",
            str(tmp_path / "data"),
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    assert "naive design makes" in done.stdout + done.stderr  # rich prints to stderr when not a terminal
    assert output.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    report = json.loads(output.read_text())
    main, optimised, naive = report["main"], report["optimised"], report["naive"]
    assert main["rows"] == 4000 and optimised["rows"] == naive["rows"] == 400
    assert optimised["accepted"] == naive["accepted"] > 0, "the same batch through both designs"
    assert naive["work_items"] == naive["rows"], "naive: one row per message"
    for run in (main, optimised, naive):
        assert run["transactions_per_second"] > 0 and run["latency_seconds"] > 0
        assert run["storage_requests"] == sum(run["requests_by_kind"].values())
        # What the batch's status counted for it is part of what the roles made from submission to idle.
        assert 0 < run["attributed_requests_per_1000"] <= run["work_requests_per_1000"] <= run["requests_per_1000"]
        assert set(run["peak_rss_mib"]) == {"initiator", "processor", "controller", "rating worker"}
    # One message per transaction, received one at a time and deleted: at least 3 requests each.
    assert naive["attributed_requests_per_1000"] >= 3000
    assert naive["work_requests_per_1000"] > 20 * optimised["work_requests_per_1000"]
    idle = report["listener"]["idle_requests_per_hour"]
    assert (
        idle["push (local bus)"] <= idle["pull (back-off to 10 s)"] < idle["naive 1 s polling"]
    )  # a short window: pull may not poll
    costs = report["monthly_cost"]
    naive_cost, optimised_cost = (
        costs[design]["monthly_storage_cost"]["GPv2 today"] for design in ("naive", "optimised")
    )
    assert naive_cost > 100 * optimised_cost > 0
