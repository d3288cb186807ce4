"""A request that vanishes after ``billing submit`` returned (deleted from the requests queue with the Azure SDK,
as a lost queue or a hand would): ``billing status`` lists the file with its age, ``billing resubmit`` sends it
again (and refuses what it must), ``billing submit --wait`` and the controller notice it on their own; each time
the batch completes once, exactly as the reference model bills it."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from billing.sample import generate
from shared.messaging.storage import Storage
from shared.settings import Settings
from store import Store
from support.exact import assert_batch_exact, billing
from support.roles import Roles
from support.waiting import wait_until

ROWS = 3000


def attempt(*args: str) -> subprocess.CompletedProcess[str]:
    """``billing`` that may fail (``support.exact.billing`` asserts it does not)."""
    return subprocess.run(
        [sys.executable, "-m", "billing", *args], capture_output=True, text=True, env=os.environ, timeout=120
    )


def refused_on_one_line(done: subprocess.CompletedProcess[str], words: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


async def _depths(settings: Settings) -> dict[str, int]:
    async with Storage(settings) as storage:
        await storage.ensure_all()
        return {
            queue: (await storage.queue(queue).get_queue_properties()).approximate_message_count
            for queue in settings.all_queues
        }


def requests_waiting(settings: Settings) -> int:
    return asyncio.run(_depths(settings))[settings.requests_queue]


def lose_requests(settings: Settings) -> None:
    """What a lost queue or a hand does: every request message gone."""

    async def clear() -> None:
        async with Storage(settings) as storage:
            await storage.queue(settings.requests_queue).clear_messages()

    asyncio.run(clear())


def status() -> dict[str, list[dict[str, object]]]:
    return dict(json.loads(billing("status", "--json").stdout))


def billed_once(batch_id: str, path: Path, settings: Settings) -> None:
    """The batch complete and exact, the only batch, nothing unbilled, and no message left anywhere."""
    assert_batch_exact(batch_id, path)
    shown = status()
    assert [batch["batch_id"] for batch in shown["batches"]] == [batch_id]
    assert shown["unbilled"] == []
    assert set(asyncio.run(_depths(settings)).values()) == {0}


@pytest.fixture
def batch_file(settings_env: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file of several work items (a request debatched twice would send each twice), the sample
    reference data registered."""
    monkeypatch.setenv("BILLING_WORK_ITEM_SIZE", "500")
    path = tmp_path / "batch.csv"
    generate(ROWS, path, seed=41, reject_rate=0.05)
    billing("reference", "set", "--sample")
    return path


def test_status_lists_the_file_and_resubmit_bills_it_once(
    settings_env: Settings, roles: Roles, batch_file: Path
) -> None:
    before = time.time()
    billing("submit", str(batch_file), "--batch-id", "lost")
    lose_requests(settings_env)
    assert requests_waiting(settings_env) == 0
    roles.burst("initiator")  # nothing to take: the batch never reaches the store

    shown = status()
    assert shown["batches"] == []
    [orphan] = shown["unbilled"]
    assert (orphan["batch_id"], orphan["source"]) == ("lost", "batch.csv")
    # The inbox keeps the upload's time to the second (truncated), and the age is rounded to the second.
    assert 0 <= float(str(orphan["age_seconds"])) <= time.time() - math.floor(before) + 0.5
    line = next(line for line in billing("status").stdout.splitlines() if line.startswith("unbilled"))
    assert "batch_id=lost" in line and "source=batch.csv" in line and "age_seconds=" in line

    refused_on_one_line(attempt("resubmit", "nosuch"), "no file in the inbox")
    refused_on_one_line(attempt("resubmit", "a/b"), "batch id")
    assert requests_waiting(settings_env) == 0, "a refusal sends nothing"

    assert "request sent again" in billing("resubmit", "lost").stdout
    assert "request sent again" in billing("resubmit", "lost").stdout  # twice: the batch still counts once
    assert requests_waiting(settings_env) == 2
    for role in ("initiator", "processor", "controller"):
        roles.burst(role)
    billed_once("lost", batch_file, settings_env)

    complete = json.loads(billing("status", "lost", "--json").stdout)
    refused_on_one_line(attempt("resubmit", "lost"), "already accounted for (complete)")
    assert "already submitted" in billing("submit", str(batch_file), "--batch-id", "lost").stdout
    assert requests_waiting(settings_env) == 0
    assert json.loads(billing("status", "lost", "--json").stdout) == complete


def test_submit_wait_sends_a_request_no_one_took_again(
    settings_env: Settings, roles: Roles, batch_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BILLING_REQUEST_TAKE_TIMEOUT", "1")
    monkeypatch.setenv("BILLING_REQUEST_RESENDS", "20")
    command = [sys.executable, "-m", "billing", "submit", str(batch_file), "--batch-id", "waited"]
    waiting = subprocess.Popen(
        [*command, "--wait", "--timeout", "300"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        # No initiator yet: while the request waits in its queue, --wait leaves it there.
        assert wait_until(lambda: requests_waiting(settings_env) == 1, 60), "the request went out"
        lose_requests(settings_env)
        with roles.running():
            out, err = waiting.communicate(timeout=300)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, out + err
    assert "no initiator took its request within 1 s: sent it again (1 of at most 20)" in err
    assert "complete" in out
    billed_once("waited", batch_file, settings_env)


def test_the_controller_sends_a_lost_request_again(
    settings_env: Settings, roles: Roles, batch_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BILLING_UNBILLED_RESEND_AGE", "1")
    billing("submit", str(batch_file), "--batch-id", "healed")
    lose_requests(settings_env)
    with roles.running(settings_env), Store(settings_env.sql_url_value) as store:
        # Polled in the store, not by a `billing status` process per look; billed_once asks the CLI.
        healed = wait_until(lambda: (s := store.batch("healed")) is not None and s.state == "complete", 180, 0.2)
        assert healed, "the request was sent again"
    assert "batch healed: its file (batch.csv) sat" in "".join(roles.logs().values())
    billed_once("healed", batch_file, settings_env)
