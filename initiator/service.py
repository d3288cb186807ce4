"""The initiator: takes batch requests, debatches files, enqueues work items, reports manifests."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueMessage

from shared.errors import InputError, PoisonMessage
from shared.messaging.envelope import ClaimCheck, batch_blob
from shared.messaging.poison import PoisonQueue
from shared.messaging.service import Service
from shared.messaging.storage import Storage
from shared.messaging.triggers import TriggerBus
from shared.protocol import BatchRequest, Manifest, WorkHeader, manifest_envelope, parse_request, work_envelope
from shared.refstore import PRICEBOOK, TAXES, ReferenceStore
from shared.rules.reference import load_price_book, load_tax_table
from shared.rules.schemas import REJECT_SCHEMA
from shared.settings import Settings

from .debatch import DebatchOutcome, debatch, read_spool

log = logging.getLogger(__name__)


class Initiator(Service):
    """Listens on the requests queue; each request becomes work items and one manifest."""

    name = "initiator"

    def __init__(
        self, *, storage: Storage, settings: Settings, triggers: TriggerBus | None = None, burst: bool = False
    ) -> None:
        super().__init__(storage=storage, settings=settings, triggers=triggers, burst=burst)
        self.claim_check = ClaimCheck(storage, container=settings.work_container, limit=settings.max_message_bytes)
        self.references = ReferenceStore(storage, container=settings.reference_container)
        self._sends = asyncio.Semaphore(settings.max_concurrent_sends)
        # One request is a whole file: take one at a time, keep its lease renewed.
        self.listen(
            settings.requests_queue,
            self.handle,
            poison=PoisonQueue(storage, self.claim_check),
            dequeue_batch_size=1,
            max_tasks=1,
        )

    async def handle(self, messages: list[QueueMessage]) -> Mapping[str, str]:
        poisoned: dict[str, str] = {}
        for message in messages:
            try:
                request = parse_request(await self.claim_check.unpack(message.content))
                await self.initiate(request)
            except PoisonMessage as exc:
                poisoned[message.id] = str(exc)
        return poisoned

    async def initiate(self, request: BatchRequest) -> Manifest:
        """Debatch one submitted file and enqueue its work items, then its manifest."""
        with tempfile.TemporaryDirectory(prefix="billing-initiator-") as scratch:
            path = Path(scratch) / "batch"
            spool_path = Path(scratch) / "spool"
            try:
                await self._download(request.blob_name, path)
                price_book = load_price_book(await self.references.get(PRICEBOOK, request.pricebook_hash))
                tax_table = load_tax_table(await self.references.get(TAXES, request.taxes_hash))
                with spool_path.open("w+b") as spool:
                    outcome = await asyncio.to_thread(
                        debatch,
                        path,
                        request.fmt,
                        price_book,
                        tax_table,
                        work_item_size=self.settings.work_item_size,
                        spool=spool,
                    )
                    spool.seek(0)
                    await self._enqueue(request, spool)
            except InputError as exc:
                if isinstance(exc, PoisonMessage) and exc.reason != "unknown_reference_data":
                    raise
                log.warning("batch %s refused: %s", request.batch_id, exc)
                return await self._report(request, None, refused=str(exc))
        return await self._report(request, outcome)

    async def _download(self, blob_name: str, path: Path) -> None:
        try:
            stream = await self.storage.container(self.settings.inbox_container).download_blob(blob_name)
        except ResourceNotFoundError as exc:
            raise PoisonMessage("missing_batch_file", f"inbox blob {blob_name} not found") from exc
        with path.open("wb") as file:
            async for chunk in stream.chunks():
                file.write(chunk)

    async def _enqueue(self, request: BatchRequest, spool: BinaryIO) -> None:
        """Send every spooled work item, round-robin over the input queues, a bounded number at once."""
        queues = self.settings.input_queues
        counts = {queue: [0, 0] for queue in queues}
        async with asyncio.TaskGroup() as sends:
            for seq, (rows, encoded) in enumerate(read_spool(spool)):
                header = WorkHeader(
                    work_item_id=f"{request.batch_id}:{seq:07d}",
                    batch_id=request.batch_id,
                    pricebook_hash=request.pricebook_hash,
                    taxes_hash=request.taxes_hash,
                    rows=rows,
                )
                queue = queues[seq % len(queues)]
                counts[queue][0] += 1
                counts[queue][1] += rows
                await self._sends.acquire()
                sends.create_task(self._send(queue, header, encoded, first=seq < len(queues)))
        await self.announce({queue: (messages, rows) for queue, (messages, rows) in counts.items() if messages})

    async def _send(self, queue: str, header: WorkHeader, encoded: bytes, *, first: bool) -> None:
        """Send one work item; the first on each queue wakes its processors at once."""
        try:
            await self.claim_check.send(
                queue,
                work_envelope(header, encoded),
                blob_name=batch_blob(header.batch_id, "work", header.work_item_id),
            )
        finally:
            self._sends.release()
        if first:
            await self.announce({queue: (1, header.rows)})

    async def _report(
        self, request: BatchRequest, outcome: DebatchOutcome | None, *, refused: str | None = None
    ) -> Manifest:
        manifest = Manifest(
            batch_id=request.batch_id,
            source=request.source,
            rows=outcome.rows if outcome else 0,
            accepted=outcome.accepted if outcome else 0,
            rejected=outcome.rejected if outcome else 0,
            work_items=outcome.work_items if outcome else 0,
            pricebook_hash=request.pricebook_hash,
            taxes_hash=request.taxes_hash,
            accepted_at=request.accepted_at,
            rejects=outcome.rejects if outcome else REJECT_SCHEMA.empty_table(),
            refused=refused,
        )
        envelope = manifest_envelope(manifest)
        await self.claim_check.send(
            self.settings.results_queue, envelope, blob_name=batch_blob(request.batch_id, "manifest")
        )
        await self.announce({self.settings.results_queue: (1, 0)})
        log.info(
            "batch %s: %d rows, %d accepted, %d rejected, %d work items",
            manifest.batch_id,
            manifest.rows,
            manifest.accepted,
            manifest.rejected,
            manifest.work_items,
        )
        return manifest
