"""Chaos: a batch (``BILLING_CHAOS_ROWS``, default 50,000 rows in 100 work items) while the test SIGKILLs
and restarts roles at random moments, stops and restarts Azurite (on-disk persistence, an Azurite of the
test's own), or restarts PostgreSQL. Afterwards every work item is counted exactly once and the
aggregates equal the independent reference model to the minor unit. Every kill slows the batch down
(the dead role's leases run out first), so the kills land mid-run at this size too; the test fails
unless every role was killed before the batch completed."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from benchmarks.postgres import PostgresServer
from billing.sample import generate
from shared.localstack import AzuriteStack
from shared.roles import ROLES
from shared.settings import Settings
from store import FINAL_STATES, BatchStatus, Store
from support.azurite import running_azurite
from support.exact import billing, expected, read_raw, report, sorted_records
from support.references import sample_flags
from support.roles import Roles
from support.waiting import wait_until

pytestmark = pytest.mark.slow

ROWS = int(os.environ.get("BILLING_CHAOS_ROWS", "50000"))
KILLS = 9  # SIGKILLs per run at most: each role three times, while the batch is still in flight
SEED = 2026


@pytest.fixture(scope="module")
def chaos_batch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """One batch file for every run, with its expected aggregates and invoices (computed once)."""
    path = tmp_path_factory.mktemp("chaos") / "batch.csv"
    generate(ROWS, path, seed=SEED, reject_rate=0.01)
    return path, expected(read_raw(path))


@pytest.fixture
def chaos_env(settings_env: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The test's settings with small work items: many messages in flight at every moment a role may be killed."""
    chaos = {"PARTITIONS": "4", "WORK_ITEM_SIZE": "500", "VISIBILITY_TIMEOUT": "5", "MAX_DEQUEUE_COUNT": "20"}
    for name, value in chaos.items():
        monkeypatch.setenv(f"BILLING_{name}", value)
    return Settings()


@pytest.fixture
def stack(chaos_env: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AzuriteStack]:
    """An Azurite of the test's own, persisted on disk, so the test can stop and restart it."""
    with running_azurite(tmp_path / "azurite", persist=True) as azurite:
        monkeypatch.setenv("BILLING_STORAGE_CONNECTION_STRING", azurite.connection_string() or "")
        yield azurite


def run_with_chaos(roles: Roles, batch: Path, inflict: Callable[[Roles, random.Random], None]) -> BatchStatus:
    """Submit ``batch``, let ``inflict`` do its damage while the roles work, wait for the end."""
    settings = Settings()
    with roles.running(settings):
        billing("submit", str(batch), "--batch-id", "chaos", *sample_flags(batch.parent / "ref"))
        inflict(roles, random.Random(SEED))
        status = wait_until(lambda: final_status(settings), 600, interval=0.2)
    # Every role is SIGTERMed once it is up (a role still starting would die by the default action).
    assert roles.returncodes == [0, 0, 0], f"every role stops cleanly after the chaos (logs in {roles.log_dir})"
    assert status is not None, "the batch did not finish within 10 minutes"
    return status


def final_status(settings: Settings) -> BatchStatus | None:
    """The batch's status once final (None before, or while the store cannot be reached)."""
    try:
        with Store(settings.sql_url_value, migrate=False) as store:
            status = store.batch("chaos")
    except Exception:
        return None
    return status if status is not None and status.state in FINAL_STATES else None


def assert_exact(status: BatchStatus, want: Any) -> None:
    aggregates, invoices, rejects = want
    accepted = sum(a["transactions"] for a in aggregates)
    assert status.state == "complete" and status.poisoned_items == 0
    assert (status.rows, status.accepted, status.rejected) == (ROWS, accepted, len(rejects))
    assert status.completed_items == status.work_items
    assert status.transactions_recorded == accepted, "no work item counted twice or lost"
    got = report("aggregates", "chaos")
    for record in got:
        record["quantity"] = Decimal(record["quantity"])
    assert sorted_records(got) == aggregates
    assert sorted_records(report("invoices", "chaos")) == invoices


def test_roles_killed_at_random_moments(chaos_env: Settings, chaos_batch: tuple[Path, Any], roles: Roles) -> None:
    def kill_roles(roles: Roles, rng: random.Random) -> None:
        # Three rounds, each role once per round in a random order: the first three kills hit every role.
        victims = [role for _ in range(KILLS // len(ROLES)) for role in rng.sample(ROLES, len(ROLES))]
        for role in victims:
            time.sleep(rng.uniform(0.3, 1.5))
            if final_status(chaos_env) is not None:
                break  # the batch is done: later kills would prove nothing
            roles.kill_and_restart(role)
        assert set(roles.killed) == set(ROLES), f"every role was killed mid-run: {roles.killed}"

    batch, want = chaos_batch
    status = run_with_chaos(roles, batch, kill_roles)
    assert_exact(status, want)


def test_azurite_stopped_and_restarted_mid_run(
    stack: AzuriteStack, chaos_batch: tuple[Path, Any], roles: Roles
) -> None:
    def restart_azurite(roles: Roles, rng: random.Random) -> None:
        time.sleep(rng.uniform(2.0, 4.0))
        stack.restart(down_for=5)

    batch, want = chaos_batch
    status = run_with_chaos(roles, batch, restart_azurite)
    assert_exact(status, want)


@pytest.mark.postgres
@pytest.mark.parametrize("sql_url", ["postgresql"], indirect=True)
def test_postgresql_restarted_mid_run(
    chaos_env: Settings,
    chaos_batch: tuple[Path, Any],
    roles: Roles,
    monkeypatch: pytest.MonkeyPatch,
    postgres_server: PostgresServer,
    sql_url: str,
) -> None:
    monkeypatch.setenv("BILLING_SQL_URL", sql_url)

    def restart_postgres(roles: Roles, rng: random.Random) -> None:
        time.sleep(rng.uniform(2.0, 4.0))
        postgres_server.stop()
        time.sleep(5)
        postgres_server.start()

    batch, want = chaos_batch
    status = run_with_chaos(roles, batch, restart_postgres)
    assert_exact(status, want)
