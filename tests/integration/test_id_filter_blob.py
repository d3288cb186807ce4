"""The id filter as initiators share it, on Azurite: merges by two initiators at once both land (conditional
writes), each with its own serial; a reader sees every merge; a batch merged again keeps its first merge's serial
(its merge logged after the filter's bits); the size is the first writer's; a filter of several transfers is written
from pieces and read into place whole; an initiator reads the stored filter as it starts, and
names the serial it marked a batch's rows against in each work item."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from billing import client
from billing.sample import generate, sample_price_book_bytes, sample_tax_table_bytes
from initiator.id_filter import SharedFilter
from initiator.service import Initiator
from shared.messaging.envelope import ClaimCheck
from shared.messaging.storage import Storage
from shared.settings import Settings
from shared.wire import parse_request, parse_work_header
from support.waiting import wait_until_async


def _hashes(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**64, 1000, dtype=np.uint64)


async def test_two_initiators_merging_at_once_both_land_with_serials_in_order(
    storage: Storage, settings_env: Settings
) -> None:
    first, second = (SharedFilter(storage, container=settings_env.work_container, bits=1 << 16) for _ in range(2))
    empty = await first.load()
    await second.load()
    assert first.serial == 0 and not empty.might_contain(_hashes(1)).any()
    serials = await asyncio.gather(first.merge("a", _hashes(1)), second.merge("b", _hashes(2)))
    assert sorted(serials) == [1, 2]
    reader = SharedFilter(storage, container=settings_env.work_container, bits=1 << 20)
    seen = await reader.load()
    assert reader.serial == 2 and seen.bits == 1 << 16  # the size the blob was first written with
    assert seen.might_contain(np.concatenate([_hashes(1), _hashes(2)])).all()
    assert await first.merge("c", _hashes(3)) == 3  # its copy was stale: read again, merged
    assert (await second.load()).might_contain(_hashes(3)).all() and second.serial == 3
    writes = storage.counter.counts["blob.put"]
    again = SharedFilter(storage, container=settings_env.work_container, bits=1 << 16)
    assert await again.merge("a", _hashes(1)) == serials[0]  # cut again after its initiator died: already in
    assert again.serial == 3 and storage.counter.counts["blob.put"] == writes


async def test_the_merge_log_keeps_the_last_merges(storage: Storage, settings_env: Settings) -> None:
    writer = SharedFilter(storage, container=settings_env.work_container, bits=1 << 10, logged=3)
    assert [await writer.merge(f"b{n}", _hashes(n)) for n in range(1, 6)] == [1, 2, 3, 4, 5]
    reader = SharedFilter(storage, container=settings_env.work_container, bits=1 << 10, logged=3)
    assert await reader.merge("b5", _hashes(5)) == 5 and await reader.merge("b3", _hashes(3)) == 3  # logged
    assert await reader.merge("b1", _hashes(1)) == 6  # out of the log: merged again
    assert (await reader.load()).might_contain(np.concatenate([_hashes(n) for n in range(1, 6)])).all()


async def test_a_filter_larger_than_a_transfer_is_written_and_read_whole(
    storage: Storage, settings_env: Settings
) -> None:
    writer = SharedFilter(storage, container=settings_env.work_container, bits=1 << 27)  # 16 MiB: pieces of 4
    await writer.load()
    hashes = _hashes(4)  # their words spread over every piece
    assert await writer.merge("big", hashes) == 1
    reader = SharedFilter(storage, container=settings_env.work_container, bits=64)
    seen = await reader.load()
    assert seen.bits == 1 << 27 and seen.to_bytes() == (await writer.load()).to_bytes()
    assert seen.might_contain(hashes).all() and not seen.might_contain(_hashes(5)).any()


async def test_an_initiator_reads_the_stored_filter_as_it_starts_and_once(
    storage: Storage, settings_env: Settings
) -> None:
    writer = SharedFilter(storage, container=settings_env.work_container, bits=1 << 16)
    await writer.load()
    assert await writer.merge("earlier", _hashes(6)) == 1
    initiator = Initiator(storage=storage, settings=settings_env)
    running = asyncio.create_task(initiator.run())
    try:
        async with asyncio.timeout(30):
            await wait_until_async(lambda: initiator.id_filter.serial == 1)  # no batch asked for it
        downloads = storage.counter.counts["blob.get"]
        both = await asyncio.gather(initiator.id_filter.load(), initiator.id_filter.load())
        assert both[0] is both[1] and both[0].might_contain(_hashes(6)).all()
        assert storage.counter.counts["blob.get"] == downloads  # current: not read again
    finally:
        initiator.stop()
        await running


async def test_each_work_item_names_the_filter_serial_its_rows_were_marked_against(
    storage: Storage, settings_env: Settings, tmp_path: Path
) -> None:
    writer = SharedFilter(storage, container=settings_env.work_container, bits=1 << 16)
    await writer.load()
    assert await writer.merge("earlier", _hashes(7)) == 1
    await client.register(settings_env, sample_price_book_bytes(), sample_tax_table_bytes())
    path = tmp_path / "marked.csv"
    generate(500, path, seed=7)
    await client.submit(settings_env, path, batch_id="marked")
    claim_check = ClaimCheck(storage, container=settings_env.work_container, limit=settings_env.max_message_bytes)
    [message] = [m async for m in storage.queue(settings_env.requests_queue).receive_messages(max_messages=32)]
    initiator = Initiator(storage=storage, settings=settings_env.model_copy(update={"work_item_size": 100}))
    manifest = await initiator.initiate(parse_request(await claim_check.unpack(message.content)))
    assert (manifest.filter_serial, manifest.id_serial) == (1, 2) and manifest.work_items > 1
    headers = [
        parse_work_header(await claim_check.unpack(m.content))
        for queue in settings_env.input_queues
        async for m in storage.queue(queue).receive_messages(max_messages=32)
    ]
    assert len(headers) == manifest.work_items and {header.marked for header in headers} == {1}
