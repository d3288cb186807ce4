"""The health server in the test's process, over a real controller (Azurite, PostgreSQL): alive while
starting and while its service beats, ready only while storage and SQL answer (the session's
PostgreSQL is stopped and started again), not alive once the service has stopped beating; a port
already taken is a configuration error, said plainly."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from benchmarks.postgres import PostgresServer
from controller.service import Controller
from shared.errors import ConfigurationError
from shared.messaging import health
from shared.messaging.storage import Storage
from shared.settings import Settings
from store import Store
from support.waiting import wait_until_async


async def answer(base: str, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.get(base + path) as response,
    ):
        return response.status, await response.text()


@pytest.mark.parametrize("sql_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
async def test_probes_follow_the_service_and_its_sql_store(
    storage: Storage, settings_env: Settings, sql_url: str, postgres_server: PostgresServer
) -> None:
    settings = settings_env.model_copy(update={"health_port": 0, "health_host": "127.0.0.1"})
    async with health.serving(settings, storage) as served:
        assert served is not None and served.port > 0
        base = f"http://127.0.0.1:{served.port}"
        assert await answer(base, "/healthz") == (200, "starting\n")
        assert await answer(base, "/readyz") == (503, "starting\n")

        controller = Controller(storage=storage, settings=settings, store=await asyncio.to_thread(Store, sql_url))
        served.attach(controller)
        running = asyncio.create_task(controller.run())
        assert await answer(base, "/healthz") == (200, "ok\n")
        assert await answer(base, "/readyz") == (200, "ok\n")
        metrics = (await answer(base, "/metrics"))[1]
        assert "billing_batch_latency_seconds_count 0.0" in metrics
        assert f'billing_dequeue_tasks{{queue="{settings.results_queue}"}}' in metrics

        await asyncio.to_thread(postgres_server.stop)
        try:
            status, reason = await answer(base, "/readyz")
            assert status == 503 and reason.startswith("sql: ") and "storage" not in reason, reason
            assert (await answer(base, "/healthz"))[0] == 200
        finally:
            await asyncio.to_thread(postgres_server.start)
        async with asyncio.timeout(60):
            await wait_until_async(lambda: _status_is(base, "/readyz", 200), interval=0.5)

        controller.stop()
        await running
        served.stale_after = 1.0  # seconds: the role's default is 10
        async with asyncio.timeout(30):
            await wait_until_async(lambda: _status_is(base, "/healthz", 503), interval=0.2)
        assert (await answer(base, "/healthz"))[1].startswith("no heartbeat for ")


async def _status_is(base: str, path: str, status: int) -> bool:
    return (await answer(base, path))[0] == status


async def test_a_port_in_use_is_a_configuration_error(storage: Storage, settings_env: Settings) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = settings_env.model_copy(update={"health_port": port, "health_host": "127.0.0.1"})
        with pytest.raises(ConfigurationError, match=f"127.0.0.1:{port}.*its own BILLING_HEALTH_PORT"):
            async with health.serving(settings, storage):
                pass
