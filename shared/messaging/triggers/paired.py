"""Two Service Bus namespaces for triggers (whitepaper ``004``, send availability, for hints).

Publishing goes to the primary namespace; once the primary has failed for the failover interval
(the same :class:`~shared.messaging.failover.Route` as storage sends) it goes to the secondary, and back after
a successful probe. Subscribers listen on both namespaces, so a hint published either way arrives.
A trigger that cannot be sent anywhere is logged and dropped: a hint never blocks a sender, and the
listeners' safety poll finds the work anyway. ServerBusy never fails over (the bus pauses itself).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from azure.core.exceptions import AzureError

from ..failover import Health, Route
from .base import TriggerBus, TriggerEvent, TriggerHandler

if TYPE_CHECKING:
    from .servicebus import ServiceBusTriggerBus

_LOGGER = logging.getLogger(__name__)


class PairedTriggerBus(TriggerBus):
    """Publishes to ``primary`` (or ``secondary`` while failed over); subscribes to both."""

    def __init__(
        self,
        primary: ServiceBusTriggerBus,
        secondary: ServiceBusTriggerBus,
        *,
        interval: float,
        probe_interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.primary, self.secondary = primary, secondary
        self.route = Route(interval, probe_interval)
        self._clock = clock

    async def start(self) -> None:
        await self.primary.start()
        await self.secondary.start()

    def subscribe(self, handler: TriggerHandler) -> None:
        super().subscribe(handler)
        self.primary.subscribe(handler)
        self.secondary.subscribe(handler)

    async def publish(self, event: TriggerEvent) -> None:
        await self.publish_many([event])

    async def publish_many(self, events: Iterable[TriggerEvent]) -> None:
        events = list(events)
        now = self._clock()
        if self.route.use_primary(now):
            try:
                await self.primary.send(events)
            except (AzureError, OSError) as exc:
                was = self.route.health
                self.route.failed(now)
                if self.route.health is not Health.FAILED_OVER:
                    _LOGGER.warning("trigger not published to the primary namespace (%s); dropped", exc)
                    return
                if was is not Health.FAILED_OVER:
                    _LOGGER.error("primary Service Bus namespace failing (%s): triggers go to the secondary", exc)
            else:
                if self.route.health is not Health.HEALTHY:
                    _LOGGER.warning("primary Service Bus namespace answers again: triggers go there")
                self.route.succeeded()
                return
        try:
            await self.secondary.send(events)
            self.route.backlog_sent += len(events)
        except (AzureError, OSError) as exc:
            _LOGGER.warning("trigger not published to either namespace (%s); dropped", exc)

    async def close(self) -> None:
        await self.primary.close()
        await self.secondary.close()
