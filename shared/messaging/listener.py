"""The auto-scaling queue listener every role runs (the whitepaper's listener, in asyncio).

Dequeue tasks receive up to ``dequeue_batch_size`` messages per call and hand each batch to the
role's handler; while a task's handler works on one batch, the task already receives the next
(``prefetch``; without it, the next receive waits for the handler and takes what arrived meanwhile:
fewer, fuller batches for a handler whose cost is mostly per batch).
After the ``n``-th consecutive empty poll a task sleeps :func:`idle_delay`; once that sleep reaches
``max_idle_interval`` the task exits unless it is the last one. In push mode (a trigger bus wakes
the listener) the last one exits too, and the listener makes only a slow, jittered safety poll
every ``safety_poll_interval`` so a lost trigger never strands work. Nothing announces a message
whose receiver died, though: it reappears when its lease runs out. So a listener that goes idle
after work reads the depth once, and while the queue holds messages that it does not hold itself,
it looks every ``recovery_poll_interval`` instead (:meth:`QueueListener._idle_wait`).

Given a :class:`~shared.messaging.capacity.Capacity` (the processor's, shared by its listeners), a
task receives no more messages than there are free slots, waiting for one, and each message is
processed in a task of its own that gives its slot back when it ends: an instance holds only the
work it can start soon, and the rest of the queue stays visible to other instances.

Work detected (a poll finds messages after idling, or :meth:`QueueListener.wake`) asks the scale
rule for the number of tasks the queue depth deserves and starts the difference. Work that keeps
coming does too: while receives return full batches below ``max_tasks``, the depth is read again
every ``rescale_interval``, so a backlog that grew after the first look still scales up. Messages are
deleted only after the handler returns (its output is durable by then); while they wait or are
worked on, :class:`~shared.messaging.leases.Leases` renews their visibility. A message seen more
than ``max_dequeue_count`` times, or one the handler declares poison, moves to the poison queue
with its reason. A handler that fails otherwise leaves its messages to be redelivered, except for
a :class:`~shared.errors.ConfigurationError`: retrying cannot help, so the listener hands the
messages back and stops, and :meth:`QueueListener.run` raises the error.

The parts: the scaling supervisor (:meth:`QueueListener.run`, which owns the dequeue tasks), the
receive loop of each task (:meth:`QueueListener._dequeue_loop`), acknowledgement and poison
(:meth:`QueueListener._process`), the leases, the counters (:class:`ListenerStats`), and the settings,
idle back-off and scale rules (:mod:`shared.messaging.scaling`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass

from azure.storage.queue import QueueMessage
from azure.storage.queue.aio import QueueClient

from ..errors import ConfigurationError, is_transient
from . import backoff
from .capacity import Capacity
from .leases import Leases
from .poison import PoisonQueue, poison_queue_name
from .scaling import ListenerSettings, Load, ScaleRule, at_idle_cap, drain_rule, idle_delay
from .storage import RequestCounter
from .tally import Tally, tallying

log = logging.getLogger(__name__)

#: The handler gets one received batch; it returns the messages to poison (id → reason).
Handler = Callable[[list[QueueMessage]], Awaitable[Mapping[str, str] | None]]

SERVICE_TIME_WEIGHT = 0.3  # weight of the newest sample in the per-message service time average


@dataclass(kw_only=True)
class ListenerStats:
    """What a listener counts, in one place: its tasks, messages and measurements."""

    queue_depth: int = 0  # the last known depth (from a depth read or a trigger)
    peak_tasks: int = 0
    processed: int = 0
    poisoned: int = 0
    failed_batches: int = 0
    task_errors: int = 0
    idle_polls: int = 0
    service_time: float | None = None  # seconds per message, a moving average
    last_receive_at: float | None = None  # wall clock of the last receive that got messages

    def observe(self, seconds_per_message: float) -> None:
        """Fold one handled batch's seconds per message into :attr:`service_time`."""
        previous = self.service_time
        self.service_time = (
            seconds_per_message
            if previous is None
            else (previous + SERVICE_TIME_WEIGHT * (seconds_per_message - previous))
        )


@dataclass(kw_only=True)
class ListenerState(ListenerStats):
    """A snapshot of a listener: its stats, with its queue, running tasks and requests made."""

    queue: str
    active_tasks: int
    requests: int

    def to_dict(self) -> dict[str, object]:
        return {"queue": self.queue, **asdict(self)}


class QueueListener:
    """Receives batches from one queue and hands them to a handler; see the module docstring.

    :meth:`run` until :meth:`stop` (graceful: in-flight batches finish) or, in burst mode, until the
    queue is drained; what a cancellation leaves unfinished is handed back when run ends.
    """

    def __init__(
        self,
        *,
        queue: QueueClient,
        handler: Handler,
        poison: PoisonQueue,
        settings: ListenerSettings,
        scale_rule: ScaleRule = drain_rule,
        counter: RequestCounter | None = None,
        capacity: Capacity | None = None,
        burst: bool = False,
    ) -> None:
        self._queue = queue
        self._handler = handler
        self._poison = poison
        self._settings = settings
        self._scale_rule = scale_rule
        self._counter = counter
        self._burst = burst
        self._capacity = capacity
        self._leases = Leases(queue, visibility_timeout=settings.visibility_timeout)
        self._stats = ListenerStats()
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()  # a task started or ended, or stop() was called
        self._wakeup = asyncio.Event()  # set (and replaced) by each trigger: cuts idle sleeps short
        self._wakes = 0  # triggers so far: one that comes while a poll is under way is not lost
        self._tasks: set[asyncio.Task[None]] = set()  # the dequeue tasks; only _task_done removes one
        self._leaving: set[asyncio.Task[None]] = set()  # those of them scaling down (ending now)
        self._work: set[asyncio.Task[None]] = set()  # with a capacity: each received message's processing
        self._failure: ConfigurationError | None = None
        self._depth_known_at = -math.inf  # monotonic time of the last depth read or trigger
        self._unseen = True  # the queue may hold messages leased by others (see _idle_wait)

    @property
    def name(self) -> str:
        return self._queue.queue_name

    @property
    def settings(self) -> ListenerSettings:
        return self._settings

    @property
    def stats(self) -> ListenerStats:
        """The live counters (see :meth:`state` for a snapshot)."""
        return self._stats

    def state(self) -> ListenerState:
        """The counters, the running tasks and the requests made so far (no request is made)."""
        requests = 0
        if self._counter is not None:
            requests = self._counter.by_resource[self.name] + self._counter.by_resource[poison_queue_name(self.name)]
        return ListenerState(queue=self.name, active_tasks=self._active(), requests=requests, **asdict(self._stats))

    async def run(self) -> None:
        """Run until :meth:`stop` (or, in burst mode, until the queue is drained); raises the
        :class:`ConfigurationError` that stopped the listener, if one did."""
        async with self._leases.renewing():
            self._start_tasks(1)
            try:
                await self._supervise()
                await asyncio.gather(*self._work, return_exceptions=True)  # what was received finishes
            finally:
                running = [*self._tasks, *self._work]
                for task in running:
                    task.cancel()
                await asyncio.gather(*running, return_exceptions=True)
        if self._failure is not None:
            raise self._failure

    def stop(self) -> None:
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
        self._unseen = True
        self._depth_known_at = time.monotonic()  # a trigger's depth is as good as a read
        self._scale_to(depth if depth is not None else self._settings.dequeue_batch_size)

    # Scaling: how many dequeue tasks run.

    async def _supervise(self) -> None:
        """Keep the dequeue tasks going until stopped (burst: until the last one ends)."""
        while True:
            self._changed.clear()
            if self._tasks:
                await self._changed.wait()
            elif self._stopping.is_set() or self._burst:
                return
            elif not self._settings.push:
                self._start_tasks(1)  # pull mode always keeps one poller
            elif not await self._wait_changed(await self._idle_wait()):
                self._start_tasks(1, probe=True)

    async def _idle_wait(self) -> float:
        """Seconds a push-mode listener with no dequeue task waits before it polls unasked.

        Nothing announces a message that reappears when its lease runs out (its receiver died), so
        after it has seen work (or started), the listener reads the depth once: while the queue
        holds more messages than the listener itself holds, someone else has them out of sight, and
        it looks again every ``recovery_poll_interval``. Otherwise only the slow safety poll runs:
        an idle queue costs no more requests than before."""
        if self._unseen:
            depth = await self._depth()
            self._unseen = depth is None or depth > len(self._leases)
        interval = self._settings.recovery_poll_interval if self._unseen else self._settings.safety_poll_interval
        return interval * random.uniform(0.8, 1.2)

    async def _wait_changed(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout=seconds)
        except TimeoutError:
            return False
        return True

    def _active(self) -> int:
        """Dequeue tasks that are not leaving."""
        return len(self._tasks) - len(self._leaving)

    def _start_tasks(self, count: int, *, probe: bool = False) -> None:
        for _ in range(count):
            task = asyncio.create_task(self._dequeue_loop(probe=probe), name=f"{self.name}-dequeue")
            self._tasks.add(task)
            task.add_done_callback(self._task_done)
        self._stats.peak_tasks = max(self._stats.peak_tasks, self._active())
        self._changed.set()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """The one place a dequeue task leaves the task set; its result is collected here."""
        self._tasks.discard(task)
        self._leaving.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            self._stats.task_errors += 1
            log.error("dequeue task on %s ended with an error", self.name, exc_info=error)
        self._changed.set()

    def _scale_to(self, depth: int) -> None:
        self._stats.queue_depth = depth
        active = self._active()
        wanted = max(
            1, min(self._settings.max_tasks, self._scale_rule(Load(depth, self._stats.service_time), self._settings))
        )
        if wanted > active:
            log.debug("%s: %d messages waiting, scaling from %d to %d tasks", self.name, depth, active, wanted)
            self._start_tasks(wanted - active)

    def _leave(self) -> bool:
        """Scale down: the calling task leaves unless it is the last (in pull mode)."""
        if self._active() > 1 or self._settings.push:
            task = asyncio.current_task()
            assert task is not None and task in self._tasks
            self._leaving.add(task)
            return True
        return False

    # Receiving: the loop of each dequeue task.

    async def _dequeue_loop(self, *, probe: bool) -> None:
        """Receive and process until stopped or scaled down; a probe leaves after one empty poll."""
        idle = 0
        errors = 0
        pending: asyncio.Task[None] | None = None
        try:
            while not self._stopping.is_set():
                if not (slots := await self._claim()):
                    break  # stopped while waiting for a free slot
                wakes = self._wakes
                try:
                    with tallying(received := Tally()):
                        messages = await self._receive(slots)
                except Exception as exc:
                    self._unclaim(slots)
                    errors += 1
                    wait = backoff.pause(errors)
                    log.warning(
                        "receive from %s failed (%s); retrying in %.1f s", self.name, exc, wait, exc_info=errors == 1
                    )
                    await self._sleep(wait)
                    continue
                errors = 0
                self._unclaim(slots - len(messages))
                if not messages:
                    if pending is not None:
                        await pending
                        pending = None
                    self._stats.idle_polls += 1
                    if self._wakes != wakes and not self._burst:
                        continue  # a trigger came after this poll was sent: poll again at once
                    idle += 1
                    if self._burst or ((probe or at_idle_cap(idle, self._settings)) and self._leave()):
                        return
                    await self._sleep(idle_delay(idle, self._settings), wakeup=self._wakeup)
                    continue
                if idle or probe or self._backlog_may_have_grown(len(messages)):
                    probe = False
                    await self._on_work_detected()
                idle = 0
                if self._capacity is not None:
                    for message in messages:  # each starts as soon as it is received, and ends on its own
                        self._start_work(message, received)
                    continue
                if pending is not None:
                    await pending
                pending = asyncio.create_task(self._process(messages, received), name=f"{self.name}-process")
                if not self._settings.prefetch:
                    await pending
                    pending = None
        except asyncio.CancelledError:
            if pending is not None:
                pending.cancel()  # a shutdown past its deadline: run() hands its messages back
            raise
        finally:
            if pending is not None:
                await pending

    async def _claim(self) -> int:
        """How many messages the next receive may take: a full batch, or with a capacity the slots
        free (waiting for one); 0 if the listener stops meanwhile."""
        if self._capacity is None:
            return self._settings.dequeue_batch_size
        taking = asyncio.ensure_future(self._capacity.take(self._settings.dequeue_batch_size))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait([taking, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not taking.done():
                taking.cancel()  # the semaphore gives back a slot it had granted meanwhile
            elif not taking.cancelled() and (self._stopping.is_set() or _cancelling()):
                self._capacity.give(taking.result())
        if not taking.done() or taking.cancelled() or self._stopping.is_set():
            return 0
        return taking.result()

    def _unclaim(self, slots: int) -> None:
        """Give back slots a receive did not fill."""
        if self._capacity is not None and slots > 0:
            self._capacity.give(slots)

    async def _receive(self, count: int) -> list[QueueMessage]:
        pages = self._queue.receive_messages(
            messages_per_page=count, max_messages=count, visibility_timeout=self._settings.visibility_timeout
        ).by_page()
        async for page in pages:
            messages = [message async for message in page]
            if messages:
                self._unseen = True
                self._stats.last_receive_at = time.time()
                await self._leases.hold(messages)
            return messages
        return []

    def _backlog_may_have_grown(self, received: int) -> bool:
        """A full batch, and the known depth is older than ``rescale_interval``: worth a new look."""
        return (
            received >= self._settings.dequeue_batch_size
            and time.monotonic() - self._depth_known_at >= self._settings.rescale_interval
        )

    async def _on_work_detected(self) -> None:
        if self._active() >= self._settings.max_tasks:
            return  # no room to scale up: the depth would change nothing, and reading it is a request
        self._depth_known_at = time.monotonic()  # the other tasks' full batches need not read it too
        if (depth := await self._depth()) is not None:
            self._scale_to(depth)

    async def _depth(self) -> int | None:
        """The queue's approximate message count, leased messages included (None if it cannot be read)."""
        try:
            properties = await self._queue.get_queue_properties()
        except Exception as exc:
            log.warning("could not read the depth of %s: %s", self.name, exc)
            return None
        return properties.approximate_message_count or 0

    # Acknowledgement and poison: what happens to a received batch.

    def _start_work(self, message: QueueMessage, received: Tally) -> None:
        """Process one message in a task of its own, owned by the listener; its slot is given back when it ends."""
        task = asyncio.create_task(self._process([message], received), name=f"{self.name}-work")
        self._work.add(task)
        task.add_done_callback(self._work_done)

    def _work_done(self, task: asyncio.Task[None]) -> None:
        self._work.discard(task)
        self._unclaim(1)
        if not task.cancelled() and (error := task.exception()) is not None:
            self._stats.task_errors += 1
            log.error("work on %s ended with an error", self.name, exc_info=error)

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
        except ConfigurationError as exc:
            # Not their fault: none is poisoned or lost. They stay held until run() hands them back, once no
            # receive is in flight (one that ended after the hand-back would take them again).
            self._fail(exc)
            return
        except Exception:
            self._stats.failed_batches += 1
            log.exception("could not finish %d messages from %s; they will be redelivered", len(messages), self.name)
        # Done with them (a cancellation skips this too: run() hands them back).
        await self._leases.release(messages)

    async def _handle(self, batch: list[QueueMessage], received: Tally) -> None:
        if self._settings.delete_on_receive:
            await asyncio.gather(*(self._leases.delete(m) for m in batch))
        else:
            received.charge_ahead("queue.delete", len(batch))  # the deletes after the handler: its messages carry them
        started = time.monotonic()
        try:
            poisoned = await self._handler(batch) or {}
        except ConfigurationError:
            raise
        except Exception as exc:
            self._stats.failed_batches += 1
            log.warning(
                "handler failed on %d messages from %s (%s); they will be redelivered",
                len(batch),
                self.name,
                exc,
                exc_info=not is_transient(exc),  # an outage needs no traceback
            )
            await self._sleep(backoff.PAUSE_MIN)
            return
        self._stats.observe((time.monotonic() - started) / len(batch))
        # Acknowledge late: the handler returned, so what these messages produced is durable.
        for message in batch:
            if message.id in poisoned:
                await self._to_poison(message, poisoned[message.id])
        if not self._settings.delete_on_receive:
            await asyncio.gather(*(self._leases.delete(m) for m in batch if m.id not in poisoned))
        self._stats.processed += len(batch)

    async def _to_poison(self, message: QueueMessage, reason: str) -> None:
        await self._poison.put(self.name, message, reason)
        await self._leases.delete(message)
        self._stats.poisoned += 1

    def _fail(self, exc: ConfigurationError) -> None:
        """Retrying cannot help: stop the listener; :meth:`run` raises ``exc`` once it has stopped."""
        if self._failure is None:
            self._failure = exc
            log.warning("%s stops: its handler met a configuration error; the batch goes back to the queue", self.name)
        self.stop()

    async def _sleep(self, seconds: float, *, wakeup: asyncio.Event | None = None) -> None:
        """Sleep, ending early when the listener stops (or ``wakeup`` is set)."""
        events = [self._stopping, *([wakeup] if wakeup is not None else [])]
        waiters = [asyncio.ensure_future(event.wait()) for event in events]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()


def _cancelling() -> bool:
    """Whether the current task is being cancelled."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
