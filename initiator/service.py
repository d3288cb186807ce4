"""The initiator: takes batch requests, cuts files into work items, enqueues them, reports manifests."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import io
import itertools
import logging
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueMessage
from opentelemetry.trace import SpanKind, StatusCode

from shared import inbox, telemetry
from shared.errors import InputError, PoisonMessage
from shared.messages import BatchRequest, IdsPart, Manifest, WorkHeader
from shared.messaging.envelope import ClaimCheck, batch_blob
from shared.messaging.poison import PoisonQueue
from shared.messaging.service import Service
from shared.messaging.storage import Storage
from shared.messaging.triggers import TriggerBus
from shared.refstore import PRICEBOOK, TAXES, ReferenceStore
from shared.rules.reference import load_price_book, load_tax_table
from shared.settings import Settings
from shared.submissions import mark_taken
from shared.wire import ids_envelope, manifest_envelope, parse_request, warm_up, work_envelope

from .debatch import Cut, Debatch
from .id_filter import SharedFilter
from .pipe import BlockPipe

log = logging.getLogger(__name__)


#: glibc's malloc serves allocations from this size on by mmap, handed back whole when freed. Left to its
#: sliding threshold, the duplicate check's runs (up to 16 MiB, reallocated with every chunk) fragment the
#: heap and raise the initiator's peak RSS on large files (docs/performance.md gives the current peak).
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number, <malloc.h>


def _map_large_allocations() -> None:
    """Have glibc map large allocations of this process, Arrow's buffers included (Arrow's own allocator,
    mimalloc, keeps freed memory in reserve: about 25 MB more at the peak of a 1,000,000-row cut)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    pa.set_memory_pool(pa.system_memory_pool())


@dataclass
class _Phases:
    """When one batch's work items went out; its ids parts sent so far."""

    first_item_sent_at: datetime | None = None
    last_item_sent_at: datetime | None = None
    debatched_at: datetime | None = None
    id_parts: int = 0

    def sent(self) -> None:
        self.last_item_sent_at = datetime.now(UTC)
        self.first_item_sent_at = self.first_item_sent_at or self.last_item_sent_at


class Initiator(Service):
    """Listens on the requests queue; each request becomes work items and one manifest."""

    name = "initiator"

    def __init__(
        self, *, storage: Storage, settings: Settings, triggers: TriggerBus | None = None, burst: bool = False
    ) -> None:
        super().__init__(storage=storage, settings=settings, triggers=triggers, burst=burst)
        _map_large_allocations()
        self.claim_check = ClaimCheck(storage, container=settings.work_container, limit=settings.max_message_bytes)
        self.references = ReferenceStore(storage, container=settings.reference_container)
        self.id_filter = SharedFilter(storage, container=settings.work_container, bits=settings.ledger_filter_bits)
        self.repeat(None, self.id_filter.load)  # read once as it starts, not when the first batch waits for it
        self.repeat(None, functools.partial(asyncio.to_thread, warm_up))  # the same for Arrow's imports
        self._sends = asyncio.Semaphore(settings.max_concurrent_sends)
        # Files are cut on one thread of their own: allocations spread over many threads keep a malloc
        # arena of freed memory each, which kept the peak RSS far higher.
        self._cutter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="debatch")
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
                envelope = await self.claim_check.unpack(message.content)
                request = parse_request(envelope)
                await mark_taken(self.storage.container(self.settings.inbox_container), request.batch_id)
                with telemetry.span(
                    "debatch",
                    telemetry.context_of(envelope.trace),  # a child of `billing submit`
                    SpanKind.CONSUMER,
                    {telemetry.BATCH_ID: request.batch_id, "billing.source": request.source},
                ) as span:
                    manifest = await self.initiate(request)
                    span.set_attributes({telemetry.ROWS: manifest.rows, "billing.work_items": manifest.work_items})
                    if manifest.refused:
                        span.set_status(StatusCode.ERROR, manifest.refused)
            except PoisonMessage as exc:
                poisoned[message.id] = str(exc)
        return poisoned

    async def initiate(self, request: BatchRequest) -> Manifest:
        """Debatch one submitted file: work items go out while it streams in, then its manifest.

        A file found unreadable part-way is refused whole: its manifest says so, and the controller
        leaves nothing of the batch counted, even what was already sent.
        """
        phases = _Phases()
        try:
            # The processors rate with them: a batch whose reference data is missing or invalid is refused now.
            for version in request.dated():
                load_price_book(await self.references.get(PRICEBOOK, version.pricebook_hash))
                load_tax_table(await self.references.get(TAXES, version.taxes_hash))
            debatch = Debatch(work_item_size=self.settings.work_item_size, id_filter=await self.id_filter.load())
            marked = self.id_filter.serial
            async with self._cuts(request, debatch) as cuts:
                await self._enqueue(request, cuts, debatch, phases, marked)
        except InputError as exc:
            if isinstance(exc, PoisonMessage) and exc.reason != "unknown_reference_data":
                raise
            log.warning("batch %s refused: %s", request.batch_id, exc)
            return await self._report(request, None, phases, refused=str(exc))
        merged = await self.id_filter.merge(request.batch_id, debatch.hashes())
        return await self._report(request, debatch, phases, serials=(marked, merged))

    @asynccontextmanager
    async def _cuts(self, request: BatchRequest, debatch: Debatch) -> AsyncIterator[Iterator[Cut]]:
        """The submitted file's work items as they are cut: a text file's from its frames as they download
        (and decompress); a Parquet file's once it is downloaded whole to a scratch file (it is read from its
        footer)."""
        blob = self.storage.container(self.settings.inbox_container).get_blob_client(request.blob_name)
        try:
            if request.fmt != "parquet":
                committed, _ = await blob.get_block_list("committed")
            download = await blob.download_blob()
        except ResourceNotFoundError as exc:
            raise PoisonMessage("missing_batch_file", f"inbox blob {request.blob_name} not found") from exc
        if request.fmt == "parquet":
            with tempfile.TemporaryFile(prefix="billing-initiator-") as scratch:
                async for block in download.chunks():
                    scratch.write(block)
                scratch.seek(0)
                yield debatch.tables(scratch, request.fmt)
            return
        if download.properties.metadata.get(inbox.CODEC_KEY) != inbox.CODEC:
            raise PoisonMessage("bad_batch_file", f"inbox blob {request.blob_name} is not in {inbox.CODEC} frames")
        frames = inbox.frame_index((block.id, block.size) for block in committed)
        pipe = BlockPipe()
        feeding = asyncio.create_task(pipe.feed(download.chunks()))
        try:
            stream = io.BufferedReader(pipe, buffer_size=1 << 20)
            if self.settings.work_item_rows == "message":
                yield debatch.tables(inbox.file_stream(inbox.read_frames(stream, frames)), request.fmt)
            else:
                yield debatch.parts(request.blob_name, request.fmt, frames, stream)
        finally:
            pipe.close()
            feeding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeding

    async def _enqueue(
        self, request: BatchRequest, cuts: Iterator[Cut], debatch: Debatch, phases: _Phases, marked: int
    ) -> None:
        """Send work items as they are cut (cut in a thread), round-robin over the input queues, a
        bounded number at once; announce each queue's first item at once, then the totals. The batch's ids go
        to the controller in parts as they are cut (the rest with the manifest). Each item names ``marked``, the
        filter's serial its rows were marked against."""
        queues = self.settings.input_queues
        counts = {queue: [0, 0] for queue in queues}
        stopped: Exception | None = None  # raised once the items already sent are out
        async with asyncio.TaskGroup() as sends:
            for seq in itertools.count():
                try:
                    cut = await asyncio.get_running_loop().run_in_executor(self._cutter, next, cuts, None)
                except Exception as exc:
                    stopped = exc
                    break
                if cut is None:
                    break
                header = WorkHeader(
                    work_item_id=f"{request.batch_id}:{seq:07d}",
                    batch_id=request.batch_id,
                    pricebook_hash=request.pricebook_hash,
                    taxes_hash=request.taxes_hash,
                    rows=cut.rows,
                    part=cut.part,
                    marked=marked,
                    versions=request.dated(),
                )
                queue = queues[seq % len(queues)]
                counts[queue][0] += 1
                counts[queue][1] += cut.rows
                await self._sends.acquire()
                sends.create_task(self._send(queue, header, cut.payload, phases, first=seq < len(queues)))
                if (ids := debatch.take_ids(self.settings.ids_part_rows)) is not None:
                    await self._sends.acquire()
                    sends.create_task(self._send_ids(IdsPart(request.batch_id, phases.id_parts, ids)))
                    phases.id_parts += 1
        if stopped is not None:
            raise stopped
        phases.debatched_at = datetime.now(UTC)
        await self.announce({queue: (messages, rows) for queue, (messages, rows) in counts.items() if messages})

    async def _send(self, queue: str, header: WorkHeader, encoded: bytes, phases: _Phases, *, first: bool) -> None:
        """Send one work item (in a span of its own: the parent of its rating); the first on each
        queue wakes its processors at once."""
        attributes: dict[str, str | int] = {
            telemetry.BATCH_ID: header.batch_id,
            telemetry.WORK_ITEM_ID: header.work_item_id,
            telemetry.ROWS: header.rows,
        }
        try:
            with telemetry.span("send work item", kind=SpanKind.PRODUCER, attributes=attributes):
                await self.claim_check.send(
                    queue,
                    work_envelope(header, encoded),
                    blob_name=batch_blob(header.batch_id, "work", header.work_item_id),
                )
        finally:
            self._sends.release()
        phases.sent()
        if first:
            await self.announce({queue: (1, header.rows)})

    async def _send_ids(self, part: IdsPart) -> None:
        """Send a batch's ids part to the controller (encoded in a thread: the work items keep going out)."""
        try:
            blob_name = batch_blob(part.batch_id, "ids", str(part.part))
            envelope = await asyncio.to_thread(ids_envelope, part)
            await self.claim_check.send(self.settings.results_queue, envelope, blob_name=blob_name)
        finally:
            self._sends.release()

    async def aclose(self) -> None:
        await asyncio.to_thread(self._cutter.shutdown)

    async def _report(
        self,
        request: BatchRequest,
        debatch: Debatch | None,
        phases: _Phases,
        *,
        refused: str | None = None,
        serials: tuple[int, int] | None = None,
    ) -> Manifest:
        manifest = Manifest(
            batch_id=request.batch_id,
            source=request.source,
            rows=debatch.rows if debatch else 0,
            work_items=debatch.work_items if debatch else 0,
            pricebook_hash=request.pricebook_hash,
            taxes_hash=request.taxes_hash,
            accepted_at=request.accepted_at,
            refused=refused,
            uploaded_at=request.uploaded_at,
            first_item_sent_at=phases.first_item_sent_at,
            last_item_sent_at=phases.last_item_sent_at,
            debatched_at=phases.debatched_at,
            filter_serial=None if serials is None else serials[0],
            id_serial=None if serials is None else serials[1],
            ids=debatch.ids() if debatch else None,
            id_parts=phases.id_parts,
            versions=request.dated(),
        )
        envelope = manifest_envelope(manifest)
        await self.claim_check.send(
            self.settings.results_queue, envelope, blob_name=batch_blob(request.batch_id, "manifest")
        )
        await self.announce({self.settings.results_queue: (1, 0)})
        log.info("batch %s: %d rows, %d work items", manifest.batch_id, manifest.rows, manifest.work_items)
        return manifest
