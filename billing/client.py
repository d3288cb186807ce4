"""The submitting side: hand a batch file over to the pipeline (:mod:`billing.progress` waits for it)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceModifiedError
from azure.storage.blob import BlobBlock
from azure.storage.blob.aio import BlobClient, ContainerClient

from shared import inbox, telemetry
from shared.errors import FileRefused, InfrastructureError, InputError
from shared.messages import BatchRequest
from shared.messaging.storage import Storage
from shared.messaging.tally import Tally, tallying
from shared.messaging.triggers import trigger_bus
from shared.refstore import FIRST_DATE, PRICEBOOK, TAXES, ReferenceStore, Registered
from shared.rules.batchfile import UNCLOSED_QUOTE, detect_format, line_blocks, read_chunks
from shared.rules.reference import load_price_book, load_tax_table
from shared.rules.versions import Version, dated
from shared.settings import Settings
from shared.submissions import REQUESTED, VOIDED, request_metadata, send_request

from .batch_ids import check_batch_id, file_digest

log = logging.getLogger(__name__)

#: How much of a file ``billing submit`` reads to refuse it early (the initiator reads the rest).
HEAD_BYTES = 1 << 20

#: Frames uploaded at once.
UPLOADS = 4

#: Why ``billing submit`` without its own reference data is refused when none is registered.
NONE_REGISTERED = (
    "no reference data registered: run `billing reference set --pricebook P --taxes T` once, "
    "or give --pricebook and --taxes"
)


@dataclass(frozen=True)
class Submission:
    batch_id: str
    fmt: str
    duplicate: bool  # the batch id had been submitted before; nothing changed
    requests: dict[str, int]  # storage requests the submission made, by kind


@dataclass(frozen=True)
class Turn:
    """A submission's place among files submitted together: its request goes out once the one before it went out
    (or that submission ended without one), so the initiator takes the batches, and numbers them, in the order
    given, however long each upload takes."""

    before: asyncio.Event | None = None
    done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    @classmethod
    def chain(cls, count: int) -> list[Turn]:
        """``count`` turns, each after the one before it."""
        turns: list[Turn] = []
        for _ in range(count):
            turns.append(cls(turns[-1].done if turns else None))
        return turns

    async def wait(self) -> None:
        """Until the submission before this one has sent its request or ended."""
        if self.before is not None:
            await self.before.wait()


def check_head(path: Path, fmt: str) -> None:
    """Refuse, cheaply, a file that is unreadable from its start (wrong format, bad header, bad first
    rows): read at most :data:`HEAD_BYTES` of it. What lies further is the initiator's to refuse."""
    with path.open("rb") as file:
        if fmt == "parquet":  # its schema is in the footer; the first rows of the first row group
            next(read_chunks(file, fmt, chunk_rows=1000), None)
            return
        head = file.read(HEAD_BYTES)
        whole = len(head) < HEAD_BYTES
    if not whole:
        head = head[: head.rfind(b"\n") + 1]
    try:
        for _ in read_chunks(io.BytesIO(head), fmt):
            pass
    except FileRefused as exc:
        # A cut inside a quoted field is the cut's doing, not the file's.
        if whole or UNCLOSED_QUOTE not in str(exc):
            raise


async def submit(
    settings: Settings,
    path: Path,
    *,
    batch_id: str | None = None,
    pricebook: Path | None = None,
    taxes: Path | None = None,
    turn: Turn | None = None,
) -> Submission:
    """Check ``path`` and hand it over: inbox blob, reference data, batch request message. Without its own price book
    and tax table the batch is rated with the registry's versions as they are now (:func:`register`); with none
    registered it is refused. With a ``turn``, the request goes out in it (the caller marks the turn done when this
    returns or raises)."""
    if batch_id is not None:
        check_batch_id(batch_id)
    size = path.stat().st_size
    if size > settings.max_file_bytes:
        raise FileRefused(
            f"{path.name} is {size:,} bytes, over the limit of {settings.max_file_bytes:,} (BILLING_MAX_FILE_BYTES)"
        )
    with path.open("rb") as file:
        fmt = detect_format(path.name, file.read(4096))
    head = asyncio.to_thread(check_head, path, fmt)
    if batch_id:
        await head
    else:  # the head checked while the file is hashed for the default batch id (hashing releases the GIL)
        batch_id = (await asyncio.gather(head, asyncio.to_thread(file_digest, path)))[1]
    pricebook_bytes = pricebook.read_bytes() if pricebook else None
    taxes_bytes = taxes.read_bytes() if taxes else None
    if pricebook_bytes is not None:  # refuse invalid reference data before anything is stored
        load_price_book(pricebook_bytes)
    if taxes_bytes is not None:
        load_tax_table(taxes_bytes)
    async with Storage(settings) as storage:
        await storage.ensure_all()
        root = {telemetry.BATCH_ID: batch_id, "billing.source": path.name}
        # The batch's first requests (its request message carries them) and the root span of its trace.
        with tallying(Tally()), telemetry.span("billing submit", attributes=root):
            references = ReferenceStore(storage, container=settings.reference_container)
            versions = await _versions(references, pricebook_bytes, taxes_bytes)
            request = BatchRequest(
                batch_id=batch_id,
                source=path.name,
                blob_name=batch_id,
                fmt=fmt,
                pricebook_hash=versions[-1].pricebook_hash,
                taxes_hash=versions[-1].taxes_hash,
                accepted_at=datetime.now(UTC),
                versions=versions,
            )
            container = storage.container(settings.inbox_container)
            if not await _upload(container, path, request):
                if await container.get_blob_client(VOIDED.format(batch_id)).exists():
                    raise InputError(f"batch {batch_id} was voided: submit a corrected file under an id of its own")
                return Submission(batch_id, fmt, duplicate=True, requests=storage.counter.snapshot())
            if turn is not None:
                await turn.wait()
            await send_request(storage, settings, dataclasses.replace(request, uploaded_at=datetime.now(UTC)))
            await announce(settings, storage)
            return Submission(batch_id, fmt, duplicate=False, requests=storage.counter.snapshot())


async def _versions(references: ReferenceStore, pricebook: bytes | None, taxes: bytes | None) -> tuple[Version, ...]:
    """The versions a batch is rated with: with both files given, those (stored by hash) on every date; otherwise the
    registry's versions, with the one file given (if any) in place of each version's."""
    if pricebook is not None and taxes is not None:
        return (Version(None, await references.put(PRICEBOOK, pricebook), await references.put(TAXES, taxes)),)
    registry = [registered.version for registered in await references.registry()]
    if not registry:
        raise InputError(NONE_REGISTERED)
    if pricebook is not None:
        digest = await references.put(PRICEBOOK, pricebook)
        registry = [dataclasses.replace(version, pricebook_hash=digest) for version in registry]
    if taxes is not None:
        digest = await references.put(TAXES, taxes)
        registry = [dataclasses.replace(version, taxes_hash=digest) for version in registry]
    return dated(registry)


async def register(
    settings: Settings, pricebook: bytes, taxes: bytes, effective_from: date = FIRST_DATE
) -> list[Registered]:
    """Check a price book and a tax table, store them by content hash, and register them as the version in force
    from ``effective_from`` (replacing that date's version, if any; by default from the first date on): what a batch
    submitted without its own is rated with, for its rows of that date on. The registry is returned, oldest first."""
    load_price_book(pricebook)  # refuse invalid reference data before anything is stored
    load_tax_table(taxes)
    async with Storage(settings) as storage:
        await storage.ensure(containers=[settings.reference_container])
        references = ReferenceStore(storage, container=settings.reference_container)
        digests = await references.put(PRICEBOOK, pricebook), await references.put(TAXES, taxes)
        return await references.register(Version(effective_from, *digests))


async def registry(settings: Settings) -> list[Registered]:
    """The registered versions, oldest first."""
    async with Storage(settings) as storage:
        await storage.ensure(containers=[settings.reference_container])
        return await ReferenceStore(storage, container=settings.reference_container).registry()


async def mark_voided(settings: Settings, batch_id: str) -> None:
    """Mark a batch voided in the inbox, so that submitting its id again is refused (the store voids it)."""
    async with Storage(settings) as storage:
        await storage.ensure(containers=[settings.inbox_container])
        await storage.container(settings.inbox_container).upload_blob(VOIDED.format(batch_id), b"", overwrite=True)


async def _upload(container: ContainerClient, path: Path, request: BatchRequest) -> bool:
    """Upload the file to its inbox blob (a text file as :mod:`shared.inbox` frames, its request in the
    metadata) unless it is there; False when that batch was already submitted. Each block goes with its MD5,
    which the service checks: one damaged on the way is refused (:class:`InfrastructureError`), and nothing of
    the file is committed. An inbox blob without its
    :data:`~shared.submissions.REQUESTED` mark is an upload whose request never went out (the submitting
    process died, or the upload's reply was lost and the SDK's retry found the blob): this submission
    carries on and sends it. Should two submissions of
    one file race, the initiator gets the request twice, which at-least-once delivery makes it handle
    anyway."""
    batch_id, codec = request.batch_id, inbox.codec(request.fmt)
    metadata = request_metadata(request)
    try:
        with path.open("rb") as file:
            if codec is None:
                await container.upload_blob(
                    batch_id, file, overwrite=False, max_concurrency=4, metadata=metadata, validate_content=True
                )
            else:
                metadata[inbox.CODEC_KEY] = codec
                frames = line_blocks(file, inbox.frame_bytes(path.stat().st_size))
                await _upload_frames(container.get_blob_client(batch_id), frames, metadata)
    except (ResourceExistsError, ResourceModifiedError):
        return not await container.get_blob_client(REQUESTED.format(batch_id)).exists()
    except HttpResponseError as exc:
        if getattr(exc, "error_code", None) != "Md5Mismatch":  # set by the storage SDK
            raise
        raise InfrastructureError(
            "the file arrived damaged at the storage account (a block's MD5 did not match); nothing of it was stored: "
            "submit it again"
        ) from exc
    return True


async def _upload_frames(blob: BlobClient, frames: Iterator[bytes], metadata: dict[str, str]) -> None:
    """Stage each frame as a block with its MD5 (read and compressed off the event loop while others upload, a
    few at once), then commit them unless the blob exists. The first block that fails fails the upload."""
    ids: list[str] = []
    slots = asyncio.Semaphore(UPLOADS)

    async def stage(block_id: str, data: bytes) -> None:
        try:
            await blob.stage_block(block_id, data, validate_content=True)
        finally:
            slots.release()

    try:
        async with asyncio.TaskGroup() as staging:
            while (frame := await asyncio.to_thread(next, frames, None)) is not None:
                ids.append(inbox.block_id(len(ids), len(frame)))
                data = await asyncio.to_thread(inbox.compress, frame)
                await slots.acquire()
                staging.create_task(stage(ids[-1], data))
    except ExceptionGroup as failed:  # the others were cancelled
        raise failed.exceptions[0] from None
    await blob.commit_block_list(
        [BlobBlock(block_id) for block_id in ids],
        metadata=metadata,
        match_condition=MatchConditions.IfMissing,
    )


async def announce(settings: Settings, storage: Storage) -> None:
    """Wake the initiator to a request just sent. A trigger is a hint: if it cannot be sent the initiator's safety poll
    still finds the request, so a failure is logged and the submission stands."""
    bus = trigger_bus(settings, storage)
    if bus is None:
        return
    try:
        async with bus:
            await bus.announce(storage.account_name, {settings.requests_queue: (1, 0)})
    except Exception as exc:
        log.warning("batch submitted, but no trigger was sent (%s); the initiator will find it by polling", exc)
