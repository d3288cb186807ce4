"""Send availability (whitepaper ``004``, "paired namespaces", for storage queues).

Every send to a pipeline queue goes to the primary account while it answers. Transient failures
(:func:`~shared.errors.is_transient`) other than "server busy" start a per-destination timer; once
the primary has failed for ``failover_interval`` the destination is *failed over*: its messages go
to a backlog queue of the secondary account, chosen at random among ``backlog_queue_count``, as
``<destination>\\n<message>``.
While failed over, the primary is probed again every ``failover_probe_interval`` (by the next send,
or by :meth:`Failover.probe` for a destination nobody sends to); the first success makes the
destination healthy. A syphon (:mod:`shared.messaging.syphon`) forwards backlog messages to their
destination once the primary answers. Receivers read only the primary; order is not kept across a
failover, and a send that timed out yet landed may arrive twice (the controller absorbs repeats).

Never failed over: permanent failures such as authentication, authorisation and other client errors
(the configuration is wrong; raised at once, a refused credential as :class:`ConfigurationError`),
and 503 Server Busy (the caller waits :data:`BUSY_PAUSE` and retries).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, TypeVar

from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

from ..errors import ConfigurationError, is_transient

if TYPE_CHECKING:
    from .storage import Storage

log = logging.getLogger(__name__)

T = TypeVar("T")
#: How long a sender waits after the primary answered "server busy" (as Service Bus asks).
BUSY_PAUSE = 10.0
#: Longest wait between retries of a failing primary before it is failed over.
RETRY_PAUSE = 1.0


def is_server_busy(exc: BaseException) -> bool:
    """Whether storage answered 503 Server Busy: transient, but a reason to wait, not to fail over."""
    return (
        isinstance(exc, HttpResponseError)
        and exc.status_code == 503
        and getattr(exc, "error_code", None) == "ServerBusy"  # set by the storage SDK's error mapping
    )


class Health(StrEnum):
    HEALTHY = "healthy"
    FAILING = "failing"  # failing for less than the interval: senders retry the primary
    FAILED_OVER = "failed_over"


@dataclass
class Route:
    """The failover state of one destination; the caller supplies the clock."""

    interval: float
    probe_interval: float
    health: Health = Health.HEALTHY
    failing_since: float | None = None
    next_probe: float = 0.0
    failovers: int = 0
    backlog_sent: int = 0

    def use_primary(self, now: float) -> bool:
        """Whether the next send tries the primary (always, unless failed over and no probe is due)."""
        return self.health is not Health.FAILED_OVER or now >= self.next_probe

    def succeeded(self) -> None:
        self.health, self.failing_since = Health.HEALTHY, None

    def failed(self, now: float) -> None:
        """The primary failed (neither permanently nor busy)."""
        if self.health is Health.FAILED_OVER:
            self.next_probe = now + self.probe_interval
            return
        if self.failing_since is None:
            self.health, self.failing_since = Health.FAILING, now
        if now - self.failing_since >= self.interval:
            self.health, self.next_probe = Health.FAILED_OVER, now + self.probe_interval
            self.failovers += 1

    def retry_in(self, now: float) -> float:
        """While failing: how long to wait before trying the primary again."""
        assert self.failing_since is not None
        return max(0.0, min(RETRY_PAUSE, self.failing_since + self.interval - now))


class Failover:
    """Routes sends per destination between a primary and a secondary account."""

    def __init__(
        self,
        primary: Storage,
        secondary: Storage,
        *,
        interval: float,
        probe_interval: float,
        backlog_queues: list[str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.primary, self.secondary = primary, secondary
        self._interval, self._probe_interval = interval, probe_interval
        self._backlog = backlog_queues
        self._clock = clock
        self.routes: dict[str, Route] = {}

    def route(self, destination: str) -> Route:
        route = self.routes.get(destination)
        if route is None:
            route = self.routes[destination] = Route(self._interval, self._probe_interval)
        return route

    def state(self) -> dict[str, dict[str, object]]:
        """Per destination: health, failovers so far, messages sent to the backlog."""
        return {
            name: {k: v for k, v in asdict(route).items() if k in ("health", "failovers", "backlog_sent")}
            for name, route in sorted(self.routes.items())
        }

    async def probe(self) -> None:
        """Ask the primary about each failed-over destination whose probe is due, one small request
        each, so that a destination no one sends to any more turns healthy once the primary answers.
        A non-transient answer counts as an answer: the next send raises it where it belongs."""
        for destination, route in list(self.routes.items()):
            if route.health is not Health.FAILED_OVER or not route.use_primary(self._clock()):
                continue
            try:
                await self.primary.queue(destination).get_queue_properties()
            except Exception as exc:
                if is_transient(exc):
                    route.failed(self._clock())
                    continue
            log.warning("primary storage answers again for %s: healthy", destination)
            route.succeeded()

    async def run(
        self, destination: str, primary: Callable[[], Awaitable[T]], secondary: Callable[[], Awaitable[T]]
    ) -> tuple[T, bool]:
        """``primary()``, or ``secondary()`` once ``destination`` is failed over; returns the result
        and whether the secondary took it."""
        route = self.route(destination)
        while route.use_primary(self._clock()):
            try:
                result = await primary()
            except Exception as exc:
                if not is_transient(exc):
                    if isinstance(exc, ClientAuthenticationError):
                        raise ConfigurationError(
                            f"the primary storage account refused the credentials: {exc.message}"
                        ) from exc
                    raise
                if is_server_busy(exc):
                    log.warning(
                        "primary storage busy for %s; waiting %.0f s (busy never fails over)", destination, BUSY_PAUSE
                    )
                    await asyncio.sleep(BUSY_PAUSE)
                    continue
                was = route.health
                route.failed(self._clock())
                if route.health is Health.FAILED_OVER:
                    if was is not Health.FAILED_OVER:
                        log.error(
                            "primary storage failing for %s (%s): failed over to the secondary account",
                            destination,
                            exc,
                        )
                    break
                if was is Health.HEALTHY:
                    log.warning(
                        "primary storage failing for %s (%s); failing over in %.1f s", destination, exc, self._interval
                    )
                await asyncio.sleep(route.retry_in(self._clock()))
                continue
            if route.health is not Health.HEALTHY:
                log.warning("primary storage answers again for %s: healthy", destination)
            route.succeeded()
            return result, False
        result = await secondary()
        return result, True

    async def send(self, queue: str, text: str) -> None:
        """Send ``text`` to ``queue``: on the primary, or into a backlog queue of the secondary."""

        async def to_backlog() -> None:
            await self.secondary.queue(random.choice(self._backlog)).send_message(backlog_message(queue, text))
            self.route(queue).backlog_sent += 1

        await self.run(queue, lambda: self.primary.queue(queue).send_message(text), to_backlog)


def backlog_message(destination: str, text: str) -> str:
    return f"{destination}\n{text}"


def parse_backlog_message(content: str) -> tuple[str, str]:
    """``(destination, original message)`` of a backlog message; ValueError if it is not one."""
    destination, separator, text = content.partition("\n")
    if not separator or not destination:
        raise ValueError("not a backlog message (no destination line)")
    return destination, text
