"""Health and metrics over HTTP, for orchestrators (on when ``BILLING_HEALTH_PORT`` is set).

- ``GET /healthz``: 200 while the role's loop turns (its service's heartbeat is fresh, or it is
  still starting); 503 once the heartbeat is older than :data:`STALE_AFTER`.
- ``GET /readyz``: 200 when the role's dependencies answer (storage; the controller's SQL store too),
  each within :data:`READY_TIMEOUT`; else 503 with one line per failing dependency. Each call makes
  one storage request (``queue.metadata``), counted like any other.
- ``GET /metrics``: Prometheus text, read from the role's live counters at scrape time (nothing is
  counted twice, the hot path is untouched), plus what the role registers in its
  :attr:`~shared.messaging.service.Service.metrics` (the controller's batch latency histogram) and
  the process's CPU and memory.

The server runs on the role's event loop (aiohttp), from before storage is reached until the role
has stopped, so an orchestrator sees a role that waits out an outage at start as alive, not ready.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..errors import ConfigurationError
from ..logs import redact
from ..settings import Settings
from .service import Service
from .storage import Storage

log = logging.getLogger(__name__)

STALE_AFTER = 10.0  # seconds without a heartbeat before /healthz fails (the service beats every second)
READY_TIMEOUT = 5.0  # seconds each dependency has to answer /readyz


class Health:
    """What the endpoints report for one role process; :meth:`attach` the service once it is built."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.service: Service | None = None
        self.port = 0  # bound when served
        self.stale_after = STALE_AFTER
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.registry.register(_RoleCollector(self))

    def attach(self, service: Service) -> None:
        """Report on ``service`` from now on (its state names the port served)."""
        self.service = service
        service.health_port = self.port

    def alive(self) -> tuple[bool, str]:
        """Whether the role's loop turns, and why not."""
        if self.service is None:
            return True, "starting"
        age = time.monotonic() - self.service.heartbeat
        return (True, "ok") if age < self.stale_after else (False, f"no heartbeat for {age:.0f} s")

    async def ready(self) -> tuple[bool, str]:
        """Whether every dependency answers, and which do not."""
        if self.service is None:
            return False, "starting"
        checks = self.service.readiness()
        outcomes = await asyncio.gather(
            *(asyncio.wait_for(check(), READY_TIMEOUT) for check in checks.values()), return_exceptions=True
        )
        failing = [
            f"{name}: {_reason(outcome)}"
            for name, outcome in zip(checks, outcomes, strict=True)
            if isinstance(outcome, BaseException)
        ]
        return (False, "\n".join(failing)) if failing else (True, "ok")

    def metrics(self) -> bytes:
        return generate_latest(self.registry)


def _reason(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return f"no answer within {READY_TIMEOUT:.0f} s"
    return redact((str(error).splitlines() or [type(error).__name__])[0])[:200]  # no secret leaves


class _RoleCollector(Collector):
    """The role's counters as Prometheus metrics, read when scraped."""

    def __init__(self, health: Health) -> None:
        self._health = health

    def collect(self) -> Iterable[Metric]:
        counter = self._health.storage.counter
        requests = CounterMetricFamily("billing_storage_requests", "Storage requests made, by kind", labels=["kind"])
        for kind, count in sorted(counter.counts.items()):
            requests.add_metric([kind], count)
        yield requests
        yield CounterMetricFamily(
            "billing_storage_requests_attributed", "Storage requests made for a batch of messages", counter.attributed
        )
        service = self._health.service
        if service is None:
            return
        per_queue: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
            "processed": CounterMetricFamily(
                "billing_messages_processed", "Messages handled and acknowledged", labels=["queue"]
            ),
            "poisoned": CounterMetricFamily(
                "billing_messages_poisoned", "Messages moved to the poison queue", labels=["queue"]
            ),
            "failed_batches": CounterMetricFamily(
                "billing_failed_batches", "Received batches whose handling failed (redelivered)", labels=["queue"]
            ),
            "idle_polls": CounterMetricFamily("billing_idle_polls", "Receives that found no message", labels=["queue"]),
            "active_tasks": GaugeMetricFamily("billing_dequeue_tasks", "Dequeue tasks running", labels=["queue"]),
            "queue_depth": GaugeMetricFamily(
                "billing_queue_depth", "Queue depth last seen (a depth read or a trigger)", labels=["queue"]
            ),
            "service_time": GaugeMetricFamily(
                "billing_service_seconds_per_message", "Handling time per message, moving average", labels=["queue"]
            ),
        }
        for listener in service.listeners:
            state = vars(listener.state())
            for field, family in per_queue.items():
                if state[field] is not None:
                    family.add_metric([listener.name], state[field])
        yield from per_queue.values()
        yield from service.metrics.collect()


@asynccontextmanager
async def serving(settings: Settings, storage: Storage) -> AsyncIterator[Health | None]:
    """Serve the endpoints on ``health_host:health_port`` for the block (``None``: not configured)."""
    if settings.health_port is None:
        yield None
        return
    health = Health(storage)
    runner = web.AppRunner(_app(health), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.health_host, settings.health_port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigurationError(
            f"cannot serve health and metrics on {settings.health_host}:{settings.health_port} ({exc.strerror}): "
            "give each role on this host its own BILLING_HEALTH_PORT, or 0 for any free one"
        ) from exc
    health.port = runner.addresses[0][1]  # the free port chosen for 0
    log.info("health and metrics on http://%s:%d", settings.health_host, health.port)
    try:
        yield health
    finally:
        await runner.cleanup()


def _app(health: Health) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        ok, reason = health.alive()
        return web.Response(status=200 if ok else 503, text=reason + "\n")

    async def readyz(_: web.Request) -> web.Response:
        ok, reason = await health.ready()
        return web.Response(status=200 if ok else 503, text=reason + "\n")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=health.metrics(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", metrics)])
    return app
