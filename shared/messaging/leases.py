"""Leases on received messages: kept while the messages wait for or go through their handler.

A message received from a storage queue is invisible to other receivers for its visibility timeout;
its pop receipt is the lease. :class:`Leases` holds the messages a listener has received and not
finished with, renews each lease before it runs out, deletes a message with its latest receipt, and
hands back (makes visible again at once) what a stop or a failure leaves unfinished.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.queue import QueueMessage
from azure.storage.queue.aio import QueueClient

log = logging.getLogger(__name__)

HAND_BACK_SECONDS = 5.0  # for making unfinished messages visible again (best effort)


class Leases:
    """The messages one listener holds: received from ``queue``, neither deleted nor released yet.

    Renewal runs inside :meth:`renewing`; whatever is still held when that block ends (work that
    was cancelled) is handed back. Renewals and deletes take turns (a lock), so a delete always
    uses the pop receipt of the latest renewal.
    """

    def __init__(self, queue: QueueClient, *, visibility_timeout: int) -> None:
        self._queue = queue
        self._visibility_timeout = visibility_timeout
        self._held: dict[str, QueueMessage] = {}
        self._lock = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._held)

    @property
    def name(self) -> str:
        return self._queue.queue_name

    async def hold(self, messages: Iterable[QueueMessage]) -> None:
        """Keep these just-received messages invisible until they are deleted or released."""
        async with self._lock:
            self._held.update((m.id, m) for m in messages)

    async def release(self, messages: Iterable[QueueMessage]) -> None:
        """Stop renewing these messages: done with them (those not deleted reappear after their
        visibility timeout)."""
        async with self._lock:
            for message in messages:
                self._held.pop(message.id, None)

    async def delete(self, message: QueueMessage) -> None:
        """Delete ``message`` from the queue (its lease ends with it)."""
        try:
            try:
                await self._queue.delete_message(message)
            except HttpResponseError as exc:
                if getattr(exc, "error_code", None) != "PopReceiptMismatch":
                    raise
                async with self._lock:  # a renewal was under way: use its new receipt
                    await self._queue.delete_message(message)
        except ResourceNotFoundError:
            # The lease was lost (the message reappeared and was taken again): its new holder
            # finishes it, and the downstream idempotency absorbs the repeat.
            log.warning("message %s on %s was already gone when deleted", message.id, self.name)
        async with self._lock:
            self._held.pop(message.id, None)

    async def hand_back(self, messages: Iterable[QueueMessage] | None = None) -> None:
        """Make messages visible again at once rather than after their visibility timeout: those
        given that are still held, or every one held; best effort, within a few seconds."""
        async with self._lock:
            if messages is None:
                chosen = list(self._held.values())
                self._held.clear()
            else:
                chosen = [self._held.pop(m.id) for m in messages if m.id in self._held]
        if not chosen:
            return
        released = asyncio.gather(
            *(self._queue.update_message(m, visibility_timeout=0) for m in chosen), return_exceptions=True
        )
        try:
            outcomes = await asyncio.wait_for(released, timeout=HAND_BACK_SECONDS)
        except TimeoutError:
            outcomes = [TimeoutError()] * len(chosen)
        failed = sum(isinstance(outcome, BaseException) for outcome in outcomes)
        log.info(
            "handed back %d messages on %s (%d already gone or unreachable)", len(chosen) - failed, self.name, failed
        )

    @asynccontextmanager
    async def renewing(self) -> AsyncIterator[None]:
        """Renew the leases while the block runs; at its end, hand back what is still held."""
        renewer = asyncio.create_task(self._renew_forever(), name=f"{self.name}-leases")
        try:
            yield
        finally:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
            await self.hand_back()

    async def _renew_forever(self) -> None:
        """Renew, every quarter timeout, each lease that ends within half a timeout."""
        timeout = self._visibility_timeout
        while True:
            await asyncio.sleep(max(0.5, timeout / 4))
            horizon = datetime.now(UTC) + timedelta(seconds=timeout / 2)
            async with self._lock:
                for message in list(self._held.values()):
                    if message.next_visible_on and message.next_visible_on > horizon:
                        continue
                    try:
                        renewed = await self._queue.update_message(message, visibility_timeout=timeout)
                    except Exception as exc:
                        log.warning("could not renew the lease of %s on %s: %s", message.id, self.name, exc)
                        continue
                    message.pop_receipt = renewed.pop_receipt
                    message.next_visible_on = renewed.next_visible_on
