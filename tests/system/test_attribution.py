"""Requests attributed to batches (``shared.messaging.tally``), conserved over a whole run of real
role processes: every request the client and the roles made for the batch (all they made, less
empty polls and set-up) reaches the batch's count, once. The arithmetic is in ``unit/test_tally.py``,
the stamps messages carry in ``integration/test_tally_stamps.py``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from billing import client
from billing.sample import generate
from shared.messaging.storage import Storage
from shared.settings import Settings
from store import Store
from support.references import sample_options
from support.roles import Roles


def test_every_request_made_for_a_batch_is_counted_in_it_once(
    settings_env: Settings, roles: Roles, tmp_path: Path
) -> None:
    # 7,000 rows in items of 500 or more (whole inbox frames, each read by its processor), 2 partitions:
    # the processor takes several dequeue batches, the controller several cycles.
    settings = settings_env.model_copy(update={"work_item_size": 500, "partitions": 2, "trigger_backend": "none"})
    batch = tmp_path / "batch.csv"
    generate(7_000, batch, seed=3, reject_rate=0.01)

    async def submit() -> int:
        async with Storage(settings) as storage:
            await storage.ensure_all()
            set_up = storage.counter.total  # what ensure_all costs, made again by submit
        submission = await client.submit(settings, batch, batch_id="counted", **sample_options(tmp_path / "ref"))
        return submission.requests["total"] - set_up

    by_client = asyncio.run(submit())
    for role in ("initiator", "processor", "controller"):
        roles.burst(role, settings)
    states = [json.loads(path.read_text()) for path in (settings.home / "state").glob("*.json")]
    assert sorted(s["role"] for s in states) == ["controller", "initiator", "processor"]
    empty_polls = sum(listener["idle_polls"] for s in states for listener in s["listeners"])
    by_roles = sum(s["requests_attributed"] for s in states) - empty_polls
    with Store(settings.sql_url_value) as store:
        status = store.batch("counted")
    assert status is not None and status.state == "complete" and status.work_items > 5
    assert by_client > 0 and by_roles > 0
    # The client marks the batch requested after its request message left with the tally: one request out.
    assert status.requests == by_client - 1 + by_roles
    # Everything else the roles made served no batch: set-up, depth reads, empty polls.
    assert sum(s["requests"]["total"] for s in states) > by_roles
