"""Claim check against Azurite: inline when it fits, blob when not, damaged messages are poison."""

from __future__ import annotations

import json
import os

import pytest

from shared.errors import PoisonMessage
from shared.messaging.envelope import ClaimCheck, Envelope
from shared.messaging.storage import Storage
from shared.settings import Settings


@pytest.fixture
async def claim_check(settings_env: Settings):
    async with Storage(settings_env) as storage:
        await storage.ensure_all()
        yield ClaimCheck(storage, container=settings_env.work_container, limit=settings_env.max_message_bytes), storage


async def test_small_payload_travels_inline(claim_check) -> None:  # type: ignore[no-untyped-def]
    check, storage = claim_check
    envelope = Envelope("work", {"a": 1}, b"x" * 1000)
    text = await check.pack(envelope, queue="q", blob_name="small")
    assert "data" in json.loads(text)
    assert storage.counter.snapshot().get("blob.put", 0) == 0
    assert await check.unpack(text) == envelope


async def test_large_payload_goes_to_blob_and_round_trips_through_a_queue(claim_check, settings_env: Settings) -> None:  # type: ignore[no-untyped-def]
    check, storage = claim_check
    envelope = Envelope("work", {"a": 2}, os.urandom(60_000))
    text = await check.pack(envelope, queue="q", blob_name="large")
    name = f"large.{json.loads(text)['sha256'][:16]}"
    assert json.loads(text)["blob"] == {"container": settings_env.work_container, "name": name}
    queue = storage.queue(settings_env.requests_queue)
    await queue.send_message(text)
    message = await queue.receive_message()
    assert await check.unpack(message.content) == envelope


async def test_inline_limit_is_the_queue_limit(claim_check, settings_env: Settings) -> None:  # type: ignore[no-untyped-def]
    check, storage = claim_check
    # The biggest payload that still goes inline must be accepted by the queue service.
    size = 40_000
    while "data" in json.loads(
        await check.pack(Envelope("k", {}, os.urandom(size + 500)), queue="q", blob_name="probe")
    ):
        size += 500
    text = await check.pack(Envelope("k", {}, os.urandom(size)), queue="q", blob_name="probe")
    assert "data" in json.loads(text)
    await storage.queue(settings_env.requests_queue).send_message(text)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda m: "not json", "bad_envelope"),
        (lambda m: json.dumps({**json.loads(m), "sha256": "0" * 64}), "checksum_mismatch"),
        (lambda m: json.dumps({**json.loads(m), "v": 99}), "bad_envelope"),
    ],
)
async def test_damaged_messages_are_poison(claim_check, mutate, reason) -> None:  # type: ignore[no-untyped-def]
    check, _ = claim_check
    text = await check.pack(Envelope("work", {}, b"payload"), queue="q", blob_name="x")
    with pytest.raises(PoisonMessage) as caught:
        await check.unpack(mutate(text))
    assert caught.value.reason == reason


async def test_missing_claim_check_blob_is_poison(claim_check) -> None:  # type: ignore[no-untyped-def]
    check, storage = claim_check
    text = await check.pack(Envelope("work", {}, os.urandom(80_000)), queue="q", blob_name="gone")
    ref = json.loads(text)["blob"]
    await storage.container(ref["container"]).delete_blob(ref["name"])
    with pytest.raises(PoisonMessage) as caught:
        await check.unpack(text)
    assert caught.value.reason == "missing_claim_check"


async def test_a_message_sent_again_with_other_content_leaves_the_first_readable(claim_check) -> None:  # type: ignore[no-untyped-def]
    check, _ = claim_check
    first, second = os.urandom(80_000), os.urandom(80_000)  # a work item cut again, marked otherwise
    texts = [
        await check.pack(Envelope("work", {}, payload), queue="q", blob_name="item") for payload in (first, second)
    ]
    assert [(await check.unpack(text)).payload for text in texts] == [first, second]
