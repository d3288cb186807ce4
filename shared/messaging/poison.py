"""The poison queue beside each queue: messages that can never be processed, with the reason.

Roles put messages there (:meth:`PoisonQueue.put`, which then calls its ``on_poisoned`` callback so
the role can tell whoever waits for the message, e.g. the controller, that it will never come);
operators inspect, replay and purge them (``billing poison``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal

from azure.storage.queue import QueueMessage
from opentelemetry.trace import StatusCode

from .. import telemetry
from ..errors import PoisonMessage
from ..settings import poison_queue_name
from .envelope import ClaimCheck, Envelope, peek_headers, peek_trace
from .storage import Storage

__all__ = ["OnPoisoned", "PoisonEntry", "PoisonQueue", "poison_queue_name"]

log = logging.getLogger(__name__)

POISON = "poison"
#: How long an operator action keeps the poison messages it looks at hidden from others.
OPERATOR_LEASE_SECONDS = 120

Action = Literal["show", "replay", "purge"]
#: Called once a message is in the poison queue: its kind and headers (peeked, payload unread) and the reason.
OnPoisoned = Callable[[str, dict[str, Any], str], Awaitable[None]]


@dataclass(frozen=True)
class PoisonEntry:
    """One poisoned message: where it came from, why, and its original content."""

    id: str  # the entry's id in the poison queue
    queue: str  # the queue the message was taken from
    message_id: str  # its id there
    reason: str
    dequeue_count: int
    inserted_on: str | None
    content: str


class PoisonQueue:
    """Moves messages to ``<queue>-poison`` with their reason, original content and headers.

    With ``on_poisoned``, each poisoned message whose kind and headers can be read is reported to it
    (a role tells the controller which work items will never be recorded, so their batch ends).
    """

    def __init__(self, storage: Storage, claim_check: ClaimCheck, *, on_poisoned: OnPoisoned | None = None) -> None:
        self._storage = storage
        self._claim_check = claim_check
        self._on_poisoned = on_poisoned

    async def put(self, queue: str, message: QueueMessage, reason: str) -> None:
        """Store ``message`` from ``queue`` in the poison queue and report it (the caller then deletes it),
        in a failed span of the message's trace (a poisoned work item shows in its batch's)."""
        context = telemetry.context_of(peek_trace(str(message.content)))
        with telemetry.span("poison message", context, attributes={"billing.poison.reason": reason}) as span:
            span.set_status(StatusCode.ERROR, reason)
            await self._put(queue, message, reason)

    async def _put(self, queue: str, message: QueueMessage, reason: str) -> None:
        headers = {
            "reason": reason,
            "queue": queue,
            "message_id": message.id,
            "dequeue_count": message.dequeue_count,
            "inserted_on": message.inserted_on.isoformat() if message.inserted_on else None,
        }
        envelope = Envelope(POISON, headers, str(message.content).encode())
        await self._claim_check.send(poison_queue_name(queue), envelope, blob_name=f"{POISON}/{queue}/{message.id}")
        log.warning("message %s from %s moved to the poison queue: %s", message.id, queue, reason)
        if self._on_poisoned is None:
            return
        peeked = peek_headers(str(message.content))
        if peeked is None:
            log.warning("the poisoned message %s has no readable headers; nobody is told", message.id)
            return
        kind, peeked_headers = peeked
        await self._on_poisoned(kind, peeked_headers, reason)

    async def count(self, queue: str) -> int:
        """About how many messages wait in the poison queue of ``queue``."""
        properties = await self._storage.queue(poison_queue_name(queue)).get_queue_properties()
        return properties.approximate_message_count or 0

    async def peek(self, queue: str) -> list[PoisonEntry]:
        """The first (up to 32) entries of the poison queue of ``queue``, left untouched."""
        messages = await self._storage.queue(poison_queue_name(queue)).peek_messages(max_messages=32)
        return [entry for entry in [await self._entry(m) for m in messages] if entry is not None]

    async def visit(self, queue: str, action: Action, ids: Collection[str] | None = None) -> list[PoisonEntry]:
        """Apply ``action`` to the entries of ``queue``'s poison queue whose entry id or original
        message id is in ``ids`` (every entry if None); return them.

        ``replay`` sends the original message back to its queue and only then removes the entry;
        ``purge`` removes it; ``show`` leaves it. Entries not selected are released at the end.
        """
        client = self._storage.queue(poison_queue_name(queue))
        chosen: list[PoisonEntry] = []
        passed: list[QueueMessage] = []
        while True:
            received = client.receive_messages(
                messages_per_page=32, max_messages=32, visibility_timeout=OPERATOR_LEASE_SECONDS
            )
            messages = [m async for m in received]
            if not messages:
                break
            for message in messages:
                entry = await self._entry(message)
                if entry is None or (ids is not None and not {entry.id, entry.message_id} & set(ids)):
                    passed.append(message)
                    continue
                if action == "replay":
                    await self._storage.send(entry.queue, entry.content)
                if action == "show":
                    passed.append(message)
                else:
                    await client.delete_message(message)
                chosen.append(entry)
        for message in passed:
            await client.update_message(message, visibility_timeout=0)
        return chosen

    async def _entry(self, message: QueueMessage) -> PoisonEntry | None:
        try:
            envelope = await self._claim_check.unpack(message.content)
            h = envelope.headers
            return PoisonEntry(
                id=message.id,
                queue=str(h["queue"]),
                message_id=str(h["message_id"]),
                reason=str(h["reason"]),
                dequeue_count=int(h["dequeue_count"] or 0),
                inserted_on=h.get("inserted_on"),
                content=envelope.payload.decode(),
            )
        except (PoisonMessage, KeyError, TypeError, ValueError) as exc:
            log.warning("unreadable entry %s in a poison queue: %s", message.id, exc)
            return None
