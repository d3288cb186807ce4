"""The inbox's side of a request that vanished (``shared.submissions``) on Azurite: a file keeps its request,
the unbilled are found by one listing, and the controller's rule sends again only a request that is lost."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Collection
from pathlib import Path

import pytest
from pydantic import SecretStr

from benchmarks.fault_proxy import GARBLED, FaultProxy
from billing import client
from billing.sample import generate, sample_price_book_bytes, sample_tax_table_bytes
from shared import inbox, submissions
from shared.errors import InfrastructureError
from shared.messaging.envelope import ClaimCheck
from shared.messaging.storage import Storage
from shared.settings import Settings
from shared.wire import parse_request
from store import Store
from support.records import manifest, result


async def nothing_accounted(batch_ids: list[str]) -> Collection[str]:
    return ()


async def submitted(settings: Settings, tmp_path: Path, batch_id: str) -> None:
    path = tmp_path / f"{batch_id}.csv"
    generate(50, path, seed=len(batch_id))
    await client.submit(settings, path, batch_id=batch_id)


async def requests_waiting(storage: Storage, settings: Settings) -> int:
    return (await storage.queue(settings.requests_queue).get_queue_properties()).approximate_message_count


async def test_the_file_keeps_its_request(settings_env: Settings, storage: Storage, tmp_path: Path) -> None:
    await client.register(settings_env, sample_price_book_bytes(), sample_tax_table_bytes())
    await submitted(settings_env, tmp_path, "kept")
    [message] = [m async for m in storage.queue(settings_env.requests_queue).receive_messages(max_messages=32)]
    claim_check = ClaimCheck(storage, container=settings_env.work_container, limit=settings_env.max_message_bytes)
    sent = parse_request(await claim_check.unpack(message.content))
    properties = await submissions.inbox_file(storage.container(settings_env.inbox_container), "kept")
    assert properties is not None
    kept = submissions.request_of(properties)
    assert dataclasses.replace(kept, uploaded_at=None) == dataclasses.replace(sent, uploaded_at=None)
    assert await submissions.inbox_file(storage.container(settings_env.inbox_container), "other") is None


async def test_a_file_damaged_on_its_way_is_refused_and_nothing_of_it_stored(
    settings_env: Settings, storage: Storage, tmp_path: Path
) -> None:
    await client.register(settings_env, sample_price_book_bytes(), sample_tax_table_bytes())
    path = tmp_path / "damaged.csv"
    generate(2_000, path, seed=3)  # a dozen blocks, staged a few at once
    container = storage.container(settings_env.inbox_container)
    assert settings_env.storage_connection_string is not None
    with FaultProxy(settings_env.storage_connection_string.get_secret_value(), kinds=[GARBLED]) as proxy:
        proxy.outage(600, kind=GARBLED, services=["blob"], path="comp=block&")  # the blocks, not the list
        garbling = settings_env.model_copy(update={"storage_connection_string": SecretStr(proxy.connection_string)})
        with pytest.raises(InfrastructureError, match="the file arrived damaged"):
            await client.submit(garbling, path, batch_id="damaged")
        assert proxy.injected["blob"][GARBLED] >= 1
    assert await submissions.inbox_file(container, "damaged") is None
    assert [b async for b in container.list_blobs()] == []  # not even a mark
    assert await requests_waiting(storage, settings_env) == 0

    await client.submit(settings_env, path, batch_id="damaged")  # undamaged, it is taken whole
    blob = container.get_blob_client("damaged")
    committed, _ = await blob.get_block_list("committed")
    frames = inbox.frame_index((block.id, block.size) for block in committed)
    stored = await (await blob.download_blob()).readall()
    assert b"".join(data for _, data in inbox.read_frames(io.BytesIO(stored), frames)) == path.read_bytes()
    assert await requests_waiting(storage, settings_env) == 1


async def test_only_a_lost_request_is_sent_again(settings_env: Settings, storage: Storage, tmp_path: Path) -> None:
    await client.register(settings_env, sample_price_book_bytes(), sample_tax_table_bytes())
    inbox = storage.container(settings_env.inbox_container)
    await submitted(settings_env, tmp_path, "one")
    await submitted(settings_env, tmp_path, "two")
    assert [file.batch_id for file in await submissions.unbilled(inbox, nothing_accounted)] == ["one", "two"]

    async def only(accounted: str) -> Collection[str]:
        return {accounted}

    assert [f.batch_id for f in await submissions.unbilled(inbox, lambda ids: only("one"))] == ["two"]

    resend = submissions.resend_stale
    assert await resend(storage, settings_env, 0, nothing_accounted) == [], "both requests wait in the queue"
    await storage.queue(settings_env.requests_queue).clear_messages()
    assert await resend(storage, settings_env, 3600, nothing_accounted) == [], "not that old yet"
    assert await resend(storage, settings_env, 0, lambda ids: only("one")) != [], "two is lost"
    assert await requests_waiting(storage, settings_env) == 1
    await storage.queue(settings_env.requests_queue).clear_messages()
    await submissions.mark_taken(inbox, "one")
    assert [f.batch_id for f in await resend(storage, settings_env, 0, nothing_accounted)] == ["two"]
    assert await requests_waiting(storage, settings_env) == 1, "an initiator has the request of one"


def test_a_batch_is_accounted_for_once_its_manifest_is_recorded(migrated_url: str) -> None:
    with Store(migrated_url) as store:
        store.apply([], [result("partial:1", batch_id="partial")])  # results before their manifest
        store.apply([manifest("accepted", work_items=2)], [result("accepted:1", batch_id="accepted")])
        store.apply([manifest("refused", refused="bad file")], [])
        asked = ["partial", "accepted", "refused", "unknown", *(f"many-{n}" for n in range(2500))]
        assert store.accounted(asked) == {"accepted", "refused"}
        assert store.accounted([]) == set()
