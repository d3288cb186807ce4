"""Recovery without waiting: a role SIGKILLed while it holds leased messages and restarted a second
later. Nothing announces a message whose lease runs out, so the batch must not wait for the safety
poll (minutes): it completes within the visibility timeout plus 15 s of the kill, exact to the minor
unit. The roles idle out within a second here, long before the dead role's leases run out, so only
the listeners' look at what is leased can find the work again."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from benchmarks.recovery import RECOVERY_MARGIN, freeze_holding_work, wait_complete
from billing.sample import generate
from shared.settings import Settings
from support.exact import assert_batch_exact, billing
from support.references import sample_flags
from support.roles import Roles

pytestmark = pytest.mark.slow

ROWS = 60_000
VISIBILITY = 5  # seconds: short, so the test stays quick
BOUND = VISIBILITY + RECOVERY_MARGIN  # seconds from the kill to the batch complete
SEED = 7


@pytest.fixture(scope="module")
def recovery_batch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("recovery") / "batch.csv"
    generate(ROWS, path, seed=SEED, reject_rate=0.01)
    return path


@pytest.mark.parametrize("role", ["initiator", "processor", "controller"])
def test_a_role_killed_holding_leased_work_is_taken_up_within_the_lease(
    role: str, recovery_batch: Path, roles: Roles, monkeypatch: pytest.MonkeyPatch
) -> None:
    knobs = {"VISIBILITY_TIMEOUT": VISIBILITY, "WORK_ITEM_SIZE": 2000, "MAX_IDLE_INTERVAL": 0.5}
    for name, value in knobs.items():
        monkeypatch.setenv(f"BILLING_{name}", str(value))
    settings = Settings()
    with roles.running(settings):
        assert roles.wait_up()
        billing("submit", str(recovery_batch), "--batch-id", "recovered", *sample_flags(recovery_batch.parent / "ref"))
        victim = roles.processes[roles.names.index(role)]
        held = freeze_holding_work(role, victim.pid, settings)
        roles.kill(role)
        killed_at = datetime.now(UTC)
        time.sleep(1.0)
        roles.restart(role)
        status = wait_complete(settings, "recovered", timeout=BOUND + 60)
    assert status.completed_at is not None
    took = (status.completed_at - killed_at).total_seconds()
    assert took <= BOUND, f"complete {took:.1f} s after the {role} was killed holding {held} messages"
    assert_batch_exact("recovered", recovery_batch)
