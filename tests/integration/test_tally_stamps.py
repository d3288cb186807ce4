"""The request stamps messages carry (``shared.messaging.tally``), sent and received through the
claim check on Azurite."""

from __future__ import annotations

import json
import os

from shared.messaging.envelope import ClaimCheck, Envelope
from shared.messaging.storage import Storage
from shared.messaging.tally import INHERITED, Tally, tallying
from shared.settings import Settings


async def test_messages_carry_their_stamp_and_the_receiver_inherits_it(
    storage: Storage, settings_env: Settings
) -> None:
    check = ClaimCheck(storage, container=settings_env.work_container, limit=settings_env.max_message_bytes)
    queue = settings_env.input_queues[0]
    with tallying(sender := Tally()):
        await check.send(queue, Envelope("work", {"n": 1}, os.urandom(1_000)), blob_name="inline")
        await check.send(queue, Envelope("work", {"n": 2}, os.urandom(60_000)), blob_name="claim-checked")
    assert sender.counts == {"queue.send": 2, "blob.put": 1}
    received = [m async for m in storage.queue(queue).receive_messages(max_messages=2)]
    stamps = sorted(json.loads(m.content)["requests"] for m in received)
    assert stamps == [1, 2], "one send each; the large one also its claim-check blob"
    with tallying(receiver := Tally()):
        envelopes = [await check.unpack(m.content) for m in received]
    assert sorted(e.requests for e in envelopes) == [1, 2]
    assert receiver.counts == {INHERITED: 3, "blob.get": 1}
    # Outside a tally no stamp is written, and the inline limit holds with one.
    assert "requests" not in json.loads(await check.pack(Envelope("work", {}, b"x"), queue=queue, blob_name="x"))
