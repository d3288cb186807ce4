"""Stopping roles mid-batch (real processes): SIGTERM finishes in-flight work and exits 0, a short
shutdown deadline cancels what is still running, a second signal exits at once — and in every case
the batch completes exactly once the roles run again."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest

from controller.store import BatchStatus, Store
from shared.rules.sample import generate
from shared.settings import Settings
from support.exact import _key, billing, expected, read_raw, report

ROWS = 60_000
ROLES = ("initiator", "processor", "controller")


def start(role: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", role], stdout=out, stderr=out)


def batch_status(settings: Settings) -> BatchStatus | None:
    try:
        with Store(settings.sql_url_value, migrate=False) as store:
            return store.batch("stopped")
    except Exception:
        return None


def wait_until(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize(
    ("deadline", "signals", "exit_codes"),
    [
        pytest.param("30", 1, {0}, id="sigterm-finishes-in-flight-work"),
        pytest.param("0.05", 1, {0}, id="short-deadline-cancels-in-flight-work"),
        # 143 from the handler; -15 when the role had already stopped and was tearing down; 0 when
        # it had nothing in flight and was gone before the second signal.
        pytest.param("30", 2, {128 + signal.SIGTERM, -signal.SIGTERM, 0}, id="second-signal-exits-at-once"),
    ],
)
def test_stopped_mid_batch_then_restarted_completes_exactly(
    settings_env: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    deadline: str,
    signals: int,
    exit_codes: set[int],
) -> None:
    for name, value in {"SHUTDOWN_DEADLINE": deadline, "WORK_ITEM_SIZE": "250", "VISIBILITY_TIMEOUT": "5"}.items():
        monkeypatch.setenv(f"BILLING_{name}", value)
    settings = Settings()
    batch = tmp_path / "batch.csv"
    generate(ROWS, batch, seed=21, reject_rate=0.01)
    logs = tmp_path / "logs"
    logs.mkdir()
    roles = {role: start(role, logs / f"{role}.log") for role in ROLES}
    billing("submit", str(batch), "--batch-id", "stopped")
    assert wait_until(lambda: (s := batch_status(settings)) is not None and s.completed_items > 0, 120)

    stopped_at = time.monotonic()
    for process in roles.values():
        for _ in range(signals):
            process.send_signal(signal.SIGTERM)
            time.sleep(0.01)
    codes = [process.wait(timeout=60) for process in roles.values()]
    took = time.monotonic() - stopped_at
    midway = batch_status(settings)
    assert midway is not None and midway.state == "processing", "the signal came mid-batch"
    assert set(codes) <= exit_codes, codes
    if signals == 2:
        assert set(codes) != {0}, "a role busy with the batch was stopped by the second signal"
    if signals == 2 or deadline != "30":
        assert took < 10, f"a second signal or a passed deadline ends a role at once ({took:.1f} s)"
    if deadline != "30":
        said = "\n".join(log.read_text() for log in logs.glob("*.log"))
        assert "did not finish by the shutdown deadline" in said and "handed back" in said

    roles = {role: start(role, logs / f"{role}.log") for role in ROLES}
    try:
        assert wait_until(lambda: (s := batch_status(settings)) is not None and s.state == "complete", 300)
    finally:
        for process in roles.values():
            process.send_signal(signal.SIGTERM)
        assert [process.wait(timeout=60) for process in roles.values()] == [0, 0, 0]
    status = batch_status(settings)
    aggregates, invoices, _ = expected(read_raw(batch))
    assert status is not None and status.transactions_recorded == status.accepted == sum(
        a["transactions"] for a in aggregates
    )
    assert status.completed_items == status.work_items and status.poisoned_items == 0
    got = report("aggregates", "stopped")
    for record in got:
        record["quantity"] = Decimal(record["quantity"])
    assert sorted(got, key=_key) == aggregates
    assert sorted(report("invoices", "stopped"), key=_key) == invoices
