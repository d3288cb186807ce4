"""The controller's handler over Azurite and SQLite: it reads the claim checks of the messages one receive brought
all at once, not one after the other, records what they carry, and tells a damaged one among them as poison."""

from __future__ import annotations

import asyncio
import json
import random

from controller.service import Controller
from shared.messaging.envelope import Envelope
from shared.messaging.storage import Storage
from shared.settings import Settings
from shared.wire import results_envelope
from store import Store
from support.records import partial, result


async def test_the_claim_checks_of_a_receive_are_read_at_once_and_a_damaged_message_is_poison(
    settings_env: Settings,
) -> None:
    rng = random.Random(5)
    items = [
        result(f"b1:{i}", *(partial(f"acct-{n}", net=rng.randrange(10**20)) for n in range(2000))) for i in range(4)
    ]
    async with Storage(settings_env) as storage:
        await storage.ensure_all()
        store = await asyncio.to_thread(Store, settings_env.sql_url_value)
        try:
            controller = Controller(storage=storage, settings=settings_env, store=store)
            queue = storage.queue(settings_env.results_queue)
            for i, item in enumerate(items):
                text = await controller.claim_check.pack(
                    results_envelope([item]), queue=settings_env.results_queue, blob_name=f"b1/results/{i}"
                )
                assert "blob" in json.loads(text)  # read from a blob of its own
                await queue.send_message(text)
            await queue.send_message("not a message")
            messages = [message async for message in queue.receive_messages(messages_per_page=32, max_messages=32)]
            assert len(messages) == len(items) + 1
            reading = most = 0
            unpack = controller.claim_check.unpack

            async def counted(text: str) -> Envelope:
                nonlocal reading, most
                reading += 1
                most = max(most, reading)
                try:
                    return await unpack(text)
                finally:
                    reading -= 1

            controller.claim_check.unpack = counted  # type: ignore[method-assign]
            poisoned = await controller.handle(messages)
            assert most == len(messages)
            damaged = next(message.id for message in messages if message.content == "not a message")
            assert list(poisoned) == [damaged]
            status = await asyncio.to_thread(store.batch, "b1")
            assert status is not None and status.completed_items == len(items)
            assert status.transactions_recorded == sum(item.transactions for item in items)
        finally:
            store.close()
