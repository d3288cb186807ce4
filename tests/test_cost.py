"""``billing cost``: projections from measured counts, the tiered Service Bus price, editable
prices, and the whitepaper's own idle example, each checked against figures worked out here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from billing.cost import Prices
from shared.settings import Settings


def cost(*args: str) -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-m", "billing", "cost", *args, "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_whitepapers_idle_example() -> None:
    """22 idle hours polling every second, 30 days: 79,200 requests a day per dequeue thread."""
    example = {row["threads"]: row for row in cost("--requests-per-1000", "0", "--idle-requests-per-hour", "0")["whitepaper_example"]}
    assert example[1]["monthly_storage_requests"] == 22 * 3600 * 30 == 2_376_000
    assert example[1]["monthly_storage_cost"]["whitepaper 2012"] == 2.38  # the paper's $2.38
    assert example[200]["monthly_storage_cost"]["whitepaper 2012"] == 475.20  # the paper prints $457.20: 200 × $2.376
    assert example[1]["monthly_storage_cost"]["GPv2 today"] == round(2_376_000 / 10_000 * 0.004, 2)


def test_projection_from_rates() -> None:
    got = cost("--requests-per-1000", "2.5", "--idle-requests-per-hour", "12", "--processors", "3",
               "--daily-transactions", "4000000", "--idle-hours", "20")["projection"]  # fmt: skip
    requests = (4_000_000 / 1000 * 2.5 + 20 * 12 * 3) * 30
    assert got["monthly_storage_requests"] == round(requests)
    assert got["monthly_storage_cost"] == {"GPv2 today": round(requests / 1e4 * 0.004, 2), "whitepaper 2012": round(requests / 1e4 * 0.01, 2)}
    assert got["monthly_servicebus_operations"] == 0 and got["monthly_servicebus_cost"] == 0


def test_servicebus_standard_tiers_at_their_boundaries() -> None:
    prices = Prices.load()
    base = prices.servicebus_base_monthly
    assert prices.servicebus_monthly(13e6) == pytest.approx(base)
    assert prices.servicebus_monthly(100e6) == pytest.approx(base + 87 * 0.80)
    assert prices.servicebus_monthly(2_500e6) == pytest.approx(base + 87 * 0.80 + 2_400 * 0.50)
    assert prices.servicebus_monthly(3_500e6) == pytest.approx(base + 87 * 0.80 + 2_400 * 0.50 + 1_000 * 0.20)
    got = cost("--requests-per-1000", "0", "--idle-requests-per-hour", "0", "--servicebus-per-1000", "1000", "--idle-hours", "0")
    assert got["projection"]["monthly_servicebus_operations"] == 300_000_000
    assert got["projection"]["monthly_servicebus_cost"] == round(base + 87 * 0.80 + 200 * 0.50, 2)


def test_prices_come_from_an_editable_file(tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text('[storage]\n"my contract" = 0.002\n[servicebus]\nbase_monthly = 0\ntiers = [[1e18, 1.0]]\n')
    got = cost("--requests-per-1000", "1", "--idle-requests-per-hour", "0", "--prices", str(prices))
    assert got["projection"]["monthly_storage_cost"] == {"my contract": round(10_000 * 30 / 1e4 * 0.002, 2)}


def test_rates_from_a_bench_report(tmp_path: Path) -> None:
    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"main": {"work_requests_per_1000": 2.0}, "listener": {"idle_requests_per_hour": {"push (local bus)": 12.0}}}))
    got = cost("--from-bench", str(report))["projection"]
    assert got["workload"]["requests_per_1000"] == 2.0 and got["workload"]["idle_requests_per_hour"] == 12.0
    assert got["monthly_storage_requests"] == round((10_000 * 2.0 + 22 * 12.0) * 30)


def test_a_window_of_a_running_processor(settings_env: Settings) -> None:
    """Measured from a real processor's live state: its idle polls, projected around the clock."""
    processor = subprocess.Popen([sys.executable, "-m", "processor"], env={**os.environ, "BILLING_TRIGGER_BACKEND": "none"},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        state = settings_env.home / "state" / f"processor-{processor.pid}.json"
        deadline = time.monotonic() + 60
        while not state.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        got = cost("--window", "4")
    finally:
        processor.send_signal(signal.SIGTERM)
        processor.wait(timeout=60)
    measured, projection = got["measured"], got["projection"]
    assert measured["roles"] == 1 and measured["storage_requests_per_hour"] > 0
    assert projection["monthly_storage_requests"] == round(measured["storage_requests_per_hour"] * 24 * 30)


def test_nothing_to_project_is_a_usage_error() -> None:
    result = subprocess.run([sys.executable, "-m", "billing", "cost"], capture_output=True, text=True)
    assert result.returncode != 0 and "--from-bench" in result.stderr
