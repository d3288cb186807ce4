"""The poison queue beside each queue: messages that can never be processed, with the reason."""

from __future__ import annotations

import logging

from azure.storage.queue import QueueMessage

from .envelope import ClaimCheck, Envelope
from .storage import Storage

log = logging.getLogger(__name__)


def poison_queue_name(queue: str) -> str:
    return f"{queue}-poison"


class PoisonQueue:
    """Moves messages to ``<queue>-poison`` with their reason, original content and headers."""

    def __init__(self, storage: Storage, claim_check: ClaimCheck) -> None:
        self._storage = storage
        self._claim_check = claim_check

    async def put(self, queue: str, message: QueueMessage, reason: str) -> None:
        """Store ``message`` from ``queue`` in the poison queue (the caller then deletes it)."""
        headers = {
            "reason": reason,
            "queue": queue,
            "message_id": message.id,
            "dequeue_count": message.dequeue_count,
            "inserted_on": message.inserted_on.isoformat() if message.inserted_on else None,
        }
        envelope = Envelope("poison", headers, str(message.content).encode())
        text = await self._claim_check.pack(envelope, blob_name=f"poison/{queue}/{message.id}")
        await self._storage.queue(poison_queue_name(queue)).send_message(text)
        log.warning("message %s from %s moved to the poison queue: %s", message.id, queue, reason)
