"""What waits in the pipeline's queues, as the tests read it."""

from __future__ import annotations

from shared.messaging.storage import Storage
from shared.settings import Settings


async def input_depth(settings: Settings) -> int:
    """The work items in the input queues of the primary account (0 while it cannot be read: stopped)."""
    async with Storage(settings.model_copy(update={"secondary_storage_connection_string": None})) as storage:
        try:
            depths = [await storage.queue(q).get_queue_properties() for q in settings.input_queues]
        except Exception:
            return 0
        return sum(d.approximate_message_count or 0 for d in depths)
