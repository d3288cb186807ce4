"""The queue listener against Azurite: back-off, burst draining, late acknowledgement, poison."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping

import pytest
from azure.storage.queue import QueueMessage

from shared.envelope import ClaimCheck
from shared.listener import ListenerSettings, QueueListener, depth_rule, idle_delay
from shared.poison import PoisonQueue, poison_queue_name
from shared.settings import Settings
from shared.storage import Storage


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


def test_depth_rule_is_bounded() -> None:
    settings = ListenerSettings(max_tasks=8, dequeue_batch_size=32)
    assert depth_rule(0, settings) == 1
    assert depth_rule(33, settings) == 2
    assert depth_rule(10_000, settings) == 8


def _listener(storage: Storage, settings: Settings, handler, **overrides) -> QueueListener:  # type: ignore[no-untyped-def]
    claim_check = ClaimCheck(storage, container=settings.work_container, limit=settings.max_message_bytes)
    return QueueListener(
        queue=storage.queue(settings.requests_queue),
        handler=handler,
        poison=PoisonQueue(storage, claim_check),
        settings=ListenerSettings.from_settings(settings, **overrides),
        burst=True,
    )


async def test_burst_drains_in_batches_and_deletes_after_handler(storage: Storage, settings_env: Settings) -> None:
    queue = storage.queue(settings_env.requests_queue)
    for i in range(70):
        await queue.send_message(f"m{i}")
    seen: list[list[str]] = []

    async def handler(messages: list[QueueMessage]) -> Mapping[str, str]:
        seen.append([m.content for m in messages])
        return {}

    before = storage.counter.snapshot()
    listener = _listener(storage, settings_env, handler, max_tasks=1)
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

    listener = _listener(storage, settings_env, failing, visibility_timeout=1)
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
        async for message in queue.receive_messages(visibility_timeout=1, max_messages=32):
            pass
        await asyncio.sleep(1.2)
    await queue.send_message("bad")

    async def handler(messages: list[QueueMessage]) -> Mapping[str, str]:
        return {m.id: "bad_envelope: not json" for m in messages if m.content == "bad"}

    listener = _listener(storage, settings_env, handler, max_dequeue_count=2)
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

    listener = _listener(storage, settings_env, slow, visibility_timeout=2, max_tasks=2)
    await listener.run()
    assert calls == 1  # never redelivered while being worked on
    assert (await queue.get_queue_properties()).approximate_message_count == 0
