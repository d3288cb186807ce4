"""The storage gateway counts every request the SDK puts on the wire, by kind, per service."""

from __future__ import annotations

from shared.messaging.storage import Storage
from shared.settings import Settings


async def test_requests_are_counted_by_kind(storage: Storage, settings_env: Settings) -> None:
    before = dict(storage.counter.counts)
    queue = storage.queue(settings_env.results_queue)
    await queue.send_message("one")
    await queue.send_message("two")
    pages = queue.receive_messages(max_messages=32, messages_per_page=32).by_page()
    received = [m async for m in await anext(pages)]
    await queue.update_message(received[0], visibility_timeout=1)
    for message in received[1:]:
        await queue.delete_message(message)
    await queue.peek_messages()
    await queue.get_queue_properties()
    container = storage.container(settings_env.work_container)
    await container.upload_blob("b", b"x")
    await container.download_blob("b")
    [b async for b in container.list_blobs()]

    delta = {k: v - before.get(k, 0) for k, v in storage.counter.counts.items() if v != before.get(k, 0)}
    assert delta == {
        "queue.send": 2,
        "queue.receive": 1,
        "queue.update": 1,
        "queue.delete": 1,
        "queue.peek": 1,
        "queue.metadata": 1,
        "blob.put": 1,
        "blob.get": 1,
        "blob.list": 1,
    }
