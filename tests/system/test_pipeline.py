"""The whole pipeline end to end: initiator, processor and controller as separate OS processes on
Azurite and SQL, fed through ``billing submit``, checked to the minor unit against the independent
row-at-a-time model in ``reference_model``."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from billing.sample import generate
from shared.messaging.envelope import BATCH_PREFIX, batch_blob
from shared.messaging.storage import Storage
from shared.settings import Settings
from shared.submissions import REQUESTED, TAKEN
from support.exact import billing, expected, read_raw, report, sorted_records
from support.references import sample_flags
from support.roles import Roles
from support.servicebus_broker import ServiceBusTestBroker
from support.waiting import wait_until

ROWS = 4_000
#: Work items that carry 300 rows (a Parquet file's) fit a message; 3,000 do not fit a 16 KiB one: they go by
#: claim check.
INLINE = {"WORK_ITEM_SIZE": "300"}
CLAIM_CHECKED = {"WORK_ITEM_SIZE": "3000", "MAX_MESSAGE_BYTES": "16384"}


@pytest.fixture
def pipeline_env(settings_env: Settings, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Settings:
    monkeypatch.setenv("BILLING_PARTITIONS", "3")
    for name, value in request.param.items():
        monkeypatch.setenv(f"BILLING_{name}", value)
    return Settings()


def claim_checks(settings: Settings, batch_id: str = "") -> list[str]:
    """The names of the claim-check blobs of ``batch_id`` (of every batch if empty)."""

    async def names() -> list[str]:
        async with Storage(settings) as storage:
            prefix = batch_blob(batch_id, "") if batch_id else BATCH_PREFIX
            return [
                b.name async for b in storage.container(settings.work_container).list_blobs(name_starts_with=prefix)
            ]

    return asyncio.run(names())


@pytest.mark.parametrize(
    "pipeline_env",
    [pytest.param(INLINE, id="inline-work-items"), pytest.param(CLAIM_CHECKED, id="claim-checked-work-items")],
    indirect=True,
)
def test_batches_in_every_format_come_out_exact(pipeline_env: Settings, roles: Roles, tmp_path: Path) -> None:
    batches = {}
    for seed, fmt in enumerate(("csv", "jsonl", "parquet"), start=1):
        path = tmp_path / f"batch.{fmt}"
        generate(ROWS, path, seed=seed, fmt=fmt, reject_rate=0.02)
        batches[f"batch-{fmt}"] = path

    with roles.running(pipeline_env):
        for batch_id, path in batches.items():
            assert (
                "submitted"
                in billing("submit", str(path), "--batch-id", batch_id, *sample_flags(tmp_path / "ref")).stdout
            )
        for batch_id, path in batches.items():
            billing(
                "submit", str(path), "--batch-id", batch_id, "--wait", *sample_flags(tmp_path / "ref")
            )  # exits non-zero unless complete
        again = billing(
            "submit", str(batches["batch-csv"]), "--batch-id", "batch-csv", "--wait", *sample_flags(tmp_path / "ref")
        )
        assert "already submitted; nothing changed" in again.stdout
    assert roles.returncodes == [0, 0, 0], "every role exits 0 on SIGTERM"

    for batch_id, path in batches.items():
        aggregates, invoices, rejects = expected(read_raw(path))
        status = json.loads(billing("status", batch_id, "--json").stdout)
        accepted = sum(a["transactions"] for a in aggregates)
        assert status["state"] == "complete"
        assert (status["rows"], status["accepted"], status["rejected"]) == (ROWS, accepted, len(rejects))
        assert status["completed_items"] == status["work_items"]
        most = -(-ROWS // pipeline_env.work_item_size)
        if batch_id == "batch-parquet":  # its rows in the messages: all but the last item are full
            assert status["work_items"] == most
        else:  # whole inbox frames: at least the work item size, the last few a part each
            assert status["work_items"] > 1
        assert status["poisoned_items"] == 0 and status["latency_seconds"] > 0
        assert status["accepted_at"] < status["completed_at"]

        got = report("aggregates", batch_id)
        for record in got:
            assert "E" not in record["quantity"] and not record["quantity"].endswith(".")
            assert not ("." in record["quantity"] and record["quantity"].endswith("0"))
            record["quantity"] = Decimal(record["quantity"])
        assert sorted_records(got) == aggregates
        assert sorted_records(report("invoices", batch_id)) == invoices
        assert [{"row": r["row"], "reason": r["reason"]} for r in report("rejects", batch_id)] == rejects
        assert len(rejects) > 0, "the sample carries defects, so rejects are exercised"
    # A text file's items name inbox frames: they always fit. A Parquet file's items carry their rows:
    # 300 fit; 3,000 overflow a 16 KiB message and go by claim check.
    work_blobs = [name.split("/") for name in claim_checks(pipeline_env) if name.split("/")[2] == "work"]
    if pipeline_env.max_message_bytes > 16384:
        assert work_blobs == []
    else:
        items = sorted(item.partition(".")[0] for *_, item in work_blobs)  # each named after its digest too
        assert items == ["batch-parquet:0000000", "batch-parquet:0000001"]


@pytest.mark.parametrize("pipeline_env", [pytest.param(INLINE, id="inline-work-items")], indirect=True)
def test_files_submitted_together_are_waited_for_together(pipeline_env: Settings, roles: Roles, tmp_path: Path) -> None:
    paths = [tmp_path / f"batch-{seed}.csv" for seed in (21, 22)]
    for seed, path in enumerate(paths, start=21):
        generate(ROWS, path, seed=seed, reject_rate=0.02)
    with roles.running(pipeline_env):
        done = billing(
            "submit", *map(str, paths), "--wait", *sample_flags(tmp_path / "ref")
        )  # exits non-zero unless both are complete
    batch_ids = re.findall(r"^batch (\S+) submitted", done.stdout, re.MULTILINE)
    assert len(batch_ids) == 2 and done.stdout.count("state: complete") == 2
    for batch_id, path in zip(batch_ids, paths, strict=True):
        aggregates, invoices, _ = expected(read_raw(path))
        got = [{**record, "quantity": Decimal(record["quantity"])} for record in report("aggregates", batch_id)]
        assert sorted_records(got) == aggregates
        assert sorted_records(report("invoices", batch_id)) == invoices


@pytest.mark.parametrize("pipeline_env", [pytest.param(CLAIM_CHECKED, id="claim-checked-work-items")], indirect=True)
def test_a_complete_batch_loses_its_claim_checks_after_the_retention(
    pipeline_env: Settings, roles: Roles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BILLING_CLAIM_CHECK_RETENTION", "0")
    path = tmp_path / "batch.csv"
    generate(ROWS, path, seed=11, reject_rate=0.02)
    with roles.running(pipeline_env):
        billing("submit", str(path), "--batch-id", "swept", "--wait", *sample_flags(tmp_path / "ref"))
        assert wait_until(
            lambda: json.loads(billing("status", "swept", "--json").stdout)["claims_deleted_at"] is not None,
            30,
            interval=0.5,
        ), "the controller did not delete the claim checks within 30 s"
    assert claim_checks(pipeline_env, "swept") == []
    controller_log = roles.logs()["controller-2.log"]
    deleted = re.search(r"batch swept: (\d+) claim-check blobs deleted", controller_log)
    assert deleted and int(deleted.group(1)) >= 1, "the 3,000-transaction work item went by claim check"

    async def inbox() -> list[str]:
        async with Storage(pipeline_env) as storage:
            return [b.name async for b in storage.container(pipeline_env.inbox_container).list_blobs()]

    kept = [REQUESTED.format("swept"), "swept", TAKEN.format("swept")]
    assert asyncio.run(inbox()) == kept, "the file and its marks are kept"
    aggregates, invoices, _ = expected(read_raw(path))
    got = [{**record, "quantity": Decimal(record["quantity"])} for record in report("aggregates", "swept")]
    assert sorted_records(got) == aggregates
    assert sorted_records(report("invoices", "swept")) == invoices


@pytest.fixture(params=["local", "servicebus"])
def trigger_env(
    settings_env: Settings, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[Settings]:
    """Roles that, once idle, sleep at least ten minutes between polls: only a trigger wakes them."""
    monkeypatch.setenv("BILLING_MIN_IDLE_INTERVAL", "600")
    monkeypatch.setenv("BILLING_MAX_IDLE_INTERVAL", "3600")
    monkeypatch.setenv("BILLING_SAFETY_POLL_INTERVAL", "3600")
    if request.param == "local":
        yield Settings()
        return
    # The test broker stands in for Azure Service Bus at the wire (see tests/support/servicebus_broker.py);
    # it creates each instance's subscription when the instance attaches.
    with ServiceBusTestBroker(topic=Settings().trigger_topic) as broker:
        monkeypatch.setenv("BILLING_SERVICEBUS_CONNECTION_STRING", broker.connection_string)
        monkeypatch.setenv("BILLING_TRIGGER_CREATE_SUBSCRIPTION", "false")
        yield Settings()


def test_idle_roles_are_woken_by_triggers(trigger_env: Settings, roles: Roles, tmp_path: Path) -> None:
    path = tmp_path / "batch.csv"
    generate(2_000, path, seed=9)
    with roles.running(trigger_env):
        assert wait_until(roles.polled_empty, 60, interval=0.2), "every role polls once, then sleeps ten minutes"
        billing(
            "submit", str(path), "--batch-id", "woken", "--wait", "--timeout", "120", *sample_flags(tmp_path / "ref")
        )
    assert roles.returncodes == [0, 0, 0]
    status = json.loads(billing("status", "woken", "--json").stdout)
    assert status["state"] == "complete" and status["rows"] == 2_000
