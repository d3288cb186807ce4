"""The auto-scaling queue listener every role runs (the whitepaper's listener, in asyncio).

Dequeue tasks receive up to ``dequeue_batch_size`` messages per call and hand each batch to the
role's handler. An empty poll makes a task back off exponentially with jitter; once its sleep
reaches ``max_idle_interval`` it exits unless it is the last one. When a poll finds work after
idling, the scale rule decides how many tasks the queue depth deserves and the difference starts.
Messages are deleted only after the handler returns (its output is durable by then); while the
handler works, their visibility is renewed. A message seen more than ``max_dequeue_count`` times,
or one the handler declares poison, moves to the poison queue with its reason.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.storage.queue import QueueMessage
from azure.storage.queue.aio import QueueClient

from .poison import PoisonQueue
from .settings import Settings

log = logging.getLogger(__name__)

#: The handler gets one received batch; it returns the messages to poison (id → reason).
Handler = Callable[[list[QueueMessage]], Awaitable[Mapping[str, str] | None]]
#: A scale rule: (queue depth, settings) → wanted number of dequeue tasks.
ScaleRule = Callable[[int, "ListenerSettings"], int]

ERROR_PAUSE_MIN = 1.0
ERROR_PAUSE_MAX = 30.0


@dataclass(frozen=True, kw_only=True)
class ListenerSettings:
    """Listener knobs, named as in the whitepaper (README maps them to ``host.json``)."""

    dequeue_batch_size: int = 32
    visibility_timeout: int = 60
    min_idle_interval: float = 0.0
    max_idle_interval: float = 10.0
    backoff_delta: float = 0.1
    max_dequeue_count: int = 5
    max_tasks: int = 2

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: object) -> ListenerSettings:
        values = {
            "dequeue_batch_size": settings.dequeue_batch_size,
            "visibility_timeout": settings.visibility_timeout,
            "min_idle_interval": settings.min_idle_interval,
            "max_idle_interval": settings.max_idle_interval,
            "backoff_delta": settings.backoff_delta,
            "max_dequeue_count": settings.max_dequeue_count,
            "max_tasks": settings.dequeue_tasks,
        }
        return cls(**{**values, **overrides})  # type: ignore[arg-type]


def idle_delay(idle_count: int, settings: ListenerSettings, rng: random.Random = random._inst) -> float:  # type: ignore[attr-defined]
    """Sleep after the ``idle_count``-th consecutive empty poll, jittered even at the cap."""
    jitter = rng.uniform(0.8, 1.2)
    growth = (2 ** min(idle_count, 62) - 1) * jitter * settings.backoff_delta
    capped = min(settings.min_idle_interval + growth, settings.max_idle_interval)
    if capped >= settings.max_idle_interval:
        return settings.max_idle_interval * jitter
    return capped


def depth_rule(depth: int, settings: ListenerSettings) -> int:
    """Default scale rule: one task per full batch of backlog, at least one, at most ``max_tasks``."""
    return max(1, min(settings.max_tasks, math.ceil(depth / settings.dequeue_batch_size)))


@dataclass(frozen=True)
class ListenerState:
    queue: str
    queue_depth: int
    active_tasks: int
    peak_tasks: int
    processed: int
    poisoned: int
    failed_batches: int
    idle_polls: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class QueueListener:
    """Receives batches from one queue and hands them to a handler; see the module docstring."""

    def __init__(
        self,
        *,
        queue: QueueClient,
        handler: Handler,
        poison: PoisonQueue,
        settings: ListenerSettings,
        scale_rule: ScaleRule = depth_rule,
        burst: bool = False,
    ) -> None:
        self._queue = queue
        self._handler = handler
        self._poison = poison
        self._settings = settings
        self._scale_rule = scale_rule
        self._burst = burst
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight: dict[str, QueueMessage] = {}
        self._lease_lock = asyncio.Lock()
        self._depth = 0
        self._peak = 0
        self._processed = 0
        self._poisoned = 0
        self._failed_batches = 0
        self._idle_polls = 0

    @property
    def name(self) -> str:
        return self._queue.queue_name

    def state(self) -> ListenerState:
        """Counters and the last known queue depth (no request is made)."""
        return ListenerState(
            queue=self.name,
            queue_depth=self._depth,
            active_tasks=len(self._tasks),
            peak_tasks=self._peak,
            processed=self._processed,
            poisoned=self._poisoned,
            failed_batches=self._failed_batches,
            idle_polls=self._idle_polls,
        )

    async def run(self) -> None:
        """Run until :meth:`close` (or, in burst mode, until the queue is drained)."""
        renewer = asyncio.create_task(self._renew_leases(), name=f"{self.name}-leases")
        self._start_tasks(1)
        try:
            while self._tasks:
                done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    self._tasks.discard(task)
                    if not task.cancelled() and task.exception() is not None:
                        log.error("dequeue task on %s failed", self.name, exc_info=task.exception())
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)

    def close(self) -> None:
        """Stop receiving; batches in flight finish, then :meth:`run` returns."""
        self._stopping.set()

    def wake(self, depth: int | None = None) -> None:
        """Work detected from outside (a trigger): scale up for ``depth`` messages."""
        if not self._stopping.is_set():
            self._scale_to(depth if depth is not None else self._settings.dequeue_batch_size)

    def _start_tasks(self, count: int) -> None:
        for _ in range(count):
            task = asyncio.create_task(self._dequeue_loop(), name=f"{self.name}-dequeue")
            self._tasks.add(task)
        self._peak = max(self._peak, len(self._tasks))

    def _scale_to(self, depth: int) -> None:
        self._depth = depth
        wanted = self._scale_rule(depth, self._settings)
        if wanted > len(self._tasks):
            self._start_tasks(wanted - len(self._tasks))

    async def _dequeue_loop(self) -> None:
        idle = 0
        errors = 0
        while not self._stopping.is_set():
            try:
                messages = await self._receive()
            except AzureError as exc:
                errors += 1
                pause = min(ERROR_PAUSE_MIN * 2 ** (errors - 1), ERROR_PAUSE_MAX) * random.uniform(0.8, 1.2)
                log.warning("receive from %s failed (%s); retrying in %.1f s", self.name, exc, pause)
                await self._sleep(pause)
                continue
            errors = 0
            if not messages:
                idle += 1
                self._idle_polls += 1
                if self._burst:
                    return
                delay = idle_delay(idle, self._settings)
                if delay >= self._settings.max_idle_interval * 0.8 and len(self._tasks) > 1:
                    return  # scale down: idle long enough and not the last task
                await self._sleep(delay)
                continue
            if idle:
                await self._on_work_detected()
            idle = 0
            await self._process(messages)

    async def _receive(self) -> list[QueueMessage]:
        pages = self._queue.receive_messages(
            messages_per_page=self._settings.dequeue_batch_size,
            max_messages=self._settings.dequeue_batch_size,
            visibility_timeout=self._settings.visibility_timeout,
        ).by_page()
        async for page in pages:
            return [message async for message in page]
        return []

    async def _on_work_detected(self) -> None:
        try:
            properties = await self._queue.get_queue_properties()
        except AzureError as exc:
            log.warning("could not read the depth of %s: %s", self.name, exc)
            return
        self._scale_to(properties.approximate_message_count or 0)

    async def _process(self, messages: list[QueueMessage]) -> None:
        limit = self._settings.max_dequeue_count
        batch = []
        for message in messages:
            if (message.dequeue_count or 0) > limit:
                await self._to_poison(message, f"max_dequeue_count_exceeded ({message.dequeue_count} > {limit})")
            else:
                batch.append(message)
        if not batch:
            return
        self._in_flight.update((m.id, m) for m in batch)
        try:
            poisoned = await self._handler(batch) or {}
        except Exception:
            self._failed_batches += 1
            log.exception("handler failed on %d messages from %s; they will be redelivered", len(batch), self.name)
            await self._sleep(ERROR_PAUSE_MIN)
            return
        finally:
            async with self._lease_lock:
                for message in batch:
                    self._in_flight.pop(message.id, None)
        # Acknowledge late: the handler returned, so what these messages produced is durable.
        for message in batch:
            if message.id in poisoned:
                await self._to_poison(message, poisoned[message.id])
        await asyncio.gather(*(self._delete(m) for m in batch if m.id not in poisoned))
        self._processed += len(batch)

    async def _to_poison(self, message: QueueMessage, reason: str) -> None:
        await self._poison.put(self.name, message, reason)
        await self._delete(message)
        self._poisoned += 1

    async def _delete(self, message: QueueMessage) -> None:
        try:
            await self._queue.delete_message(message)
        except ResourceNotFoundError:
            # The lease was lost (the message reappeared and was taken again): its new holder
            # finishes it, and the downstream idempotency absorbs the repeat.
            log.warning("message %s on %s was already gone when deleted", message.id, self.name)

    async def _renew_leases(self) -> None:
        """Keep in-flight messages invisible while the handler works on them."""
        timeout = self._settings.visibility_timeout
        while True:
            await asyncio.sleep(max(0.5, timeout / 4))
            horizon = datetime.now(timezone.utc) + timedelta(seconds=timeout / 2)
            async with self._lease_lock:
                for message in list(self._in_flight.values()):
                    if message.next_visible_on and message.next_visible_on > horizon:
                        continue
                    try:
                        renewed = await self._queue.update_message(message, visibility_timeout=timeout)
                    except AzureError as exc:
                        log.warning("could not renew the lease of %s on %s: %s", message.id, self.name, exc)
                        continue
                    message.pop_receipt = renewed.pop_receipt
                    message.next_visible_on = renewed.next_visible_on

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
        except TimeoutError:
            pass
