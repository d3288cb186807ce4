"""What a listener takes and when it looks again, against Azurite: a shared capacity leaves the rest
of a queue to other instances; messages a dead receiver leased are taken up when they reappear."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from azure.storage.queue import QueueMessage

from shared.messaging.capacity import Capacity
from shared.messaging.storage import Storage
from shared.settings import Settings
from support.listeners import listener_on
from support.waiting import wait_until_async

FAST_IDLE = {"min_idle_interval": 0.0, "max_idle_interval": 0.4, "backoff_delta": 0.05}


async def _until(predicate, seconds: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(seconds):
        await wait_until_async(predicate, interval=0.02)


async def _visible(storage: Storage, queue: str) -> int:
    """Messages of ``queue`` that a receive could take now (a peek sees at most 32)."""
    return len(await storage.queue(queue).peek_messages(max_messages=32))


async def test_listeners_sharing_a_capacity_hold_no_more_than_its_slots(
    storage: Storage, settings_env: Settings
) -> None:
    queues = settings_env.input_queues[:2]
    for queue in queues:
        await asyncio.gather(*(storage.queue(queue).send_message(f"{queue}/{i}") for i in range(10)))
    capacity = Capacity(3)
    release = asyncio.Event()
    running: set[str] = set()
    most = 0
    seen: list[str] = []

    async def hold(messages: list[QueueMessage]) -> Mapping[str, str]:
        nonlocal most
        running.update(m.content for m in messages)
        most = max(most, len(running))
        await release.wait()
        running.difference_update(m.content for m in messages)
        seen.extend(m.content for m in messages)
        return {}

    listeners = [
        listener_on(storage, settings_env, hold, queue=q, burst=False, capacity=capacity, max_tasks=4, **FAST_IDLE)
        for q in queues
    ]
    runners = [asyncio.create_task(listener.run()) for listener in listeners]
    await _until(lambda: len(running) == 3)
    await asyncio.sleep(1.0)  # time enough to take more, were the capacity not shared
    assert len(running) == 3
    assert sum([await _visible(storage, q) for q in queues]) == 17  # the rest is left for other instances
    release.set()
    await _until(lambda: len(seen) == 20)
    for listener in listeners:
        listener.stop()
    await asyncio.gather(*runners)
    assert most == 3
    assert sorted(seen) == sorted(f"{q}/{i}" for q in queues for i in range(10))
    assert capacity.taken == 0


async def test_each_message_frees_its_slot_when_it_is_done(storage: Storage, settings_env: Settings) -> None:
    """A slow message does not keep the slot of a quick one that came in the same receive."""
    queue = storage.queue(settings_env.requests_queue)
    await queue.send_message("slow")
    await queue.send_message("quick-0")
    done: list[str] = []
    slow = asyncio.Event()

    async def handler(messages: list[QueueMessage]) -> Mapping[str, str]:
        (message,) = messages  # one message a call
        if message.content == "slow":
            await slow.wait()
        done.append(message.content)
        return {}

    listener = listener_on(storage, settings_env, handler, burst=False, capacity=Capacity(2), **FAST_IDLE)
    runner = asyncio.create_task(listener.run())
    await _until(lambda: "quick-0" in done)
    for i in range(1, 4):  # one at a time, through the slot the quick ones free
        await queue.send_message(f"quick-{i}")
        await _until(lambda i=i: f"quick-{i}" in done)
    assert "slow" not in done
    slow.set()
    await _until(lambda: "slow" in done)
    listener.stop()
    await runner


async def test_messages_a_dead_receiver_leased_are_taken_when_they_reappear(
    storage: Storage, settings_env: Settings
) -> None:
    """No trigger announces a message whose lease ran out: a push listener that finds its queue
    holding messages it did not receive looks again every recovery interval, not at the safety poll."""
    queue = storage.queue(settings_env.requests_queue)
    await asyncio.gather(*(queue.send_message(f"m{i}") for i in range(3)))
    leased = [m async for m in queue.receive_messages(max_messages=32, visibility_timeout=3)]  # and then it dies
    assert len(leased) == 3
    seen: list[str] = []

    async def record(messages: list[QueueMessage]) -> Mapping[str, str]:
        seen.extend(m.content for m in messages)
        return {}

    listener = listener_on(
        storage,
        settings_env,
        record,
        burst=False,
        push=True,
        safety_poll_interval=3600,
        recovery_poll_interval=0.5,
        **FAST_IDLE,
    )
    runner = asyncio.create_task(listener.run())
    await _until(lambda: listener.state().idle_polls >= 1 and listener.state().active_tasks == 0)
    assert seen == []  # still leased: nothing to receive yet
    await _until(lambda: len(seen) == 3, seconds=10)  # the lease ran out at 3 s; the safety poll is an hour away
    assert sorted(seen) == ["m0", "m1", "m2"]
    # Once the queue is empty, the listener waits for the safety poll again: no request while idle.
    await _until(lambda: listener.state().active_tasks == 0)
    await asyncio.sleep(0.2)
    requests = listener.state().requests
    await asyncio.sleep(2.0)  # four recovery intervals
    assert listener.state().requests == requests
    listener.stop()
    await runner


async def test_messages_the_listener_holds_itself_do_not_make_it_look_again(
    storage: Storage, settings_env: Settings
) -> None:
    """A processor whose dequeue tasks went idle while its own work goes on makes no recovery polls."""
    queue = storage.queue(settings_env.requests_queue)
    await queue.send_message("long")
    finish = asyncio.Event()

    async def long(messages: list[QueueMessage]) -> Mapping[str, str]:
        await finish.wait()
        return {}

    listener = listener_on(
        storage,
        settings_env,
        long,
        burst=False,
        push=True,
        capacity=Capacity(2),
        safety_poll_interval=3600,
        recovery_poll_interval=0.2,
        **FAST_IDLE,
    )
    runner = asyncio.create_task(listener.run())
    await _until(lambda: listener.state().idle_polls >= 1 and listener.state().active_tasks == 0)
    await asyncio.sleep(0.3)
    requests = listener.state().requests
    await asyncio.sleep(1.5)
    assert listener.state().requests == requests
    finish.set()
    await _until(lambda: listener.state().processed == 1)
    listener.stop()
    await runner
    assert (await queue.get_queue_properties()).approximate_message_count == 0
