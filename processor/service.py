"""The processor: one listener per input queue; rates work items and sends partial aggregates."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueMessage
from opentelemetry.trace import Span, SpanKind, StatusCode

from shared import telemetry
from shared.errors import PoisonMessage
from shared.messages import WorkHeader
from shared.messaging.capacity import Capacity
from shared.messaging.envelope import ClaimCheck, Envelope, batch_blob
from shared.messaging.poison import PoisonQueue
from shared.messaging.service import Service
from shared.messaging.storage import Storage
from shared.messaging.triggers import TriggerBus
from shared.refstore import PRICEBOOK, TAXES, ReferenceStore
from shared.settings import Settings
from shared.wire import notify_controller, parse_work_header

from .jobs import rate_work_items
from .pool import RatingPool


class Processor(Service):
    """Rates work items from every input queue into the results queue."""

    name = "processor"

    def __init__(
        self, *, storage: Storage, settings: Settings, triggers: TriggerBus | None = None, burst: bool = False
    ) -> None:
        super().__init__(storage=storage, settings=settings, triggers=triggers, burst=burst)
        self.claim_check = ClaimCheck(storage, container=settings.work_container, limit=settings.max_message_bytes)
        self.references = ReferenceStore(storage, container=settings.reference_container)
        self._pool = RatingPool(settings.cpu_workers, niceness=settings.rating_niceness)
        poison = PoisonQueue(
            storage, self.claim_check, on_poisoned=notify_controller(self.claim_check, settings.results_queue)
        )
        # What the workers can start now, and the prefetch: the rest of the queues stays for other processors.
        self.capacity = Capacity(settings.cpu_workers * (1 + settings.prefetch_per_worker))
        for name in settings.input_queues:
            self.listen(name, self.handle, poison=poison, queues=settings.partitions, capacity=self.capacity)

    async def handle(self, messages: list[QueueMessage]) -> Mapping[str, str]:
        """Rate one dequeued batch; send its results; the listener then deletes the inputs."""
        poisoned: dict[str, str] = {}
        items: list[tuple[WorkHeader, bytes, bytes]] = []
        rated: list[QueueMessage] = []
        spans: list[Span] = []  # one per work item, in its batch's trace
        references: dict[str, bytes] = {}
        for message in messages:
            try:
                envelope = await self.claim_check.unpack(message.content)
                header = parse_work_header(envelope)
                for version in header.dated():
                    for kind, digest in ((PRICEBOOK, version.pricebook_hash), (TAXES, version.taxes_hash)):
                        references[digest] = await self.references.get(kind, digest)
                text = await self._read_part(header)
            except PoisonMessage as exc:
                poisoned[message.id] = str(exc)
                continue
            items.append((header, envelope.payload, text))
            rated.append(message)
            spans.append(_rating_span(header, envelope))
        if not items:
            return poisoned
        with telemetry.ending(spans):
            traces = [telemetry.carrier(span) for span in spans]
            # Should the retry on a new pool break too, the error hands the messages back: a work
            # item that kills every worker it meets ends as poison.
            results, bad = await self._pool.run(rate_work_items, items, references, traces)
            poisoned.update({rated[index].id: reason for index, reason in bad.items()})
            for index, reason in bad.items():
                spans[index].set_status(StatusCode.ERROR, reason)
            if results is not None:
                # Named after the first item's batch: the blob is spent once that batch is complete.
                blob_name = batch_blob(items[0][0].batch_id, "results", uuid.uuid4().hex)
                await self.claim_check.send(self.settings.results_queue, results, blob_name=blob_name)
                await self.announce({self.settings.results_queue: (1, sum(header.rows for header, *_ in items))})
        # The results are enqueued: from here the inputs may be deleted.
        return poisoned

    async def _read_part(self, header: WorkHeader) -> bytes:
        """The bytes of the inbox blob that a work item's part names, in one ranged read (none without a part)."""
        part = header.part
        if part is None:
            return b""
        container = self.storage.container(self.settings.inbox_container)
        try:
            download = await container.download_blob(part.blob, offset=part.start, length=part.end - part.start)
            data: bytes = await download.readall()
        except ResourceNotFoundError as exc:
            raise PoisonMessage("missing_batch_file", f"inbox blob {part.blob} not found") from exc
        return data

    async def aclose(self) -> None:
        await asyncio.to_thread(self._pool.shutdown)


def _rating_span(header: WorkHeader, envelope: Envelope) -> Span:
    """The span of one work item's rating, a child of its send: it lasts as long as the dequeued
    batch it is rated with (the work items of one dequeue are rated and their results sent together)."""
    attributes: dict[str, str | int] = {
        telemetry.BATCH_ID: header.batch_id,
        telemetry.WORK_ITEM_ID: header.work_item_id,
        telemetry.ROWS: header.rows,
        telemetry.REQUESTS: envelope.requests,  # those of its send, so far
    }
    context = telemetry.context_of(envelope.trace)
    return telemetry.TRACER.start_span("rate work item", context, SpanKind.CONSUMER, attributes)
