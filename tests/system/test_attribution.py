"""Requests attributed to batches (``shared.tally``): the arithmetic, the stamps messages carry on
Azurite, and conservation over a whole run of real role processes — every request the client and
the roles made for the batch (all they made, less empty polls and set-up) reaches the batch's count,
once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from billing import client
from controller.store import Store
from shared.messaging.envelope import ClaimCheck, Envelope
from shared.messaging.storage import Storage
from shared.messaging.tally import INHERITED, Tally, record, spread, tallying
from shared.rules.sample import generate
from shared.settings import Settings


@given(st.integers(0, 10**6), st.lists(st.integers(0, 10**4), max_size=40))
def test_spread_keeps_every_request_and_follows_the_weights(total: int, weights: list[int]) -> None:
    shares = spread(total, weights)
    assert len(shares) == len(weights)
    if weights:
        assert sum(shares) == total and min(shares) >= 0
        base = weights if any(weights) else [1] * len(weights)
        for share, weight in zip(shares, base, strict=True):
            assert abs(share - total * weight / sum(base)) < 1


def test_stamps_add_up_to_what_was_made_and_charged_ahead() -> None:
    tally = Tally()
    tally.charge_ahead("queue.delete", 3)  # three deletes after the handler
    with tallying(tally):
        record("queue.receive")
        record("blob.get", 2)
        first = tally.stamp(ahead="queue.send")  # a message sent now: its own send included
        record("queue.send")  # ... which the policy then counts: already stamped
        record("blob.put")
        second = tally.stamp(ahead="queue.send")
        record("queue.send")
        for _ in range(3):
            record("queue.delete")
        assert tally.stamp() == 0, "nothing left: the deletes were charged ahead"
    assert (first, second) == (1 + 2 + 1 + 3, 1 + 1)
    assert not record("queue.receive"), "outside a tally nothing is attributed"
    assert tally.counts.total() == 1 + 2 + 1 + 1 + 1 + 3


async def test_requests_in_tasks_started_inside_a_tally_count_in_it() -> None:
    tally = Tally()
    with tallying(tally):
        await asyncio.gather(*(asyncio.to_thread(lambda: None) for _ in range(2)), asyncio.create_task(_record_later()))
    await _record_later()  # outside: not counted
    assert tally.counts == {"queue.send": 1}


async def _record_later() -> None:
    await asyncio.sleep(0)
    record("queue.send")


async def test_messages_carry_their_stamp_and_the_receiver_inherits_it(
    storage: Storage, settings_env: Settings
) -> None:
    check = ClaimCheck(storage, container=settings_env.work_container, limit=settings_env.max_message_bytes)
    queue = settings_env.input_queues[0]
    with tallying(sender := Tally()):
        await check.send(queue, Envelope("work", {"n": 1}, os.urandom(1_000)), blob_name="inline")
        await check.send(queue, Envelope("work", {"n": 2}, os.urandom(60_000)), blob_name="claim-checked")
    assert sender.counts == {"queue.send": 2, "blob.put": 1}
    received = [m async for m in storage.queue(queue).receive_messages(max_messages=2)]
    stamps = sorted(json.loads(m.content)["requests"] for m in received)
    assert stamps == [1, 2], "one send each; the large one also its claim-check blob"
    with tallying(receiver := Tally()):
        envelopes = [await check.unpack(m.content) for m in received]
    assert sorted(e.requests for e in envelopes) == [1, 2]
    assert receiver.counts == {INHERITED: 3, "blob.get": 1}
    # Outside a tally no stamp is written, and the inline limit holds with one.
    assert "requests" not in json.loads(await check.pack(Envelope("work", {}, b"x"), queue=queue, blob_name="x"))


def run_role(role: str, env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", role, "--burst"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_every_request_made_for_a_batch_is_counted_in_it_once(settings_env: Settings, tmp_path: Path) -> None:
    # 7,000 rows in items of 500, 2 partitions: the claim check is used for work items and results,
    # the processor takes several dequeue batches, the controller several cycles.
    settings = settings_env.model_copy(update={"work_item_size": 500, "partitions": 2, "trigger_backend": "none"})
    env = {**os.environ, **settings.as_env()}
    batch = tmp_path / "batch.csv"
    generate(7_000, batch, seed=3, reject_rate=0.01)

    async def submit() -> int:
        async with Storage(settings) as storage:
            await storage.ensure_all()
            set_up = storage.counter.total  # what ensure_all costs, made again by submit
        submission = await client.submit(settings, batch, batch_id="counted")
        return submission.requests["total"] - set_up

    by_client = asyncio.run(submit())
    for role in ("initiator", "processor", "controller"):
        run_role(role, env)
    states = [json.loads(path.read_text()) for path in (settings.home / "state").glob("*.json")]
    assert sorted(s["role"] for s in states) == ["controller", "initiator", "processor"]
    empty_polls = sum(listener["idle_polls"] for s in states for listener in s["listeners"])
    by_roles = sum(s["requests_attributed"] for s in states) - empty_polls
    with Store(settings.sql_url_value) as store:
        status = store.batch("counted")
    assert status is not None and status.state == "complete" and status.work_items == 14
    assert by_client > 0 and by_roles > 0
    assert status.requests == by_client + by_roles
    # Everything else the roles made served no batch: set-up, depth reads, empty polls.
    assert sum(s["requests"]["total"] for s in states) > by_roles
