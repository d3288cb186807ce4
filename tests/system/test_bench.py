"""`billing bench` end to end at a CI-sized scale: a fresh local stack per run, the optimised and the
naive design on the same batch, the listener measurements, the large batch as each file on each
store; `billing bench --scale-out` with each processor in a CPU cgroup of its own. The JSON and the
charts they write must hold figures that agree with each other (numbers are measured, so only their
relations are checked). The roles back off to a 3 s idle poll rather than 10 s (``QUICK_IDLE``): each run
waits for them to be idle before and after its batch, and they get there sooner; pull's back-off is still
three times slower than the naive 1 s polling it is compared with. The idle window is long enough that a
processor stalled for seconds on a busy machine (the same stall for all three modes) still polls more often
naively than with the back-off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

QUICK_IDLE = {"BILLING_MAX_IDLE_INTERVAL": "3"}
#: Seconds of idle processors measured: five of pull's 3 s polls, fifteen naive ones.
IDLE_WINDOW = 15
#: Cores per capped processor in the scale-out run: capped all the same, but it starts in seconds, not a minute.
CAP = 0.5


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
            str(IDLE_WINDOW),
            "--repeat",
            "1",
            "--data-dir",
            str(tmp_path / "data"),
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **QUICK_IDLE},
    )
    assert done.returncode == 0, done.stderr
    assert "naive design makes" in done.stdout + done.stderr  # rich prints to stderr when not a terminal
    assert output.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    report = json.loads(output.read_text())
    main, optimised, naive = report["main"], report["optimised"], report["naive"]
    assert main["rows"] == 4000 and optimised["rows"] == naive["rows"] == 400
    # The headline is the user's default: a messy file on a persisted Azurite; the others billed the same.
    assert (main["file"], main["store"]) == ("messy", "disk")
    variants = report["variants"]
    assert sorted((v["file"], v["store"]) for v in variants) == [
        ("clean", "disk"),
        ("clean", "memory"),
        ("messy", "memory"),
    ]
    assert {v["aggregates_sha256"] for v in variants} == {main["aggregates_sha256"]} and main["totals"]
    assert all(v["accepted"] == main["accepted"] and v["rejected"] == main["rejected"] for v in variants)
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
    )  # push may make no request in the window
    costs = report["monthly_cost"]
    naive_cost, optimised_cost = (
        costs[design]["monthly_storage_cost"]["GPv2 today"] for design in ("naive", "optimised")
    )
    assert naive_cost > 100 * optimised_cost > 0


def _cgroups_unavailable() -> str | None:
    """Why this machine cannot cap a processor's CPU (None when it can)."""
    from benchmarks.scaleout import CgroupUnavailable, cpu_hierarchy

    if os.geteuid() != 0:
        return "--scale-out makes CPU cgroups, which needs root (CI runs as root)"
    try:
        cpu_hierarchy()
    except CgroupUnavailable as exc:
        return f"no cgroup cpu controller here: {exc}"
    return None


def test_scale_out_spreads_a_batch_over_capped_processors(tmp_path: Path) -> None:
    """`billing bench --scale-out` at a tiny size: every processor in a CPU cgroup of its own, the curve,
    the speed-ups, the runs billed alike, and the work items each processor took adding up to the
    batch's; the groups are gone afterwards."""
    if reason := _cgroups_unavailable():
        pytest.skip(reason)
    from benchmarks.scaleout import cpu_hierarchy

    groups = cpu_hierarchy().directory
    before = set(groups.glob("billing-scaleout-*"))
    output = tmp_path / "bench.json"
    env = {**os.environ, **QUICK_IDLE, "BILLING_WORK_ITEM_SIZE": "5000"}  # 20,000 rows in several work items
    command = ["bench", "--scale-out", "--rows", "20000", "--processors", "1,2", "--cap", str(CAP)]
    command += ["--output", str(output)]
    done = subprocess.run(
        [sys.executable, "-m", "billing", *command, "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "Scale-out" in done.stdout + done.stderr
    assert set(groups.glob("billing-scaleout-*")) == before, "the cgroups are removed"
    report = json.loads(output.with_name("bench-scaleout.json").read_text())
    assert output.with_name("bench-scaleout.png").read_bytes().startswith(b"\x89PNG")
    assert report["cpu_cap"] == CAP and report["cgroup"].startswith(("v1 ", "v2 "))
    assert set(report["curve"]) == set(report["speedups"]) == {"1", "2"}
    assert all(seconds > 0 for seconds in report["curve"].values()) and report["speedups"]["1"] == 1.0
    assert report["exact"] and report["totals"]
    assert [run["processors"] for run in report["runs"]] == [1, 2]
    for run, throttled in zip(report["runs"], report["throttled_seconds"], strict=True):
        assert run["rows"] == 20_000 and run["accepted"] + run["rejected"] == 20_000
        assert run["work_items"] >= 1 and run["cpu_cap"] == CAP
        assert len(run["items_by_processor"]) == len(throttled) == run["processors"]
        assert sum(run["items_by_processor"]) == run["work_items"], "every work item taken once, by one processor"
        assert run["aggregates_sha256"] == report["runs"][0]["aggregates_sha256"]
    assert report["items_by_processor"]["2"] == report["runs"][1]["items_by_processor"]


def test_scale_out_says_plainly_when_it_cannot_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no cgroup can be made (not root, a read-only hierarchy), one line and a non-zero exit."""
    from click.testing import CliRunner

    from benchmarks import scaleout
    from billing.cli import cli

    monkeypatch.setattr(scaleout, "cpu_hierarchy", lambda: scaleout.CpuHierarchy("v1", tmp_path / "absent"))
    done = CliRunner().invoke(cli, ["bench", "--scale-out", "--rows", "10", "--data-dir", str(tmp_path)])
    assert done.exit_code != 0
    assert isinstance(done.exception, SystemExit) or done.exception is None
    assert "needs root" in done.output and "--cap 0 runs uncapped" in done.output
    assert not list(tmp_path.glob("bench-*.csv")), "it fails before any run"
