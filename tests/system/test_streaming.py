"""The initiator sends work items while the file is still arriving: a file found unreadable only
past what ``billing submit`` checks is refused by the initiator, and nothing of it counts, although
some of its work items were already sent and rated."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from billing.client import HEAD_BYTES
from billing.sample import generate
from shared.messaging.storage import Storage
from shared.settings import Settings
from store import Store
from support.exact import billing, report
from support.references import sample_flags
from support.roles import Roles
from support.waiting import wait_until

MALFORMED = 't-bad,"acct"x,2026-03-02T09:15:00Z,api.request,1,\n'


@pytest.fixture
def streaming_env(settings_env: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("BILLING_WORK_ITEM_SIZE", "500")  # many items leave before the bad line is read
    monkeypatch.setenv("BILLING_PARTITIONS", "2")
    return Settings()


def _status(batch_id: str) -> dict[str, Any] | None:
    """The batch's status, or None while the controller knows nothing of it."""
    done = subprocess.run(
        [sys.executable, "-m", "billing", "status", batch_id, "--json"], capture_output=True, text=True
    )
    return json.loads(done.stdout) if done.returncode == 0 else None


def _queued(settings: Settings) -> int:
    async def count() -> int:
        async with Storage(settings) as storage:
            queues = [*settings.input_queues, settings.results_queue]
            found = [await storage.queue(queue).get_queue_properties() for queue in queues]
        return sum(properties.approximate_message_count for properties in found)

    return asyncio.run(count())


def test_a_file_unreadable_past_its_head_is_refused_and_counts_nothing(
    streaming_env: Settings, roles: Roles, tmp_path: Path
) -> None:
    good = tmp_path / "good.csv"
    generate(150_000, good, seed=5, reject_rate=0.0)
    text = good.read_text()
    # Well past the head `billing submit` reads, and past the initiator's first blocks of rows.
    cut = text.index("\n", max(HEAD_BYTES, len(text) * 3 // 4)) + 1
    path = tmp_path / "late-defect.csv"
    path.write_text(text[:cut] + MALFORMED + text[cut:])

    submitted = billing(
        "submit", str(path), "--batch-id", "late", *sample_flags(tmp_path / "ref")
    )  # its head is fine: accepted for now
    assert "submitted" in submitted.stdout
    with roles.running(streaming_env), Store(streaming_env.sql_url_value) as store:
        # Polled in the store, not by a `billing status` process per look; the CLI shows the end below.
        assert wait_until(lambda: (s := store.batch("late")) is not None and s.state == "refused", 120, interval=0.2)
        assert wait_until(lambda: _queued(streaming_env) == 0, 120), "the items already sent are handled"
        status = _status("late")
    assert status is not None
    assert "malformed CSV" in status["refused_reason"]
    assert status["first_item_sent_at"] is not None, "work items left before the bad line was read"
    assert status["completed_items"] > 0, "and processors rated some of them"
    assert status["state"] == "refused" and status["transactions_recorded"] == 0
    assert (status["accepted"], status["rejected"]) == (0, 0)
    for kind in ("aggregates", "invoices", "rejects"):
        assert report(kind, "late") == [], f"a refused batch shows no {kind}"
