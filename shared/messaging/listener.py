"""The auto-scaling queue listener every role runs (the whitepaper's listener, in asyncio).

Dequeue tasks receive up to ``dequeue_batch_size`` messages per call and hand each batch to the
role's handler; while a task's handler works on one batch, the task already receives the next.
After the ``n``-th consecutive empty poll a task sleeps :func:`idle_delay`; once that sleep reaches
``max_idle_interval`` the task exits unless it is the last one. In push mode (a trigger bus wakes
the listener) the last one exits too, and the listener makes only a slow, jittered safety poll
every ``safety_poll_interval`` so a lost trigger never strands work.

Work detected (a poll finds messages after idling, or :meth:`QueueListener.wake`) asks the scale
rule for the number of tasks the queue depth deserves and starts the difference. Messages are
deleted only after the handler returns (its output is durable by then); while they wait or are
worked on, their visibility is renewed. A message seen more than ``max_dequeue_count`` times, or
one the handler declares poison, moves to the poison queue with its reason.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.queue import QueueMessage
from azure.storage.queue.aio import QueueClient

from ..errors import InfrastructureError
from ..settings import Settings
from . import backoff
from .poison import PoisonQueue, poison_queue_name
from .storage import RequestCounter
from .tally import Tally, tallying

log = logging.getLogger(__name__)

#: The handler gets one received batch; it returns the messages to poison (id → reason).
Handler = Callable[[list[QueueMessage]], Awaitable[Mapping[str, str] | None]]

HAND_BACK_SECONDS = 5.0  # at shutdown, for making cancelled messages visible again
SERVICE_TIME_WEIGHT = 0.3  # weight of the newest sample in the per-message service time average


@dataclass(frozen=True, kw_only=True)
class ListenerSettings:
    """Listener knobs, named as in the whitepaper (the README maps them to ``host.json``)."""

    dequeue_batch_size: int = 32
    visibility_timeout: int = 60
    min_idle_interval: float = 0.0
    max_idle_interval: float = 10.0
    backoff_delta: float = 0.1
    max_dequeue_count: int = 5
    max_tasks: int = 2
    target_drain_seconds: float = 10.0
    push: bool = False
    safety_poll_interval: float = 300.0
    delete_on_receive: bool = False

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
            "target_drain_seconds": settings.target_drain_seconds,
            "safety_poll_interval": settings.safety_poll_interval,
            "delete_on_receive": settings.delete_on_receive,
        }
        return cls(**{**values, **overrides})  # type: ignore[arg-type]


def idle_delay(idle_count: int, settings: ListenerSettings, rng: random.Random = random._inst) -> float:  # type: ignore[attr-defined]
    """Sleep after the ``idle_count``-th consecutive empty poll, jittered even at the cap."""
    jitter = rng.uniform(0.8, 1.2)
    if at_idle_cap(idle_count, settings):
        return settings.max_idle_interval * jitter
    return settings.min_idle_interval + (2**idle_count - 1) * jitter * settings.backoff_delta


def at_idle_cap(idle_count: int, settings: ListenerSettings) -> bool:
    """Whether the back-off has reached ``max_idle_interval`` (ignoring jitter)."""
    growth = (2 ** min(idle_count, 62) - 1) * settings.backoff_delta
    return settings.min_idle_interval + growth >= settings.max_idle_interval


@dataclass(frozen=True)
class Load:
    """What a scale rule sees: the queue depth and the measured seconds per message (if any yet)."""

    depth: int
    service_time: float | None


#: A scale rule: (load, settings) → wanted number of dequeue tasks (clamped to 1..max_tasks).
ScaleRule = Callable[[Load, ListenerSettings], int]


def drain_rule(load: Load, settings: ListenerSettings) -> int:
    """Enough tasks to drain the backlog within ``target_drain_seconds`` at the measured service
    time; before any measurement, one task per full batch of backlog."""
    if load.service_time is None:
        return math.ceil(load.depth / settings.dequeue_batch_size)
    return math.ceil(load.depth * load.service_time / settings.target_drain_seconds)


def whitepaper_rule(load: Load, settings: ListenerSettings) -> int:
    """The whitepaper's fixed table: < 100 messages → 10 tasks, < 1,000 → 50, else 100."""
    if load.depth < 100:
        return 10
    return 50 if load.depth < 1000 else 100


SCALE_RULES: dict[str, ScaleRule] = {"drain": drain_rule, "whitepaper": whitepaper_rule}


@dataclass(frozen=True)
class ListenerState:
    queue: str
    queue_depth: int
    active_tasks: int
    peak_tasks: int
    processed: int
    poisoned: int
    failed_batches: int
    task_errors: int
    idle_polls: int
    requests: int
    service_time: float | None
    last_receive_at: float | None

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
        scale_rule: ScaleRule = drain_rule,
        counter: RequestCounter | None = None,
        burst: bool = False,
    ) -> None:
        self._queue = queue
        self._handler = handler
        self._poison = poison
        self._settings = settings
        self._scale_rule = scale_rule
        self._counter = counter
        self._burst = burst
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()
        self._wakeup = asyncio.Event()  # set (and replaced) by each trigger: cuts idle sleeps short
        self._wakes = 0  # triggers so far: one that comes while a poll is under way is not lost
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight: dict[str, QueueMessage] = {}
        self._lease_lock = asyncio.Lock()
        self._depth = 0
        self._peak = 0
        self._processed = 0
        self._poisoned = 0
        self._failed_batches = 0
        self._task_errors = 0
        self._idle_polls = 0
        self._service_time: float | None = None
        self._last_receive_at: float | None = None

    @property
    def name(self) -> str:
        return self._queue.queue_name

    @property
    def settings(self) -> ListenerSettings:
        return self._settings

    def state(self) -> ListenerState:
        """Counters and the last known queue depth (no request is made)."""
        requests = 0
        if self._counter is not None:
            requests = self._counter.by_resource[self.name] + self._counter.by_resource[poison_queue_name(self.name)]
        return ListenerState(
            queue=self.name,
            queue_depth=self._depth,
            active_tasks=len(self._tasks),
            peak_tasks=self._peak,
            processed=self._processed,
            poisoned=self._poisoned,
            failed_batches=self._failed_batches,
            task_errors=self._task_errors,
            idle_polls=self._idle_polls,
            requests=requests,
            service_time=self._service_time,
            last_receive_at=self._last_receive_at,
        )

    async def run(self) -> None:
        """Run until :meth:`close` (or, in burst mode, until the queue is drained)."""
        renewer = asyncio.create_task(self._renew_leases(), name=f"{self.name}-leases")
        self._start_tasks(1)
        try:
            while True:
                self._changed.clear()
                if self._tasks:
                    await self._changed.wait()
                elif self._stopping.is_set() or self._burst:
                    return
                elif not self._settings.push:
                    self._start_tasks(1)  # pull mode always keeps one poller
                elif not await self._wait_changed(self._safety_delay()):
                    self._start_tasks(1, probe=True)
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
            await self._hand_back()

    def close(self) -> None:
        """Stop receiving; batches in flight finish, then :meth:`run` returns."""
        self._stopping.set()
        self._changed.set()

    def wake(self, depth: int | None = None) -> None:
        """Work detected from outside (a trigger): idle tasks poll now, and the rule scales the
        listener up for ``depth`` messages."""
        if self._stopping.is_set():
            return
        self._wakes += 1
        self._wakeup.set()
        self._wakeup = asyncio.Event()
        self._scale_to(depth if depth is not None else self._settings.dequeue_batch_size)

    def _safety_delay(self) -> float:
        return self._settings.safety_poll_interval * random.uniform(0.8, 1.2)

    async def _wait_changed(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout=timeout)
        except TimeoutError:
            return False
        return True

    def _start_tasks(self, count: int, *, probe: bool = False) -> None:
        for _ in range(count):
            task = asyncio.create_task(self._dequeue_loop(probe=probe), name=f"{self.name}-dequeue")
            self._tasks.add(task)
            task.add_done_callback(self._task_done)
        self._peak = max(self._peak, len(self._tasks))
        self._changed.set()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._task_errors += 1
            log.error("dequeue task on %s ended with an error", self.name, exc_info=task.exception())
        self._changed.set()

    def _scale_to(self, depth: int) -> None:
        self._depth = depth
        wanted = max(
            1, min(self._settings.max_tasks, self._scale_rule(Load(depth, self._service_time), self._settings))
        )
        if wanted > len(self._tasks):
            log.debug(
                "%s: %d messages waiting, scaling from %d to %d tasks", self.name, depth, len(self._tasks), wanted
            )
            self._start_tasks(wanted - len(self._tasks))

    def _leave(self) -> bool:
        """Scale down: the calling task leaves unless it is the last (in pull mode)."""
        if len(self._tasks) > 1 or self._settings.push:
            self._tasks.discard(asyncio.current_task())  # type: ignore[arg-type]
            return True
        return False

    async def _dequeue_loop(self, *, probe: bool) -> None:
        """Receive and process until stopped or scaled down; a probe leaves after one empty poll."""
        idle = 0
        errors = 0
        pending: asyncio.Task[None] | None = None
        try:
            while not self._stopping.is_set():
                wakes = self._wakes
                try:
                    with tallying(received := Tally()):
                        messages = await self._receive()
                except Exception as exc:
                    errors += 1
                    wait = backoff.pause(errors)
                    log.warning(
                        "receive from %s failed (%s); retrying in %.1f s", self.name, exc, wait, exc_info=errors == 1
                    )
                    await self._sleep(wait)
                    continue
                errors = 0
                if not messages:
                    if pending is not None:
                        await pending
                        pending = None
                    self._idle_polls += 1
                    if self._wakes != wakes and not self._burst:
                        continue  # a trigger came after this poll was sent: poll again at once
                    idle += 1
                    if self._burst or ((probe or at_idle_cap(idle, self._settings)) and self._leave()):
                        return
                    await self._sleep(idle_delay(idle, self._settings), wakeup=self._wakeup)
                    continue
                if idle or probe:
                    probe = False
                    await self._on_work_detected()
                idle = 0
                if pending is not None:
                    await pending
                pending = asyncio.create_task(self._process(messages, received), name=f"{self.name}-process")
        except asyncio.CancelledError:
            if pending is not None:
                pending.cancel()  # a shutdown past its deadline: run() hands its messages back
            raise
        finally:
            if pending is not None:
                await pending

    async def _receive(self) -> list[QueueMessage]:
        pages = self._queue.receive_messages(
            messages_per_page=self._settings.dequeue_batch_size,
            max_messages=self._settings.dequeue_batch_size,
            visibility_timeout=self._settings.visibility_timeout,
        ).by_page()
        async for page in pages:
            messages = [message async for message in page]
            if messages:
                self._last_receive_at = time.time()
                async with self._lease_lock:
                    self._in_flight.update((m.id, m) for m in messages)
            return messages
        return []

    async def _on_work_detected(self) -> None:
        try:
            properties = await self._queue.get_queue_properties()
        except Exception as exc:
            log.warning("could not read the depth of %s: %s", self.name, exc)
            return
        self._scale_to(properties.approximate_message_count or 0)

    async def _process(self, messages: list[QueueMessage], received: Tally) -> None:
        """Poison the worn-out, hand the rest to the handler, then acknowledge them; every request
        made for them counts in the tally their receive started."""
        try:
            with tallying(received):
                limit = self._settings.max_dequeue_count
                batch = []
                for message in messages:
                    if (message.dequeue_count or 0) > limit:
                        await self._to_poison(
                            message, f"max_dequeue_count_exceeded ({message.dequeue_count} > {limit})"
                        )
                    else:
                        batch.append(message)
                if batch:
                    await self._handle(batch, received)
        except Exception:
            self._failed_batches += 1
            log.exception("could not finish %d messages from %s; they will be redelivered", len(messages), self.name)
        # Done with them (a cancellation skips this: run() hands them back).
        async with self._lease_lock:
            for message in messages:
                self._in_flight.pop(message.id, None)

    async def _handle(self, batch: list[QueueMessage], received: Tally) -> None:
        if self._settings.delete_on_receive:
            await asyncio.gather(*(self._delete(m) for m in batch))
        else:
            received.charge_ahead("queue.delete", len(batch))  # the deletes after the handler: its messages carry them
        started = time.monotonic()
        try:
            poisoned = await self._handler(batch) or {}
        except Exception as exc:
            self._failed_batches += 1
            log.warning(
                "handler failed on %d messages from %s (%s); they will be redelivered",
                len(batch),
                self.name,
                exc,
                exc_info=not isinstance(exc, InfrastructureError),  # an outage needs no traceback
            )
            await self._sleep(backoff.PAUSE_MIN)
            return
        self._observe((time.monotonic() - started) / len(batch))
        # Acknowledge late: the handler returned, so what these messages produced is durable.
        for message in batch:
            if message.id in poisoned:
                await self._to_poison(message, poisoned[message.id])
        if not self._settings.delete_on_receive:
            await asyncio.gather(*(self._delete(m) for m in batch if m.id not in poisoned))
        self._processed += len(batch)

    def _observe(self, seconds_per_message: float) -> None:
        previous = self._service_time
        self._service_time = (
            seconds_per_message
            if previous is None
            else (previous + SERVICE_TIME_WEIGHT * (seconds_per_message - previous))
        )

    async def _to_poison(self, message: QueueMessage, reason: str) -> None:
        await self._poison.put(self.name, message, reason)
        await self._delete(message)
        self._poisoned += 1

    async def _delete(self, message: QueueMessage) -> None:
        try:
            try:
                await self._queue.delete_message(message)
            except HttpResponseError as exc:
                if exc.error_code != "PopReceiptMismatch":
                    raise
                async with self._lease_lock:  # a renewal was under way: use its new receipt
                    await self._queue.delete_message(message)
        except ResourceNotFoundError:
            # The lease was lost (the message reappeared and was taken again): its new holder
            # finishes it, and the downstream idempotency absorbs the repeat.
            log.warning("message %s on %s was already gone when deleted", message.id, self.name)

    async def _hand_back(self) -> None:
        """Make messages whose handling was cancelled (a shutdown past its deadline) visible again
        at once rather than after their visibility timeout; best effort, within a few seconds."""
        messages = list(self._in_flight.values())
        self._in_flight.clear()
        if not messages:
            return
        released = asyncio.gather(
            *(self._queue.update_message(m, visibility_timeout=0) for m in messages), return_exceptions=True
        )
        try:
            outcomes = await asyncio.wait_for(released, timeout=HAND_BACK_SECONDS)
        except TimeoutError:
            outcomes = [TimeoutError()] * len(messages)
        failed = sum(isinstance(outcome, BaseException) for outcome in outcomes)
        log.info(
            "handed back %d messages on %s (%d already gone or unreachable)", len(messages) - failed, self.name, failed
        )

    async def _renew_leases(self) -> None:
        """Keep received messages invisible while they wait for or go through the handler."""
        timeout = self._settings.visibility_timeout
        while True:
            await asyncio.sleep(max(0.5, timeout / 4))
            horizon = datetime.now(UTC) + timedelta(seconds=timeout / 2)
            async with self._lease_lock:
                for message in list(self._in_flight.values()):
                    if message.next_visible_on and message.next_visible_on > horizon:
                        continue
                    try:
                        renewed = await self._queue.update_message(message, visibility_timeout=timeout)
                    except Exception as exc:
                        log.warning("could not renew the lease of %s on %s: %s", message.id, self.name, exc)
                        continue
                    message.pop_receipt = renewed.pop_receipt
                    message.next_visible_on = renewed.next_visible_on

    async def _sleep(self, seconds: float, *, wakeup: asyncio.Event | None = None) -> None:
        """Sleep, ending early when the listener stops (or ``wakeup`` is set)."""
        events = [self._stopping, *([wakeup] if wakeup is not None else [])]
        waiters = [asyncio.ensure_future(event.wait()) for event in events]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()


def listener_settings(settings: Settings, *, push: bool, queues: int = 1, **overrides: object) -> ListenerSettings:
    """Listener settings for one of ``queues`` listeners of an instance: in push mode they share
    the instance's one safety poll per ``safety_poll_interval``, each polling 1/``queues`` as often."""
    base = ListenerSettings.from_settings(settings, **overrides)
    return replace(base, push=push, safety_poll_interval=settings.safety_poll_interval * queues)
