"""Poison messages through real role processes on Azurite: they land in ``<queue>-poison`` with the
right reason, the batch says so (``failed``, not stuck in ``processing``), and ``billing poison``
lists, shows, replays and purges them; a replay after fixing the cause completes the batch exactly. A message
of a kind no role knows is poison too, and leaves the batch it names as it was."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from billing.sample import generate, sample_price_book_bytes
from shared.messages import WorkHeader
from shared.messaging.envelope import ClaimCheck, Envelope, content_hash
from shared.messaging.storage import Storage
from shared.refstore import PRICEBOOK, ReferenceStore
from shared.settings import Settings
from shared.wire import work_envelope
from support.exact import assert_batch_exact, billing, expected, read_raw, report, sorted_records, status
from support.references import sample_flags
from support.roles import Roles

pytestmark = pytest.mark.usefixtures("settings_env")


def poison_list() -> dict[str, dict[str, Any]]:
    return {q["queue"]: q for q in json.loads(billing("poison", "list", "--json").stdout)}


async def _drop_price_book(settings: Settings) -> None:
    async with Storage(settings) as storage:
        await storage.container(settings.reference_container).delete_blob(
            f"{PRICEBOOK}/{content_hash(sample_price_book_bytes())}.csv"
        )


async def _restore_price_book(settings: Settings) -> None:
    async with Storage(settings) as storage:
        await ReferenceStore(storage, container=settings.reference_container).put(PRICEBOOK, sample_price_book_bytes())


def test_missing_reference_data_fails_the_batch_and_a_replay_completes_it(
    roles: Roles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BILLING_PARTITIONS", "2")
    monkeypatch.setenv("BILLING_WORK_ITEM_SIZE", "500")
    settings = Settings()
    batch = tmp_path / "batch.csv"
    generate(3_000, batch, seed=7, reject_rate=0.02)
    billing("submit", str(batch), "--batch-id", "b-ref", *sample_flags(tmp_path / "ref"))
    roles.burst("initiator")
    asyncio.run(_drop_price_book(settings))  # the cause: reference data the work items name is gone

    roles.burst("processor")
    roles.burst("controller")
    found = status("b-ref")
    items = found["work_items"]
    assert (found["state"], found["poisoned_items"], found["completed_items"]) == ("failed", items, 0)
    poisoned = poison_list()
    entries = [e for q in settings.input_queues for e in poisoned[q]["entries"]]
    assert len(entries) == items == sum(poisoned[q]["count"] for q in settings.input_queues)
    assert all(e["reason"].startswith("unknown_reference_data") for e in entries)
    assert all(json.loads(e["content"])["headers"]["batch_id"] == "b-ref" for e in entries)
    shown = json.loads(billing("poison", "show", entries[0]["message_id"]).stdout)
    assert [e["id"] for e in shown] == [entries[0]["id"]]
    assert poison_list() == poisoned, "show leaves entries where they are"

    asyncio.run(_restore_price_book(settings))  # the fix
    assert f"replayed {items} poisoned message(s)" in billing("poison", "replay", "--all").stdout
    assert all(poison_list()[q]["count"] == 0 for q in settings.input_queues)
    roles.burst("processor")
    roles.burst("controller")
    found = status("b-ref")
    assert (found["state"], found["poisoned_items"], found["completed_items"]) == ("complete", 0, items)
    aggregates, invoices, _ = expected(read_raw(batch))
    got = report("aggregates", "b-ref")
    for record in got:
        record["quantity"] = type(aggregates[0]["quantity"])(record["quantity"])
    assert sorted_records(got) == aggregates
    assert sorted_records(report("invoices", "b-ref")) == invoices


async def _send_crafted(settings: Settings) -> None:
    """Three input messages that can never be processed, each for its own reason."""
    async with Storage(settings) as storage:
        await storage.ensure_all()
        queue = storage.queue(settings.input_queues[0])
        await queue.send_message("this is not an envelope")
        header = WorkHeader("w-tampered", "b-crafted", "pb", "tx", 1)
        tampered = json.loads(
            await ClaimCheck(storage, container=settings.work_container, limit=settings.max_message_bytes).pack(
                work_envelope(header, b"payload"), queue=queue.queue_name, blob_name="unused"
            )
        )
        tampered["data"] = base64.b64encode(b"other payload").decode()
        await queue.send_message(json.dumps(tampered))
        missing = {
            "v": 1,
            "kind": "work",
            "headers": {**WorkHeader("w-missing", "b-crafted", "pb", "tx", 1).__dict__},
            "sha256": content_hash(b"x"),
            "blob": {"container": settings.work_container, "name": "work/never-written"},
        }
        await queue.send_message(json.dumps(missing))


def test_malformed_messages_are_poisoned_with_their_reasons_and_purged(settings_env: Settings, roles: Roles) -> None:
    asyncio.run(_send_crafted(settings_env))
    roles.burst("processor")
    roles.burst("controller")
    entries = poison_list()[settings_env.input_queues[0]]["entries"]
    reasons = sorted(e["reason"].split(":")[0] for e in entries)
    assert reasons == ["bad_envelope", "checksum_mismatch", "missing_claim_check"]
    assert "this is not an envelope" in [e["content"] for e in entries], "the original content is kept"
    # The two that name a work item are reported to their batch; the garbage one cannot be.
    crafted = status("b-crafted")
    assert (crafted["state"], crafted["poisoned_items"]) == ("processing", 2)  # no manifest: size unknown

    assert "purged 3 poisoned message(s)" in billing("poison", "purge", "--all").stdout
    assert poison_list()[settings_env.input_queues[0]]["count"] == 0
    refused = subprocess.run([sys.executable, "-m", "billing", "poison", "purge"], capture_output=True, text=True)
    assert refused.returncode != 0 and "--all" in refused.stderr


async def _send_of_unknown_kind(settings: Settings, batch_id: str) -> None:
    """A message on the results queue of a kind no role knows, its headers those of results for a work item of
    ``batch_id``."""
    async with Storage(settings) as storage:
        claim_check = ClaimCheck(storage, container=settings.work_container, limit=settings.max_message_bytes)
        item = {"work_item_id": f"{batch_id}:0", "batch_id": batch_id, "transactions": 1, "groups": 1}
        envelope = Envelope("refund", {"items": [item], "tables": {}})
        await claim_check.send(settings.results_queue, envelope, blob_name="unused")


def test_a_message_of_a_kind_no_role_knows_is_poisoned_and_leaves_the_batch_it_names_as_it_was(
    settings_env: Settings, roles: Roles, tmp_path: Path
) -> None:
    batch = tmp_path / "batch.csv"
    generate(1_000, batch, seed=11)
    billing("submit", str(batch), "--batch-id", "b-kind", *sample_flags(tmp_path / "ref"))
    roles.burst("initiator")
    roles.burst("controller")  # the manifest recorded; the work items wait for a processor
    before = status("b-kind")
    asyncio.run(_send_of_unknown_kind(settings_env, "b-kind"))

    roles.burst("controller")
    (entry,) = poison_list()[settings_env.results_queue]["entries"]
    assert entry["reason"].startswith("unknown_kind: ") and "'refund'" in entry["reason"], entry["reason"]
    assert json.loads(entry["content"])["kind"] == "refund", "the original content is kept"
    assert status("b-kind") == before, "no poison notice, no results: the batch is as it was"
    roles.burst("processor")
    roles.burst("controller")
    assert_batch_exact("b-kind", batch)
