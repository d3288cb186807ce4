"""Stopping roles mid-batch (real processes): SIGTERM finishes in-flight work and exits 0, a short
shutdown deadline cancels what is still running, a second signal exits at once — and in every case
the batch completes exactly once the roles run again."""

from __future__ import annotations

import signal
import time
from decimal import Decimal
from pathlib import Path

import pytest

from billing.sample import generate
from shared.settings import Settings
from store import BatchStatus, Store
from support.exact import billing, expected, read_raw, report, sorted_records
from support.references import sample_flags
from support.roles import Roles
from support.waiting import wait_until

ROWS = 60_000


def batch_status(settings: Settings) -> BatchStatus | None:
    try:
        with Store(settings.sql_url_value, migrate=False) as store:
            return store.batch("stopped")
    except Exception:
        return None


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
    roles: Roles,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    deadline: str,
    signals: int,
    exit_codes: set[int],
) -> None:
    # Small receives: what the processors hold when the signal comes is never the whole batch.
    small = {"WORK_ITEM_SIZE": "250", "DEQUEUE_BATCH_SIZE": "4", "VISIBILITY_TIMEOUT": "5"}
    for name, value in {"SHUTDOWN_DEADLINE": deadline, **small}.items():
        monkeypatch.setenv(f"BILLING_{name}", value)
    settings = Settings()
    batch = tmp_path / "batch.csv"
    generate(ROWS, batch, seed=21, reject_rate=0.01)
    with roles.running(settings):
        billing("submit", str(batch), "--batch-id", "stopped", *sample_flags(tmp_path / "ref"))
        assert wait_until(lambda: (s := batch_status(settings)) is not None and s.completed_items > 0, 120)

        stopped_at = time.monotonic()
        roles.signal(signal.SIGTERM, times=signals)
        codes = roles.wait(timeout=60)
        took = time.monotonic() - stopped_at
    midway = batch_status(settings)
    assert midway is not None and midway.state == "processing", "the signal came mid-batch"
    assert set(codes) <= exit_codes, codes
    if signals == 2:
        assert set(codes) != {0}, "a role busy with the batch was stopped by the second signal"
    if signals == 2 or deadline != "30":
        assert took < 10, f"a second signal or a passed deadline ends a role at once ({took:.1f} s)"
    if deadline != "30":
        said = "\n".join(roles.logs().values())
        assert "did not finish by the shutdown deadline" in said and "handed back" in said

    with roles.running(settings):
        assert wait_until(lambda: (s := batch_status(settings)) is not None and s.state == "complete", 300)
    assert roles.returncodes == [0, 0, 0]
    status = batch_status(settings)
    aggregates, invoices, _ = expected(read_raw(batch))
    assert status is not None and status.transactions_recorded == status.accepted == sum(
        a["transactions"] for a in aggregates
    )
    assert status.completed_items == status.work_items and status.poisoned_items == 0
    got = report("aggregates", "stopped")
    for record in got:
        record["quantity"] = Decimal(record["quantity"])
    assert sorted_records(got) == aggregates
    assert sorted_records(report("invoices", "stopped")) == invoices
