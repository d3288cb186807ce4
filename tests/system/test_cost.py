"""``billing cost``: the whitepaper's own idle example, the tiered Service Bus price, editable prices,
rates from real benchmark report shapes, and a window of real role processes, each checked against
figures worked out here from first principles."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from benchmarks.listener import ListenerBench
from benchmarks.pipeline import BenchReport, PipelineRun
from billing.cost import Prices
from shared.messaging.processes import role_states
from shared.settings import Settings
from support.roles import Roles
from support.waiting import wait_until

# The whitepaper's example: one dequeue thread polling an empty queue every second through 22 idle
# hours a day, 30 days a month, at 2012's $0.01 per 10,000 storage transactions; it prints "$2.38"
# for 1 thread and "$457.20" for 200 (200 × $2.376 = $475.20: the paper transposed two digits).
IDLE_HOURS, POLLS_PER_HOUR, DAYS, PRICE_2012_PER_10K = 22, 3600, 30, 0.01


def cost(*args: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "billing", "cost", *args, "--json"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def cost_fails(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "billing", "cost", *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    return result.stderr


def prices_file(path: Path, *, storage: float = 0.002, base_hourly: float = 0.0, tiers: str = "[[1e18, 1.0]]") -> Path:
    path.write_text(
        f'[storage]\n"my contract" = {storage}\n[servicebus]\nbase_hourly = {base_hourly}\n'
        f"hours_per_month = 730\ntiers = {tiers}\n"
    )
    return path


def test_the_whitepapers_idle_example() -> None:
    example = {row["threads"]: row for row in cost("--whitepaper")["whitepaper_example"]}
    for threads in (1, 200):
        requests = IDLE_HOURS * POLLS_PER_HOUR * DAYS * threads
        assert example[threads]["monthly_storage_requests"] == requests
        assert example[threads]["monthly_storage_cost"]["whitepaper 2012"] == round(
            requests / 10_000 * PRICE_2012_PER_10K, 2
        )
        assert example[threads]["monthly_storage_cost"]["GPv2 today"] == round(requests / 10_000 * 0.004, 2)
    assert IDLE_HOURS * POLLS_PER_HOUR == 79_200  # the paper's daily figure
    assert example[1]["monthly_storage_cost"]["whitepaper 2012"] == 2.38  # as printed
    assert example[200]["monthly_storage_cost"]["whitepaper 2012"] == 475.20  # printed as $457.20


def test_projection_from_rates() -> None:
    got = cost(
        "--requests-per-1000",
        "2.5",
        "--idle-requests-per-hour",
        "12",
        "--processors",
        "3",
        "--daily-transactions",
        "4000000",
        "--idle-hours",
        "20",
    )["projection"]
    requests = (4_000_000 / 1000 * 2.5 + 20 * 12 * 3) * 30
    assert got["monthly_storage_requests"] == round(requests) == 321_600
    assert got["monthly_storage_cost"] == {"GPv2 today": 0.13, "whitepaper 2012": 0.32}
    assert got["monthly_servicebus_operations"] == 0 and got["monthly_servicebus_cost"] == 0


def test_servicebus_standard_tiers_at_their_boundaries(tmp_path: Path) -> None:
    tiers = "[[13_000_000, 0.0], [100_000_000, 0.80], [2_500_000_000, 0.50], [1e18, 0.20]]"
    prices = Prices.load(prices_file(tmp_path / "prices.toml", base_hourly=0.01, tiers=tiers))
    base = 0.01 * 730
    for operations, dollars in [
        (0, base),
        (13e6, base),
        (13e6 + 1e6, base + 0.80),
        (100e6, base + 87 * 0.80),
        (100e6 + 1e6, base + 87 * 0.80 + 0.50),
        (2_500e6, base + 87 * 0.80 + 2_400 * 0.50),
        (3_500e6, base + 87 * 0.80 + 2_400 * 0.50 + 1_000 * 0.20),
    ]:
        assert prices.servicebus_monthly(operations) == pytest.approx(dollars), operations
    # Through the command: 10 M transactions a day at 1,000 operations per 1,000 → 300 M a month.
    got = cost(
        "--requests-per-1000",
        "0",
        "--idle-requests-per-hour",
        "0",
        "--servicebus-per-1000",
        "1000",
        "--idle-hours",
        "0",
        "--prices",
        str(tmp_path / "prices.toml"),
    )["projection"]
    assert got["monthly_servicebus_operations"] == 300_000_000
    assert got["monthly_servicebus_cost"] == round(base + 87 * 0.80 + 200 * 0.50, 2) == 176.90


def test_prices_come_from_an_editable_file(tmp_path: Path) -> None:
    got = cost(
        "--requests-per-1000", "1", "--idle-requests-per-hour", "0", "--prices", str(prices_file(tmp_path / "p.toml"))
    )
    assert got["projection"]["monthly_storage_cost"] == {"my contract": round(10_000 * 30 / 1e4 * 0.002, 2)}
    assert got["whitepaper_example"][0]["monthly_storage_cost"] == {"my contract": round(2_376_000 / 1e4 * 0.002, 2)}
    (tmp_path / "bad.toml").write_text('[storage]\n"x" = 0.1\n')
    assert "not a prices table" in cost_fails("--whitepaper", "--prices", str(tmp_path / "bad.toml"))


def _run(mode: str, work_requests_per_1000: float) -> PipelineRun:
    return PipelineRun(
        mode=mode,  # type: ignore[arg-type]
        rows=1000,
        batches=1,
        partitions=4,
        processors=1,
        accepted=1000,
        work_items=1,
        submit_to_complete_seconds=1.0,
        submit_transactions_per_second=1000.0,
        latency_seconds=1.0,
        transactions_per_second=1000.0,
        phases={},
        cpu_seconds={},
        storage_requests=10,
        requests_per_1000=10.0,
        setup_requests=5,
        work_requests_per_1000=work_requests_per_1000,
        attributed_requests_per_1000=None,
        requests_by_kind={},
        peak_rss_mib={},
    )


def test_rates_from_bench_reports(tmp_path: Path) -> None:
    """Reports built from the benchmarks' own dataclasses, as `billing bench` / `bench-listener` write them."""
    listener = ListenerBench(
        {}, {"push (local bus)": 12.0, "pull (back-off to 10 s)": 400.0, "naive 1 s polling": 3600.0}, 60, 1, 2, 3
    )
    main = _run("optimised", 2.0)
    report = BenchReport(main, [main], _run("optimised", 2.5), _run("naive", 40.0), listener, [], {})
    (tmp_path / "bench.json").write_text(json.dumps(asdict(report)))
    (tmp_path / "listener.json").write_text(json.dumps(asdict(listener)))
    optimised = cost("--from-bench", str(tmp_path / "bench.json"))["projection"]
    assert optimised["monthly_storage_requests"] == round((10_000 * 2.0 + 22 * 12.0) * 30) == 607_920
    naive = cost("--from-bench", str(tmp_path / "bench.json"), "--design", "naive")["projection"]
    assert naive["monthly_storage_requests"] == round((10_000 * 40.0 + 22 * 3600.0) * 30) == 14_376_000
    # The listener bench has no transaction rate: it comes from the flag.
    got = cost("--from-bench", str(tmp_path / "listener.json"), "--requests-per-1000", "3")["projection"]
    assert got["monthly_storage_requests"] == round((10_000 * 3.0 + 22 * 12.0) * 30)
    assert "--requests-per-1000" in cost_fails("--from-bench", str(tmp_path / "listener.json"))
    (tmp_path / "other.json").write_text('{"rows": 3}')
    assert "not a `billing bench`" in cost_fails("--from-bench", str(tmp_path / "other.json"))


@pytest.mark.slow
def test_a_window_of_the_running_roles(roles: Roles) -> None:
    """Real initiator, two processors and controller, idle and polling every second (the whitepaper's
    naive design): the window must find one empty receive per second per queue each role polls."""
    settings = Settings(trigger_backend="none", min_idle_interval=1, max_idle_interval=1, partitions=2, dequeue_tasks=1)
    queues = 1 + 2 * settings.partitions + 1  # initiator: requests; processors: the inputs; controller: results
    with roles.running(settings, processors=2):
        assert wait_until(
            lambda: (
                len(states := role_states(settings)) == 4
                and all(s["requests"].get("queue.receive", 0) >= 2 for s in states)
            ),
            60,
            interval=0.2,
        ), "the roles did not start polling"
        got = cost("--window", "10")
    measured, projection = got["measured"], got["projection"]
    assert measured["roles"] == ["controller", "initiator", "processor", "processor"]
    assert set(measured["requests_per_hour_by_kind"]) == {"queue.receive"}  # idle: nothing but empty polls
    assert measured["storage_requests_per_hour"] == pytest.approx(queues * 3600, rel=0.15)
    assert projection["monthly_storage_requests"] == round(measured["storage_requests_per_hour"] * 24 * 30)
    assert "no --idle-hours" in cost_fails("--window", "4", "--idle-hours", "3")


def test_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BILLING_HOME", str(tmp_path))  # no role runs here
    assert "--from-bench" in cost_fails()
    assert "--whitepaper takes no --processors" in cost_fails("--whitepaper", "--processors", "2")
    assert "no role ran" in cost_fails("--window", "4")
    assert "--window" in cost_fails("--window", "1")  # shorter than two state refreshes
