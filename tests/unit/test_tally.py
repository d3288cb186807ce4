"""Requests attributed to batches (``shared.messaging.tally``): the arithmetic of spreading a count
over weights, stamps adding up to what was made and charged ahead, tasks counting in their tally."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from shared.messaging.tally import Tally, record, spread, tallying


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
