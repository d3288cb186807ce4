"""A queue listener for a test: on the test's own queues, with its own handler and settings."""

from __future__ import annotations

from typing import Any

from shared.messaging.capacity import Capacity
from shared.messaging.envelope import ClaimCheck
from shared.messaging.listener import Handler, QueueListener
from shared.messaging.poison import PoisonQueue
from shared.messaging.scaling import ListenerSettings
from shared.messaging.storage import Storage
from shared.settings import Settings


def listener_on(
    storage: Storage,
    settings: Settings,
    handler: Handler,
    *,
    queue: str | None = None,
    burst: bool = True,
    capacity: Capacity | None = None,
    **overrides: Any,
) -> QueueListener:
    """A listener on ``queue`` (default: the requests queue) running ``handler``; ``overrides``
    adjust its :class:`ListenerSettings`; ``burst`` drains the queue and returns; listeners given
    one ``capacity`` share it."""
    claim_check = ClaimCheck(storage, container=settings.work_container, limit=settings.max_message_bytes)
    return QueueListener(
        queue=storage.queue(queue or settings.requests_queue),
        handler=handler,
        poison=PoisonQueue(storage, claim_check),
        settings=ListenerSettings.from_settings(settings, **overrides),
        counter=storage.counter,
        capacity=capacity,
        burst=burst,
    )
