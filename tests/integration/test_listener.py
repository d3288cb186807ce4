"""The queue listener against Azurite: back-off, burst draining, late acknowledgement, poison."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Callable, Mapping

from azure.storage.queue import QueueMessage

from shared.messaging.poison import poison_queue_name
from shared.messaging.scaling import (
    SCALE_RULES,
    ListenerSettings,
    Load,
    at_idle_cap,
    drain_rule,
    idle_delay,
    whitepaper_rule,
)
from shared.messaging.storage import Storage
from shared.settings import Settings
from support.listeners import listener_on
from support.waiting import wait_until_async


def test_idle_delay_grows_exponentially_with_jitter_and_caps() -> None:
    settings = ListenerSettings(min_idle_interval=0.0, max_idle_interval=5.0, backoff_delta=0.1)
    rng = random.Random(7)
    first = [idle_delay(1, settings, rng) for _ in range(200)]
    assert all(0.08 <= d <= 0.12 for d in first)  # (2^1 - 1) × [0.8, 1.2] × 0.1
    third = [idle_delay(3, settings, rng) for _ in range(200)]
    assert all(0.56 <= d <= 0.84 for d in third)  # (2^3 - 1) × [0.8, 1.2] × 0.1
    capped = [idle_delay(40, settings, rng) for _ in range(200)]
    assert all(4.0 <= d <= 6.0 for d in capped)
    assert len({round(d, 6) for d in capped}) > 100  # jitter kept at the cap: no lock-step polling


def test_idle_cap_is_reached_after_the_whitepaper_number_of_polls() -> None:
    settings = ListenerSettings(min_idle_interval=0.0, max_idle_interval=10.0, backoff_delta=0.1)
    # (2^n - 1) × 0.1 reaches 10 s at n = 7 (12.7 s); before that the sleep still grows.
    assert [at_idle_cap(n, settings) for n in range(1, 9)] == [False] * 6 + [True] * 2


def test_drain_rule_uses_depth_and_measured_service_time() -> None:
    settings = ListenerSettings(max_tasks=8, dequeue_batch_size=32, target_drain_seconds=10.0)
    # Nothing measured yet: one task per full batch of backlog.
    assert drain_rule(Load(0, None), settings) == 0
    assert drain_rule(Load(33, None), settings) == 2
    # 0.05 s per message: 1,000 messages take 50 task-seconds, 5 tasks drain them in 10 s.
    assert drain_rule(Load(1_000, 0.05), settings) == 5
    assert drain_rule(Load(1_000, 0.001), settings) == 1
    assert SCALE_RULES["drain"] is drain_rule


def test_whitepaper_rule_is_the_fixed_table() -> None:
    settings = ListenerSettings()
    assert [whitepaper_rule(Load(d, None), settings) for d in (0, 99, 100, 999, 1000, 10**6)] == [
        10,
        10,
        50,
        50,
        100,
        100,
    ]
    assert SCALE_RULES["whitepaper"] is whitepaper_rule


async def _until(predicate: Callable[[], object], seconds: float = 15.0) -> None:
    """:func:`wait_until_async`, bounded: fails the test after ``seconds``."""
    async with asyncio.timeout(seconds):
        await wait_until_async(predicate, interval=0.02)


async def _send(storage: Storage, settings: Settings, count: int, *, visible_after: int = 0) -> None:
    """Send ``m0`` … ``m{count - 1}``; with ``visible_after``, each shows only that many seconds
    after its send (the depth counts it at once), so however slowly the sends go, a poll finds the
    whole backlog waiting."""
    queue = storage.queue(settings.requests_queue)
    await asyncio.gather(*(queue.send_message(f"m{i}", visibility_timeout=visible_after) for i in range(count)))


def _recorder(seen: list[str], delay: float = 0.0):  # type: ignore[no-untyped-def]
    async def handler(messages: list[QueueMessage]) -> Mapping[str, str]:
        await asyncio.sleep(delay)
        seen.extend(m.content for m in messages)
        return {}

    return handler


async def test_burst_drains_in_batches_and_deletes_after_handler(storage: Storage, settings_env: Settings) -> None:
    queue = storage.queue(settings_env.requests_queue)
    for i in range(70):
        await queue.send_message(f"m{i}")
    seen: list[list[str]] = []

    async def handler(messages: list[QueueMessage]) -> Mapping[str, str]:
        seen.append([m.content for m in messages])
        return {}

    before = storage.counter.snapshot()
    listener = listener_on(storage, settings_env, handler, max_tasks=1)
    await listener.run()
    assert sorted(c for batch in seen for c in batch) == sorted(f"m{i}" for i in range(70))
    assert max(len(b) for b in seen) == 32
    assert (await queue.get_queue_properties()).approximate_message_count == 0
    counts = storage.counter.snapshot()
    receives = counts.get("queue.receive", 0) - before.get("queue.receive", 0)
    assert receives <= 5  # 32 + 32 + 6, then one empty poll ends the burst
    assert listener.state().processed == 70


async def test_failed_handler_leaves_messages_for_redelivery(storage: Storage, settings_env: Settings) -> None:
    queue = storage.queue(settings_env.requests_queue)
    await queue.send_message("keep me")

    async def failing(messages: list[QueueMessage]) -> Mapping[str, str]:
        raise RuntimeError("boom")

    listener = listener_on(storage, settings_env, failing, visibility_timeout=1)
    await listener.run()
    assert listener.state().failed_batches == 1
    await asyncio.sleep(1.5)
    peeked = await queue.peek_messages(max_messages=5)
    assert [m.content for m in peeked] == ["keep me"]


async def test_poison_by_handler_reason_and_by_dequeue_count(storage: Storage, settings_env: Settings) -> None:
    queue = storage.queue(settings_env.requests_queue)
    await queue.send_message("worn")
    # Wear one message out: receive it past max_dequeue_count without deleting it.
    for _ in range(3):
        async for _ in queue.receive_messages(visibility_timeout=1, max_messages=32):
            pass
        await asyncio.sleep(1.2)
    await queue.send_message("bad")

    async def handler(messages: list[QueueMessage]) -> Mapping[str, str]:
        return {m.id: "bad_envelope: not json" for m in messages if m.content == "bad"}

    listener = listener_on(storage, settings_env, handler, max_dequeue_count=2)
    await listener.run()
    poison = storage.queue(poison_queue_name(settings_env.requests_queue))
    found = [json.loads(m.content) async for m in poison.receive_messages(max_messages=32)]
    reasons = sorted(p["headers"]["reason"] for p in found)
    assert reasons[0] == "bad_envelope: not json"
    assert reasons[1].startswith("max_dequeue_count_exceeded")
    assert (await queue.get_queue_properties()).approximate_message_count == 0


async def test_lease_is_renewed_for_long_work(storage: Storage, settings_env: Settings) -> None:
    queue = storage.queue(settings_env.requests_queue)
    await queue.send_message("slow")
    calls = 0

    async def slow(messages: list[QueueMessage]) -> Mapping[str, str]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(4)  # twice the visibility timeout
        return {}

    listener = listener_on(storage, settings_env, slow, visibility_timeout=2, max_tasks=2)
    await listener.run()
    assert calls == 1  # never redelivered while being worked on
    assert (await queue.get_queue_properties()).approximate_message_count == 0


FAST_IDLE = {"min_idle_interval": 0.0, "max_idle_interval": 0.4, "backoff_delta": 0.05}


async def test_pull_mode_scales_up_on_detected_work_and_down_to_one(storage: Storage, settings_env: Settings) -> None:
    seen: list[str] = []
    listener = listener_on(storage, settings_env, _recorder(seen, 0.05), burst=False, max_tasks=4, **FAST_IDLE)
    runner = asyncio.create_task(listener.run())
    await _until(lambda: listener.state().idle_polls >= 3)  # idling with its one task
    assert listener.state().active_tasks == 1
    await _send(storage, settings_env, 300, visible_after=1)
    await _until(lambda: len(seen) == 300)
    assert listener.state().peak_tasks == 4  # 300 waiting → ⌈300 / 32⌉ = 10, capped at max_tasks
    await _until(lambda: listener.state().active_tasks == 1)  # idle tasks left, the last one stays
    idle = listener.state().idle_polls
    await asyncio.sleep(1.0)
    assert listener.state().active_tasks == 1 and listener.state().idle_polls > idle  # still polling
    listener.stop()
    await runner
    assert sorted(seen) == sorted(f"m{i}" for i in range(300))


async def test_pull_mode_scales_up_on_a_backlog_that_was_not_seen_arriving(
    storage: Storage, settings_env: Settings
) -> None:
    """No idle poll comes before the work here (it waits when the listener starts, as after a
    restart), so only full batches can show the backlog: they make the listener read the depth."""
    await _send(storage, settings_env, 400)
    seen: list[str] = []
    listener = listener_on(storage, settings_env, _recorder(seen, 0.2), burst=False, max_tasks=4, **FAST_IDLE)
    runner = asyncio.create_task(listener.run())
    await _until(lambda: len(seen) == 400)
    assert listener.state().peak_tasks == 4  # 400 waiting → ⌈400 / 32⌉ = 13, capped at max_tasks
    listener.stop()
    await runner
    assert sorted(seen) == sorted(f"m{i}" for i in range(400))


async def test_push_mode_scales_to_zero_and_up_on_a_trigger(storage: Storage, settings_env: Settings) -> None:
    seen: list[str] = []
    listener = listener_on(
        storage,
        settings_env,
        _recorder(seen, 0.05),
        burst=False,
        max_tasks=3,
        push=True,
        safety_poll_interval=3600,
        **FAST_IDLE,
    )
    runner = asyncio.create_task(listener.run())
    await _until(lambda: listener.state().idle_polls >= 1 and listener.state().active_tasks == 0)
    receives = storage.counter.counts["queue.receive"]
    assert receives >= 1  # the listener's polls are counted here
    await asyncio.sleep(1.0)
    # At zero tasks nothing polls (the one read of the depth as the last task leaves may come meanwhile).
    assert storage.counter.counts["queue.receive"] == receives
    await _send(storage, settings_env, 200)
    listener.wake(200)
    assert listener.state().active_tasks == 3  # started at once by the rule, no poll needed
    await _until(lambda: len(seen) == 200)
    await _until(lambda: listener.state().active_tasks == 0)
    listener.stop()
    await runner
    assert listener.state().processed == 200


async def test_push_mode_safety_poll_finds_work_without_a_trigger(storage: Storage, settings_env: Settings) -> None:
    seen: list[str] = []
    listener = listener_on(
        storage, settings_env, _recorder(seen), burst=False, push=True, safety_poll_interval=0.5, **FAST_IDLE
    )
    runner = asyncio.create_task(listener.run())
    await _until(lambda: listener.state().active_tasks == 0)
    await _send(storage, settings_env, 5)  # no trigger: a lost hint
    await _until(lambda: len(seen) == 5, seconds=10)
    listener.stop()
    await runner


async def test_graceful_stop_finishes_in_flight_work_once(storage: Storage, settings_env: Settings) -> None:
    seen: list[str] = []
    started = asyncio.Event()

    async def slow(messages: list[QueueMessage]) -> Mapping[str, str]:
        started.set()
        await asyncio.sleep(1.0)
        seen.extend(m.content for m in messages)
        return {}

    await _send(storage, settings_env, 100)
    listener = listener_on(storage, settings_env, slow, burst=False, max_tasks=2, **FAST_IDLE)
    runner = asyncio.create_task(listener.run())
    await started.wait()
    listener.stop()
    await asyncio.wait_for(runner, timeout=10)
    assert 0 < len(seen) < 100  # what was in flight finished; nothing new was taken
    first = list(seen)
    rest = listener_on(storage, settings_env, _recorder(seen), max_tasks=1)
    await rest.run()
    assert sorted(seen) == sorted(f"m{i}" for i in range(100))  # none lost, none twice
    assert len(first) == listener.state().processed


async def test_next_receive_overlaps_processing(storage: Storage, settings_env: Settings) -> None:
    queue = storage.queue(settings_env.requests_queue)
    overlapped: list[bool] = []
    batches: list[int] = []

    async def none_visible() -> bool:
        return not await queue.peek_messages(max_messages=1)

    async def handler(messages: list[QueueMessage]) -> Mapping[str, str]:
        batches.append(len(messages))
        if not overlapped:  # the first batch, held until the second is received (none left visible) or 15 s
            try:
                async with asyncio.timeout(15):
                    await wait_until_async(none_visible, interval=0.02)
                overlapped.append(True)
            except TimeoutError:
                overlapped.append(False)
        return {}

    await _send(storage, settings_env, 64)
    listener = listener_on(storage, settings_env, handler, max_tasks=1)
    await listener.run()
    assert batches == [32, 32] and listener.state().processed == 64
    assert overlapped == [True], "the second batch is received while the first is being handled"


async def test_receive_errors_are_reported_and_the_task_goes_on(storage: Storage, settings_env: Settings) -> None:
    seen: list[str] = []
    listener = listener_on(storage, settings_env, _recorder(seen), burst=False, **FAST_IDLE)
    queue = storage.queue(settings_env.requests_queue)
    real_receive = queue.receive_messages
    failures = 2

    def flaky(**kwargs):  # type: ignore[no-untyped-def]
        nonlocal failures
        if failures:
            failures -= 1
            raise ConnectionResetError("injected: connection reset")
        return real_receive(**kwargs)

    queue.receive_messages = flaky  # type: ignore[method-assign]
    try:
        await _send(storage, settings_env, 3)
        runner = asyncio.create_task(listener.run())
        await _until(lambda: len(seen) == 3, seconds=20)
        listener.stop()
        await runner
    finally:
        del queue.receive_messages
    assert failures == 0 and listener.state().task_errors == 0


async def test_a_trigger_cuts_an_idle_sleep_short(storage: Storage, settings_env: Settings) -> None:
    seen: list[str] = []
    # After its first empty poll the task sleeps at least ten minutes: only wake() can bring it back.
    listener = listener_on(
        storage, settings_env, _recorder(seen), burst=False, min_idle_interval=600, max_idle_interval=3600
    )
    runner = asyncio.create_task(listener.run())
    await _until(lambda: listener.state().idle_polls == 1)
    await _send(storage, settings_env, 3)
    listener.wake(3)
    await _until(lambda: len(seen) == 3)
    listener.stop()
    await runner


async def test_a_trigger_during_an_empty_poll_is_not_lost(storage: Storage, settings_env: Settings) -> None:
    seen: list[str] = []
    listener = listener_on(
        storage, settings_env, _recorder(seen), burst=False, min_idle_interval=600, max_idle_interval=3600
    )
    polled, answer = asyncio.Event(), asyncio.Event()
    receive = listener._receive

    async def late_answer(count: int) -> list[QueueMessage]:
        """The poll reaches the queue (still empty), but its answer comes back only later."""
        got = await receive(count)
        polled.set()
        await answer.wait()
        return got

    listener._receive = late_answer  # type: ignore[method-assign]
    runner = asyncio.create_task(listener.run())
    await asyncio.wait_for(polled.wait(), timeout=15)
    await _send(storage, settings_env, 2)
    listener.wake(2)  # the trigger arrives while the empty answer is on its way
    answer.set()
    await _until(lambda: len(seen) == 2)  # not ten minutes later
    listener.stop()
    await runner


async def test_cancelled_handling_hands_messages_back_at_once(storage: Storage, settings_env: Settings) -> None:
    handling = asyncio.Event()

    async def stuck(messages: list[QueueMessage]) -> Mapping[str, str]:
        handling.set()
        await asyncio.sleep(3600)
        return {}

    await _send(storage, settings_env, 3)
    listener = listener_on(storage, settings_env, stuck, burst=False, visibility_timeout=600)
    runner = asyncio.create_task(listener.run())
    await asyncio.wait_for(handling.wait(), timeout=15)
    listener.stop()
    runner.cancel()  # what a shutdown past its deadline does
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    # Visible again now, not in ten minutes; received once before, so this is their second delivery.
    again = [m async for m in storage.queue(settings_env.requests_queue).receive_messages(max_messages=32)]
    assert sorted(m.content for m in again) == ["m0", "m1", "m2"]
    assert {m.dequeue_count for m in again} == {2}


async def test_without_prefetch_the_next_batch_takes_what_arrived_while_handling(
    storage: Storage, settings_env: Settings
) -> None:
    batches: list[int] = []
    handling = asyncio.Event()
    sent = asyncio.Event()

    async def handler(messages: list[QueueMessage]) -> Mapping[str, str]:
        batches.append(len(messages))
        if len(batches) == 1:
            handling.set()
            await sent.wait()  # more messages arrive while this batch is handled
        return {}

    await _send(storage, settings_env, 1)
    listener = listener_on(storage, settings_env, handler, max_tasks=1, prefetch=False)
    running = asyncio.create_task(listener.run())
    await asyncio.wait_for(handling.wait(), 15)
    await _send(storage, settings_env, 5)
    sent.set()
    await asyncio.wait_for(running, 30)
    assert batches == [1, 5], "received only once the first batch was handled: all five at once"
