"""The syphon: forwards backlog messages from the secondary account to their primary queue.

Backlog queues fill while a destination is failed over (:mod:`shared.messaging.failover`). One listener per
backlog queue hands each received batch to :meth:`Syphon.forward`, which sends every message to its
destination on the primary; the listener deletes them only after that succeeded, so a forward that
fails leaves the message in the backlog for the next attempt (a repeat is absorbed downstream).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueMessage

from ..errors import ConfigurationError, InfrastructureError, is_transient
from .envelope import ClaimCheck
from .failover import parse_backlog_message
from .poison import PoisonQueue
from .service import Service
from .storage import Storage


class Syphon:
    """Forwards messages of the secondary's backlog queues to the primary."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def forward(self, messages: list[QueueMessage]) -> Mapping[str, str]:
        poisoned: dict[str, str] = {}
        for message in messages:
            try:
                destination, text = parse_backlog_message(str(message.content))
            except ValueError as exc:
                poisoned[message.id] = f"bad_backlog_message: {exc}"
                continue
            try:
                await self._storage.queue(destination).send_message(text)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                raise InfrastructureError(f"primary storage unavailable; backlog kept ({exc})") from exc
        return poisoned


async def backlog_depths(storage: Storage) -> dict[str, int]:
    """About how many messages wait in each backlog queue of the secondary account."""
    secondary = storage.secondary
    if secondary is None:
        return {}
    depths = {}
    for queue in storage.settings.backlog_queues:
        try:
            properties = await secondary.queue(queue).get_queue_properties()
        except ResourceNotFoundError:
            continue
        depths[queue] = properties.approximate_message_count or 0
    return depths


def add_syphon(service: Service) -> None:
    """Have ``service`` run the syphon: a pull-mode listener on each backlog queue of the secondary."""
    secondary = service.storage.secondary
    if secondary is None:
        raise ConfigurationError("the syphon needs a secondary storage account (BILLING_SECONDARY_STORAGE_*)")
    settings = service.settings
    syphon = Syphon(service.storage)
    poison = PoisonQueue(
        secondary, ClaimCheck(secondary, container=settings.work_container, limit=settings.max_message_bytes)
    )
    for queue in settings.backlog_queues:  # mostly empty: polled slowly when idle
        service.listen(
            queue, syphon.forward, poison=poison, storage=secondary, max_idle_interval=settings.syphon_idle_interval
        )


class SyphonService(Service):
    """``billing syphon``: a process that only runs the syphon."""

    name = "syphon"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        add_syphon(self)
