"""One role process: storage reached, the role built and served until a signal, its state on disk."""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Awaitable
from typing import Protocol

from .. import telemetry
from ..settings import Settings
from . import health
from .backoff import patiently
from .service import Service, serve
from .storage import Storage
from .triggers import TriggerBus, trigger_bus


class RoleFactory(Protocol):
    """Builds a role's :class:`Service` over an open storage (each role package has one)."""

    def __call__(
        self, *, storage: Storage, settings: Settings, triggers: TriggerBus | None, burst: bool
    ) -> Service | Awaitable[Service]: ...


async def run_role(name: str, build: RoleFactory, settings: Settings, *, burst: bool) -> None:
    """Run one role until a signal (or, with ``burst``, until drained), keeping its state
    (listeners, requests made, peak memory) in ``home/state/<name>-<pid>.json``; with
    ``health_port``, serving its health and metrics (:mod:`shared.messaging.health`) meanwhile; its
    telemetry exported when configured (:mod:`shared.telemetry`, flushed as it stops)."""
    with telemetry.running(name):
        async with Storage(settings) as storage, health.serving(settings, storage) as served:
            await patiently("storage", storage.ensure_all)  # a role started during an outage waits for it
            # Burst runs drain and exit: nothing to wake.
            triggers = None if burst else trigger_bus(settings, storage)

            async def build_service() -> Service:
                service = build(storage=storage, settings=settings, triggers=triggers, burst=burst)
                service = await service if inspect.isawaitable(service) else service
                if served is not None:
                    served.attach(service)
                telemetry.observe_role(
                    lambda: dict(storage.counter.counts),
                    lambda: [listener.state().to_dict() for listener in service.listeners],
                )
                return service

            service = await serve(build_service, state_file=settings.home / "state" / f"{name}-{os.getpid()}.json")
        logging.getLogger(name).info("stopped; storage requests: %s", service.state()["requests"])
