"""``billing bench-listener``: what the listener and its triggers cost and how fast they react.

Measured on a fresh local Azurite (real requests, counted by the SDK pipeline policy):

* trigger wake-up latency, publish → first receive, p50/p95, over the local bus and over Service
  Bus when ``BILLING_SERVICEBUS_CONNECTION_STRING`` names a namespace (a real one, or the test
  broker: ``python tests/support/servicebus_broker.py``, which speaks Service Bus's AMQP);
* storage requests per idle hour of one processor process with 4 partitions: pull mode, push mode
  (local bus), and the whitepaper's naive fixed 1 s polling, all in the same run. Push mode is
  measured with a short safety-poll interval and scaled to the configured one (the requests per
  safety poll are what is measured; their number per hour follows from the interval);
* how long dequeue tasks take to scale from zero to the rule's count after a trigger, and back.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path

from azure.storage.queue import QueueMessage
from pydantic import SecretStr
from rich.console import Console
from rich.table import Table

from shared.localstack import AzuriteStack
from shared.messaging.envelope import ClaimCheck
from shared.messaging.listener import QueueListener
from shared.messaging.poison import PoisonQueue
from shared.messaging.scaling import ListenerSettings
from shared.messaging.storage import Storage
from shared.messaging.triggers import TriggerBus, trigger_bus
from shared.settings import Settings


@dataclass(frozen=True)
class ListenerBench:
    wake_latency_ms: dict[str, dict[str, float]]  # backend → p50 / p95 / max
    idle_requests_per_hour: dict[str, float]  # mode → requests per idle hour per processor
    idle_window_seconds: float
    scale_up_seconds: float
    scale_up_tasks: int
    scale_down_seconds: float


def run(*, trials: int, idle_seconds: float, output: Path | None, console: Console) -> ListenerBench:
    """Run every measurement and print one table."""
    result = measure(trials=trials, idle_seconds=idle_seconds, console=console)
    _print(result, Settings(), console)
    if output is not None:
        output.write_text(json.dumps(asdict(result), indent=2))
        console.print(f"wrote {output}")
    return result


def measure(*, trials: int, idle_seconds: float, console: Console) -> ListenerBench:
    """Every measurement, on a fresh local Azurite."""
    with tempfile.TemporaryDirectory(prefix="billing-listener-bench-") as scratch:
        home = Path(scratch)
        stack = AzuriteStack(home=home, persist=False)
        settings = Settings(home=home, storage_connection_string=SecretStr(stack.start()), queue_prefix="bench")
        try:
            latency = {"local": asyncio.run(_wake_latency(settings, trials))}
            with _servicebus(settings) as sb_settings:
                if sb_settings is not None:
                    latency["servicebus"] = asyncio.run(_wake_latency(sb_settings, trials))
            with console.status("scaling from zero and back"):
                up, tasks, down = asyncio.run(_scaling(settings))
            with console.status(f"idle processors for {idle_seconds:.0f} s"):
                idle = _idle_requests(settings, idle_seconds)
        finally:
            stack.stop()
    return ListenerBench(latency, idle, idle_seconds, up, tasks, down)


# --- wake-up latency ------------------------------------------------------------------------


async def _wake_latency(settings: Settings, trials: int) -> dict[str, float]:
    """Publish a trigger for a message just sent; time until the idle listener has received it."""
    received: asyncio.Queue[float] = asyncio.Queue()

    async def handler(messages: list[QueueMessage]) -> Mapping[str, str]:
        received.put_nowait(time.perf_counter())
        return {}

    async with (
        Storage(settings) as storage,
        _bus(settings, storage) as subscriber,
        _bus(settings, storage) as publisher,
    ):
        queue = settings.input_queues[0]
        await storage.ensure(queues=[queue])
        listener = _listener(storage, settings, queue, handler, push=True, max_idle_interval=0.2)
        subscriber.subscribe(lambda event: listener.wake(event.messages) if event.queue == queue else None)
        await asyncio.sleep(1.0)  # the subscription is registered
        runner = asyncio.create_task(listener.run())
        samples = []
        for _ in range(trials):
            while listener.state().active_tasks:
                await asyncio.sleep(0.05)
            await storage.queue(queue).send_message("work")
            published = time.perf_counter()
            await publisher.announce(storage.account_name, {queue: (1, 1)})
            samples.append(1000 * (await asyncio.wait_for(received.get(), 30) - published))
        listener.stop()
        await runner
    samples.sort()
    return {
        "p50": round(statistics.median(samples), 1),
        "p95": round(samples[max(0, round(0.95 * len(samples)) - 1)], 1),
        "max": round(samples[-1], 1),
    }


@asynccontextmanager
async def _bus(settings: Settings, storage: Storage) -> AsyncIterator[TriggerBus]:
    bus = trigger_bus(settings, storage)
    assert bus is not None
    async with bus:
        yield bus


@contextmanager
def _servicebus(settings: Settings) -> Iterator[Settings | None]:
    """Settings for the Service Bus backend on the configured namespace (``BILLING_SERVICEBUS_*``);
    None when none is configured, and the Service Bus rows are left out."""
    configured = Settings()
    if configured.servicebus_connection_string is None:
        yield None
        return
    yield settings.model_copy(
        update={
            "servicebus_connection_string": configured.servicebus_connection_string,
            "trigger_create_subscription": configured.trigger_create_subscription,
        }
    )


# --- scaling --------------------------------------------------------------------------------


async def _scaling(settings: Settings, messages: int = 2_000) -> tuple[float, int, float]:
    """An idle listener at zero tasks gets a trigger for a backlog: how many tasks the rule
    starts and how soon the first batch is in; once drained, seconds until it is back at zero
    (default idle settings: the back-off has to reach ``max_idle_interval`` first)."""
    done = asyncio.Event()
    handled: list[tuple[float, int]] = []  # when each batch reached the handler, and its size

    async def handler(batch: list[QueueMessage]) -> Mapping[str, str]:
        handled.append((time.perf_counter(), len(batch)))
        await asyncio.sleep(0.01 * len(batch))  # 10 ms of work per message
        if sum(size for _, size in handled) >= messages:
            done.set()
        return {}

    async with Storage(settings) as storage:
        queue = f"{settings.queue_prefix}-scaling"
        await storage.ensure(queues=[queue])
        listener = _listener(storage, settings, queue, handler, push=True, max_tasks=16, safety_poll_interval=3600)
        runner = asyncio.create_task(listener.run())
        while not listener.state().active_tasks:  # started ...
            await asyncio.sleep(0.01)
        await _until_idle(listener)  # ... and idled down to zero tasks
        client = storage.queue(queue)
        for start in range(0, messages, 200):
            await asyncio.gather(*(client.send_message("x") for _ in range(start, min(messages, start + 200))))
        woken = time.perf_counter()
        listener.wake(messages)
        await done.wait()
        tasks = listener.state().peak_tasks
        drained = time.perf_counter()
        await _until_idle(listener)
        down = time.perf_counter() - drained
        listener.stop()
        await runner
    return round(handled[0][0] - woken, 4), tasks, round(down, 1)


async def _until_idle(listener: QueueListener) -> None:
    while listener.state().active_tasks:
        await asyncio.sleep(0.05)


def _listener(storage: Storage, settings: Settings, queue: str, handler, **overrides: object) -> QueueListener:  # type: ignore[no-untyped-def]
    claim_check = ClaimCheck(storage, container=settings.work_container, limit=settings.max_message_bytes)
    return QueueListener(
        queue=storage.queue(queue),
        handler=handler,
        poison=PoisonQueue(storage, claim_check),
        settings=replace(ListenerSettings.from_settings(settings), **overrides),  # type: ignore[arg-type]
        counter=storage.counter,
    )


# --- idle cost ------------------------------------------------------------------------------

SAFETY_FOR_MEASUREMENT = 5.0


def _idle_requests(settings: Settings, seconds: float) -> dict[str, float]:
    """Storage requests per idle hour of one processor process (4 partitions), per mode."""
    modes = {
        "pull (back-off to 10 s)": {"BILLING_TRIGGER_BACKEND": "none"},
        "push (local bus)": {
            "BILLING_TRIGGER_BACKEND": "local",
            "BILLING_SAFETY_POLL_INTERVAL": str(SAFETY_FOR_MEASUREMENT),
        },
        "naive 1 s polling": {
            "BILLING_TRIGGER_BACKEND": "none",
            "BILLING_MIN_IDLE_INTERVAL": "1",
            "BILLING_MAX_IDLE_INTERVAL": "1",
            "BILLING_BACKOFF_DELTA": "0.000001",
        },
    }
    base = {
        **os.environ,
        "BILLING_HOME": str(settings.home),
        "BILLING_STORAGE_CONNECTION_STRING": settings.storage_connection_string.get_secret_value(),  # type: ignore[union-attr]
        "BILLING_QUEUE_PREFIX": "idle",
        "BILLING_PARTITIONS": "4",
    }
    processes = {
        mode: subprocess.Popen(
            [sys.executable, "-m", "processor"],
            env={**base, **extra},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for mode, extra in modes.items()
    }
    _wait_up(settings.home, processes)  # a busy machine starts them slowly
    warm_up = 20.0  # the back-off reaches its cap (pull); tasks scale to zero, the depth read once (push)
    time.sleep(warm_up)
    first = _requests(settings.home, processes)
    time.sleep(seconds)
    last = _requests(settings.home, processes, since=first, seconds=seconds)
    for process in processes.values():
        process.terminate()
        process.wait(timeout=60)
    rates = {mode: (last[mode][0] - first[mode][0]) * 3600 / (last[mode][1] - first[mode][1]) for mode in modes}
    rates["push (local bus)"] *= SAFETY_FOR_MEASUREMENT / Settings().safety_poll_interval
    return {mode: round(rate, 1) for mode, rate in rates.items()}


def _wait_up(home: Path, processes: Mapping[str, subprocess.Popen[bytes]], timeout: float = 120.0) -> None:
    """Wait until each process keeps its state file (it runs its listeners)."""
    deadline = time.monotonic() + timeout
    for mode, process in processes.items():
        while not (home / "state" / f"processor-{process.pid}.json").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {mode} processor did not start within {timeout:.0f} s")
            time.sleep(0.2)


def _requests(
    home: Path,
    processes: Mapping[str, subprocess.Popen[bytes]],
    since: Mapping[str, tuple[int, float]] | None = None,
    seconds: float = 0.0,
) -> dict[str, tuple[int, float]]:
    """Each process's storage requests so far and when it counted them, from the live state file it
    keeps; with ``since``, waits for counts taken at least ``seconds`` after those (a busy process
    may write its file late)."""
    counts: dict[str, tuple[int, float]] = {}
    deadline = time.monotonic() + 60
    for mode, process in processes.items():
        while True:
            state = json.loads((home / "state" / f"processor-{process.pid}.json").read_text())
            counts[mode] = (int(state["requests"]["total"]), datetime.fromisoformat(state["updated_at"]).timestamp())
            if since is None or counts[mode][1] >= since[mode][1] + seconds:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {mode} processor has not refreshed its state file for a minute")
            time.sleep(0.2)
    return counts


def _print(result: ListenerBench, settings: Settings, console: Console) -> None:
    table = Table(title="Listener and triggers (local Azurite)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for backend, figures in result.wake_latency_ms.items():
        table.add_row(
            f"trigger wake-up latency, {backend} (ms)",
            f"p50 {figures['p50']}  p95 {figures['p95']}  max {figures['max']}",
        )
    for mode, rate in result.idle_requests_per_hour.items():
        table.add_row(f"idle requests / hour / processor, {mode}", f"{rate:,.1f}")
    table.add_row(
        "scale 0 → rule's count after a trigger",
        f"{result.scale_up_tasks} tasks, first batch in {result.scale_up_seconds * 1000:.0f} ms",
    )
    table.add_row(
        "scale back to 0 after the backlog",
        f"{result.scale_down_seconds:.1f} s (max_idle {settings.max_idle_interval:g} s)",
    )
    console.print(table)
