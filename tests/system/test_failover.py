"""Send availability: a secondary account with backlog queues and a syphon.

The state machine is checked on its own with a scripted clock; everything else runs against real
Azurite instances: a wrong key, a primary answering 503 Server Busy (``fault_proxy`` in front of
Azurite), a primary that is down, and the whole pipeline (real role processes) with the primary
Azurite stopped mid-run and restarted.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from pydantic import SecretStr

import shared.messaging.failover
from billing.demo import role_processes
from billing.stack import AzuriteStack, connection_string, free_ports
from controller.store import Store
from shared.errors import ConfigurationError
from shared.messaging.failover import Health, Route, parse_backlog_message
from shared.messaging.storage import Storage
from shared.rules.sample import generate
from shared.settings import Settings
from support.exact import _key, expected, read_raw, report
from support.fault_proxy import FaultProxy

# --- the state machine ----------------------------------------------------------------------


def test_fails_over_only_after_the_interval_and_probes_back() -> None:
    route = Route(interval=10, probe_interval=5)
    assert route.use_primary(0)
    route.failed(100)
    assert route.health is Health.FAILING and route.retry_in(100) == 1.0
    route.failed(109.5)
    assert route.health is Health.FAILING and route.retry_in(109.5) == 0.5
    route.failed(110)
    assert route.health is Health.FAILED_OVER and route.failovers == 1
    assert not route.use_primary(114.9) and route.use_primary(115)  # a probe every probe_interval
    route.failed(115)
    assert not route.use_primary(119.9) and route.use_primary(120)
    route.succeeded()
    assert route.health is Health.HEALTHY and route.failing_since is None


def test_zero_interval_fails_over_on_the_first_failure() -> None:
    route = Route(interval=0, probe_interval=5)
    route.failed(1)
    assert route.health is Health.FAILED_OVER


def test_a_flapping_primary_does_not_oscillate() -> None:
    """Failures shorter than the interval never fail over; once failed over, the primary is tried
    again only every probe interval however often sends happen."""
    route = Route(interval=10, probe_interval=5)
    for second in range(0, 60, 2):  # down 1 s, up 1 s, for a minute
        route.failed(second)
        route.succeeded()
    assert route.failovers == 0 and route.health is Health.HEALTHY

    route.failed(100)
    route.failed(111)
    probes = []
    for now in (t / 10 for t in range(1110, 1300)):  # a send every 100 ms for 19 s ...
        if route.use_primary(now):
            probes.append(now)
            route.failed(now)  # ... and every probe of the primary fails
    assert probes == [116.0, 121.0, 126.0] and route.failovers == 1


# --- real accounts --------------------------------------------------------------------------


def account(connection: str, **options: object) -> Settings:
    """Settings for a primary at ``connection`` with the session Azurite as secondary; SDK retries
    shortened so an unreachable primary fails in well under a second."""
    return Settings().model_copy(
        update={
            "storage_connection_string": SecretStr(connection),
            "secondary_storage_connection_string": Settings().storage_connection_string,
            "retry_total": 0,
            "request_timeout": 2.0,
            "failover_probe_interval": 0.5,
            **options,
        }
    )


async def backlog(storage: Storage) -> list[tuple[str, str]]:
    assert storage.secondary is not None
    found = []
    for queue in storage.settings.backlog_queues:
        async for message in storage.secondary.queue(queue).receive_messages(
            messages_per_page=32, visibility_timeout=1
        ):
            found.append(parse_backlog_message(message.content))
    return found


async def test_wrong_key_never_fails_over(settings_env: Settings) -> None:
    primary = re.sub(
        r"AccountKey=[^;]+", "AccountKey=" + "A" * 86 + "==", Settings().storage_connection_string.get_secret_value()
    )  # type: ignore[union-attr]
    async with Storage(account(primary, failover_interval=0)) as storage:
        assert storage.secondary is not None
        await storage.secondary.ensure(queues=storage.settings.backlog_queues)
        with pytest.raises(ConfigurationError, match="refused the credentials"):
            await storage.send(storage.settings.results_queue, "hello")
        assert await backlog(storage) == []
        assert storage.failover is not None and storage.failover.route(storage.settings.results_queue).failovers == 0


async def test_unreachable_primary_fails_over_after_the_interval_and_recovers(settings_env: Settings) -> None:
    down = connection_string("127.0.0.1", *free_ports(2))  # nothing listens there
    async with Storage(account(down, failover_interval=1.0)) as storage:
        assert storage.secondary is not None
        await storage.secondary.ensure(queues=storage.settings.backlog_queues)
        started = time.monotonic()
        await storage.send("billing-x-input-0", "first")
        assert time.monotonic() - started >= 1.0, "kept trying the primary for the failover interval"
        await storage.send("billing-x-input-0", "second")
        assert sorted(await backlog(storage)) == [("billing-x-input-0", "first"), ("billing-x-input-0", "second")]
        assert storage.failover is not None
        assert storage.failover.state() == {
            "billing-x-input-0": {"health": "failed_over", "failovers": 1, "backlog_sent": 2}
        }


async def test_server_busy_waits_and_never_fails_over(settings_env: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared.failover, "BUSY_PAUSE", 0.3)
    destination = settings_env.results_queue
    async with Storage(Settings()) as direct:
        await direct.ensure(queues=[destination])
    with FaultProxy(Settings().storage_connection_string.get_secret_value()) as proxy:  # type: ignore[union-attr]
        proxy.outage(1.5, kind="503", services=("queue",))  # the primary throttles
        async with Storage(account(proxy.connection_string, failover_interval=0)) as storage:
            assert storage.secondary is not None
            await storage.secondary.ensure(queues=storage.settings.backlog_queues)
            await storage.send(destination, "through the storm")
            assert proxy.injected["queue"]["503"] >= 3 and proxy.forwarded["queue"]["POST"] == 1
            assert await backlog(storage) == []
            assert storage.failover is not None and storage.failover.route(destination).failovers == 0
    async with Storage(Settings()) as direct:
        got = [m.content async for m in direct.queue(destination).receive_messages(messages_per_page=32)]
    assert got == ["through the storm"], "it reached the primary"


# --- the pipeline through an outage of the primary ----------------------------------------------


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[AzuriteStack]:
    stack = AzuriteStack(home=tmp_path / "primary", persist=True)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


async def _input_depth(settings: Settings) -> int:
    async with Storage(settings.model_copy(update={"secondary_storage_connection_string": None})) as storage:
        try:
            depths = [await storage.queue(q).get_queue_properties() for q in settings.input_queues]
        except Exception:
            return 0
        return sum(p.approximate_message_count or 0 for p in depths)


@pytest.mark.slow
def test_primary_outage_mid_run_completes_exactly_through_the_backlog(
    settings_env: Settings, primary: AzuriteStack, tmp_path: Path
) -> None:
    rows = 40_000
    settings = settings_env.model_copy(
        update={
            "storage_connection_string": SecretStr(primary.connection_string() or ""),
            "secondary_storage_connection_string": settings_env.storage_connection_string,
            "work_item_size": 100,
            "max_concurrent_sends": 2,
            "failover_interval": 1.0,
            "failover_probe_interval": 1.0,
            "syphon_idle_interval": 1.0,
            "visibility_timeout": 10,
            "retry_total": 1,
            "retry_backoff": 0.2,
            "request_timeout": 3.0,
            "trigger_backend": "none",
        }
    )
    batch = tmp_path / "batch.csv"
    generate(rows, batch, seed=11, reject_rate=0.01)
    env = {**os.environ, **settings.as_env()}
    with role_processes(settings, tmp_path / "logs") as processes:
        submit = subprocess.run(
            [sys.executable, "-m", "billing", "submit", str(batch), "--batch-id", "outage"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert submit.returncode == 0, submit.stderr
        deadline = time.monotonic() + 60
        while asyncio.run(_input_depth(settings)) < 20 and time.monotonic() < deadline:
            time.sleep(0.1)  # the initiator is enqueueing: now the primary goes away
        primary.restart(down_for=8)
        status = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with Store(settings.sql_url_value) as store:
                status = store.batch("outage")
            if status is not None and status.state == "complete":
                break
            time.sleep(1)
        time.sleep(2.5)  # the roles' state files catch up
        shown = subprocess.run(
            [sys.executable, "-m", "billing", "status", "--json"], env=env, capture_output=True, text=True
        )
        live = json.loads(shown.stdout)
    assert live["backlog"] == {queue: 0 for queue in settings.backlog_queues}
    routes = {dest: route for role in live["roles"] for dest, route in role["failover"].items()}
    assert routes and all(route["health"] == "healthy" for route in routes.values())
    assert sum(route["failovers"] for route in routes.values()) > 0
    assert [p.returncode for p in processes] == [0, 0, 0]
    assert status is not None and status.state == "complete", status

    states = [json.loads(p.read_text()) for p in (settings.home / "state").glob("*.json")]
    via_backlog = sum(route["backlog_sent"] for state in states for route in state["failover"].values())
    assert via_backlog > 0, "some sends went through the backlog"

    async def leftover() -> list[tuple[str, str]]:
        async with Storage(settings) as storage:
            return await backlog(storage)

    assert asyncio.run(leftover()) == [], "the syphon drained the backlog"

    aggregates, invoices, rejects = expected(read_raw(batch))
    assert (status.accepted, status.rejected) == (sum(a["transactions"] for a in aggregates), len(rejects))
    assert status.transactions_recorded == status.accepted and status.completed_items == status.work_items
    got = report("aggregates", "outage")
    for record in got:
        record["quantity"] = Decimal(record["quantity"])
    assert sorted(got, key=_key) == aggregates
    assert sorted(report("invoices", "outage"), key=_key) == invoices
