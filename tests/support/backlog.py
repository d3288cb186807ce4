"""What waits in a secondary account's backlog queues (send availability, ``shared.messaging.failover``)."""

from __future__ import annotations

from shared.messaging.failover import parse_backlog_message
from shared.messaging.storage import Storage


async def backlog(storage: Storage) -> list[tuple[str, str]]:
    """(destination queue, message) for every message in the backlog queues of ``storage``'s secondary (up to 32
    a queue), peeked: they stay there, visible to the syphon."""
    assert storage.secondary is not None
    found = []
    for queue in storage.settings.backlog_queues:
        for message in await storage.secondary.queue(queue).peek_messages(max_messages=32):
            found.append(parse_backlog_message(message.content))
    return found
