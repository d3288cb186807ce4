"""What the three roles share at run time: their listeners, state, and signal-driven shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from ..errors import ConfigurationError
from ..settings import Settings
from .capacity import Capacity
from .listener import Handler, QueueListener
from .poison import PoisonQueue
from .scaling import SCALE_RULES, listener_settings
from .storage import Storage
from .triggers import TriggerBus, TriggerEvent

log = logging.getLogger(__name__)

STATE_INTERVAL = 2.0  # seconds between refreshes of a role's state file
HEARTBEAT_INTERVAL = 1.0  # seconds between beats of a running service (its liveness, see shared.messaging.health)


class Service:
    """A role: queue listeners over one :class:`Storage`, woken by an optional trigger bus.

    With a trigger bus the listeners run in push mode (they scale to zero and wait for triggers
    naming their queue); :meth:`announce` publishes the triggers for what the role enqueues.
    """

    name = "service"

    def __init__(
        self, *, storage: Storage, settings: Settings, triggers: TriggerBus | None = None, burst: bool = False
    ) -> None:
        self.storage = storage
        self.settings = settings
        self.triggers = triggers
        self.burst = burst
        self.listeners: list[QueueListener] = []
        self._chores: list[tuple[float | None, Callable[[], Awaitable[object]]]] = []
        #: Metrics of the role's own (served at ``/metrics`` with the listeners' counters).
        self.metrics = CollectorRegistry()
        #: ``time.monotonic()`` of the last beat: renewed every second while :meth:`run` runs.
        self.heartbeat = time.monotonic()
        self.health_port: int | None = None  # where /healthz, /readyz and /metrics are served, if they are
        if triggers is not None:
            triggers.subscribe(self._on_trigger)
        if storage.failover is not None:
            self.repeat(settings.failover_probe_interval, storage.failover.probe)

    def listen(
        self,
        queue: str,
        handler: Handler,
        *,
        poison: PoisonQueue,
        queues: int = 1,
        storage: Storage | None = None,
        capacity: Capacity | None = None,
        **overrides: Any,
    ) -> QueueListener:
        """Add a listener on ``queue``, one of the role's ``queues`` listeners (see
        :func:`~shared.messaging.scaling.listener_settings`); ``overrides`` adjust its settings. A
        queue of another account (``storage``) is polled: triggers only name the primary's queues.
        Listeners given one ``capacity`` hold no more messages, together, than it has slots."""
        push = self.triggers is not None and storage is None
        listener = QueueListener(
            queue=(storage or self.storage).queue(queue),
            handler=handler,
            poison=poison,
            settings=listener_settings(self.settings, push=push, queues=queues, **overrides),
            scale_rule=SCALE_RULES[self.settings.scale_rule],
            counter=self.storage.counter,
            capacity=capacity,
            burst=self.burst,
        )
        self.listeners.append(listener)
        return listener

    def repeat(self, interval: float | None, chore: Callable[[], Awaitable[object]]) -> None:
        """Run ``chore`` at start and then every ``interval`` seconds (None: only at start) while the
        listeners run; a failure is logged and the chore tried again at the next interval."""
        self._chores.append((interval, chore))

    async def announce(self, counts: Mapping[str, tuple[int, int]]) -> None:
        """Tell listeners elsewhere that work arrived: queue → (messages, transactions). A hint:
        failures are logged by the bus, never raised."""
        if self.triggers is not None and counts:
            await self.triggers.announce(self.storage.account_name, counts)

    def _on_trigger(self, event: TriggerEvent) -> None:
        if event.account != self.storage.account_name:
            return
        for listener in self.listeners:
            if listener.name == event.queue:
                listener.wake(event.messages)

    async def run(self, *, state_file: Path | None = None) -> None:
        """Run every listener; return when all have stopped (burst: drained). With ``state_file``,
        keep :meth:`state` there as JSON, refreshed every few seconds and at the end."""
        if self.triggers is not None:
            await self.triggers.start()
        listeners = [asyncio.create_task(listener.run(), name=listener.name) for listener in self.listeners]
        chores = [asyncio.create_task(_repeating(interval, chore)) for interval, chore in self._chores]
        tasks = [*listeners, *chores, asyncio.create_task(self._beat())]
        if state_file is not None:
            tasks.append(asyncio.create_task(self._keep_state(state_file)))
        try:
            await self._until_stopped(listeners)
        finally:
            for task in tasks:
                task.cancel()
            await _to_the_end(self._wind_down(tasks, state_file))

    async def _wind_down(self, tasks: list[asyncio.Task[None]], state_file: Path | None) -> None:
        """The end of :meth:`run`: its tasks ended, the triggers closed, what the role holds released
        (:meth:`aclose`), its state written a last time."""
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.triggers is not None:
            await self.triggers.close()
        await self.aclose()
        if state_file is not None:
            self._write_state(state_file)

    async def _until_stopped(self, listeners: list[asyncio.Task[None]]) -> None:
        """Wait for every listener to end. When one fails (a :class:`~shared.errors.ConfigurationError`),
        the others stop too, their in-flight work finishing within the shutdown deadline, and its
        error is raised."""
        done, pending = await asyncio.wait(listeners, return_when=asyncio.FIRST_EXCEPTION)
        errors = [error for task in done if not task.cancelled() and (error := task.exception()) is not None]
        if not errors:
            return
        error = errors[0]
        what = "configuration problem" if isinstance(error, ConfigurationError) else "a listener failed"
        log.error("%s: %s; the %s stops", what, error, self.name)
        self.stop()
        if pending:
            await asyncio.wait(pending, timeout=self.settings.shutdown_deadline)
        raise error

    async def _beat(self) -> None:
        while True:
            self.heartbeat = time.monotonic()
            await asyncio.sleep(HEARTBEAT_INTERVAL)

    async def _keep_state(self, state_file: Path) -> None:
        while True:
            self._write_state(state_file)
            await asyncio.sleep(STATE_INTERVAL)

    def _write_state(self, state_file: Path) -> None:
        state_file.parent.mkdir(parents=True, exist_ok=True)
        partial = state_file.with_suffix(".tmp")
        partial.write_text(json.dumps(self.state(), indent=2))
        partial.replace(state_file)  # readers never see half a file

    def stop(self) -> None:
        """Stop receiving (graceful): in-flight batches finish and :meth:`run` returns."""
        for listener in self.listeners:
            listener.stop()

    def readiness(self) -> dict[str, Callable[[], Awaitable[object]]]:
        """What must answer for the role to be ready, by name: one request each (``/readyz``)."""
        return {"storage": self.storage.queue(self.settings.results_queue).get_queue_properties}

    async def aclose(self) -> None:
        """Release what the role holds besides storage (pools, SQL); :meth:`run` calls it as it ends."""

    def state(self) -> dict[str, object]:
        return {
            "role": self.name,
            "pid": os.getpid(),
            "updated_at": datetime.now(UTC).isoformat(),
            "listeners": [listener.state().to_dict() for listener in self.listeners],
            "requests": self.storage.counter.snapshot(),
            "requests_attributed": self.storage.counter.attributed,
            "failover": self.storage.failover.state() if self.storage.failover else {},
            "peak_rss_mib": peak_rss_mib(),
            "peak_child_rss_mib": peak_rss_mib(children=True),
            "health_port": self.health_port,
        }


async def _repeating(interval: float | None, chore: Callable[[], Awaitable[object]]) -> None:
    while True:
        try:
            await chore()
        except Exception as exc:
            again = "" if interval is None else f", trying again in {interval:.0f} s"
            log.warning("%s failed%s: %s", getattr(chore, "__name__", chore), again, exc)
        if interval is None:
            return
        await asyncio.sleep(interval)


async def _to_the_end(work: Awaitable[None]) -> None:
    """Await ``work`` to its end even when the caller is cancelled meanwhile (the shutdown deadline
    passing while a role winds down); the cancellation goes on once it has ended."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


def _past_deadline(running: asyncio.Task[None]) -> None:
    if not running.done():
        log.warning("in-flight work did not finish by the shutdown deadline: cancelled, its messages handed back")
        running.cancel()


def peak_rss_mib(*, children: bool = False) -> float:
    """Peak resident memory of this process (or the largest of its finished children), MiB."""
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    return round(resource.getrusage(who).ru_maxrss / 1024, 1)


async def serve(build: Callable[[], Awaitable[Service]], *, state_file: Path | None = None) -> Service:
    """Build a service and run it until SIGINT/SIGTERM: in-flight work finishes within
    ``settings.shutdown_deadline`` (what is still running then is cancelled and its messages
    handed back to their queues); a second signal exits at once.

    A cancelled or hard exit leaves nothing half-done: unacknowledged messages reappear after their
    visibility timeout and an uncommitted SQL transaction is rolled back.
    """
    loop = asyncio.get_running_loop()
    service = await build()
    running = asyncio.create_task(service.run(state_file=state_file))
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            os._exit(128 + signum)
        deadline = service.settings.shutdown_deadline
        log.info("%s: finishing in-flight work (at most %.0f s), then stopping", signal.Signals(signum).name, deadline)
        service.stop()
        loop.call_later(deadline, _past_deadline, running)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await running
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return service
