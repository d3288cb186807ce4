"""What waits in a secondary account's backlog queues (send availability, ``shared.messaging.failover``)."""

from __future__ import annotations

from shared.messaging.failover import parse_backlog_message
from shared.messaging.storage import Storage


async def backlog(storage: Storage) -> list[tuple[str, str]]:
    """(destination queue, message) for every message in the backlog queues of ``storage``'s secondary,
    received with a short visibility timeout (they reappear a second later)."""
    assert storage.secondary is not None
    found = []
    for queue in storage.settings.backlog_queues:
        async for message in storage.secondary.queue(queue).receive_messages(
            messages_per_page=32, visibility_timeout=1
        ):
            found.append(parse_backlog_message(message.content))
    return found
