"""Send availability against real Azurite instances, in-process: a wrong key never fails over, an
unreachable primary fails over to the secondary's backlog queues after the interval, a primary
answering 503 Server Busy (``fault_proxy`` in front of Azurite) is waited for, never failed over."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from pydantic import SecretStr

import shared.messaging.failover
from benchmarks.fault_proxy import FaultProxy
from shared.errors import ConfigurationError
from shared.localstack import connection_string, free_ports
from shared.messaging.storage import Storage
from shared.settings import Settings
from support.backlog import backlog


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
    monkeypatch.setattr(shared.messaging.failover, "BUSY_PAUSE", 0.3)
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


async def test_a_failed_over_destination_no_one_sends_to_turns_healthy_by_probe(settings_env: Settings) -> None:
    interval = 2.0  # the probe interval: long beside the steps between two probes, however loaded the machine
    destination = settings_env.results_queue
    async with Storage(Settings()) as direct:
        await direct.ensure(queues=[destination])
    with FaultProxy(Settings().storage_connection_string.get_secret_value()) as proxy:  # type: ignore[union-attr]
        proxy.outage(3600, services=("queue",))  # connections reset until restored
        settings = account(proxy.connection_string, failover_interval=0, failover_probe_interval=interval)
        async with Storage(settings) as storage:
            assert storage.secondary is not None and storage.failover is not None
            await storage.secondary.ensure(queues=storage.settings.backlog_queues)
            await storage.send(destination, "while down")
            assert storage.failover.state()[destination]["health"] == "failed_over"
            await asyncio.sleep(interval + 0.1)  # a probe is due
            await storage.failover.probe()
            assert storage.failover.state()[destination]["health"] == "failed_over", "still down"
            asked = proxy.injected["queue"].total()
            await storage.failover.probe()
            assert proxy.injected["queue"].total() == asked, "no probe before the next is due"
            proxy.restore()
            await asyncio.sleep(interval + 0.1)
            await storage.failover.probe()
            assert storage.failover.state()[destination] == {"health": "healthy", "failovers": 1, "backlog_sent": 1}
