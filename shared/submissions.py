"""A submitted batch in the inbox beyond its file's bytes (:mod:`shared.inbox`): the marks that say how far its
request got, sending that request (again), and finding the files no batch accounts for.

Marks are empty blobs beside the files (a batch id has no ``/``, so they never clash with one):

- ``requested/<id>``: its request was sent; rewritten by each send, so its time is the last send's;
- ``taken/<id>``: an initiator took its request (written before debatching);
- ``voided/<id>``: the batch was voided; submitting its id again is refused.

A file's metadata keeps what its request says (format, source, reference hashes, when it was accepted), so
that the request can be sent again from the inbox alone. Sending a request twice is safe: the controller
records each work item and manifest once (see "Exactly once" in docs/architecture.md).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob import BlobProperties
from azure.storage.blob.aio import ContainerClient

from .errors import InputError, PoisonMessage
from .messages import BatchRequest
from .messaging.envelope import ClaimCheck, batch_blob, peek_headers
from .messaging.storage import Storage
from .settings import Settings
from .wire import parse_versions, request_envelope, versions_json

REQUESTED = "requested/{}"
TAKEN = "taken/{}"
VOIDED = "voided/{}"

#: Requests a peek at the requests queue sees at most (the service's limit).
PEEK = 32


@dataclass(frozen=True)
class InboxFile:
    """A batch file in the inbox: its batch id, the name it was submitted under, when it was uploaded."""

    batch_id: str
    source: str
    created: datetime

    def age(self, now: datetime | None = None) -> float:
        """Seconds since the file was uploaded."""
        return ((now or datetime.now(UTC)) - self.created).total_seconds()


def request_metadata(request: BatchRequest) -> dict[str, str]:
    """The inbox file's metadata that keeps its request (metadata is ASCII)."""
    return {
        "source": request.source[:200].encode("ascii", "replace").decode(),
        "format": request.fmt,
        "pricebook": request.pricebook_hash,
        "taxes": request.taxes_hash,
        "versions": json.dumps(versions_json(request.versions), separators=(",", ":")),
        "accepted_at": request.accepted_at.isoformat(),
    }


def request_of(properties: BlobProperties) -> BatchRequest:
    """The request of an inbox file, from its metadata (:func:`request_metadata`)."""
    metadata, name = properties.metadata or {}, str(properties.name)
    try:
        return BatchRequest(
            batch_id=name,
            source=metadata["source"],
            blob_name=name,
            fmt=metadata["format"],
            pricebook_hash=metadata["pricebook"],
            taxes_hash=metadata["taxes"],
            accepted_at=datetime.fromisoformat(metadata["accepted_at"]),
            uploaded_at=properties.last_modified,
            versions=parse_versions(json.loads(metadata.get("versions", "[]"))),
        )
    except (KeyError, ValueError, PoisonMessage):
        raise InputError(
            f"the inbox file of batch {name} does not keep its request: submit the file under a batch id of its own"
        ) from None


async def send_request(storage: Storage, settings: Settings, request: BatchRequest) -> None:
    """Send a batch's request to the initiator and mark it requested (the caller announces it)."""
    claim_check = ClaimCheck(storage, container=settings.work_container, limit=settings.max_message_bytes)
    await claim_check.send(
        settings.requests_queue, request_envelope(request), blob_name=batch_blob(request.batch_id, "request")
    )
    await storage.container(settings.inbox_container).upload_blob(
        REQUESTED.format(request.batch_id), b"", overwrite=True
    )


async def mark_taken(container: ContainerClient, batch_id: str) -> None:
    """Record that an initiator took the batch's request (before it debatches the file)."""
    await container.upload_blob(TAKEN.format(batch_id), b"", overwrite=True)


async def taken(container: ContainerClient, batch_id: str) -> bool:
    """Whether an initiator took the batch's request."""
    return bool(await container.get_blob_client(TAKEN.format(batch_id)).exists())


async def last_requested(container: ContainerClient, batch_id: str) -> datetime | None:
    """When the batch's request was last sent (None: never)."""
    try:
        properties = await container.get_blob_client(REQUESTED.format(batch_id)).get_blob_properties()
    except ResourceNotFoundError:
        return None
    return properties.last_modified


async def queued(storage: Storage, settings: Settings) -> set[str] | None:
    """The batches whose request waits, visible, at the front of the requests queue (one peek); None when
    the peek is full, so that a request may wait further back."""
    peeked = await storage.queue(settings.requests_queue).peek_messages(max_messages=PEEK)
    if len(peeked) >= PEEK:
        return None
    return {str(found[1].get("batch_id")) for message in peeked if (found := peek_headers(message.content))}


async def inbox_file(container: ContainerClient, batch_id: str) -> BlobProperties | None:
    """The inbox file of a batch, with its metadata (None: not in the inbox)."""
    try:
        return await container.get_blob_client(batch_id).get_blob_properties()
    except ResourceNotFoundError:
        return None


async def unbilled(
    container: ContainerClient, accounted: Callable[[list[str]], Awaitable[Collection[str]]]
) -> list[InboxFile]:
    """The inbox's files that no batch accounts for, oldest first: one listing (a request per 5,000 files;
    the marks are left out by the delimiter), and ``accounted`` asked which of their batch ids it knows."""
    try:
        files = [
            InboxFile(str(blob.name), (blob.metadata or {}).get("source", ""), blob.creation_time or blob.last_modified)
            async for blob in container.walk_blobs(delimiter="/", include=["metadata"])
            if isinstance(blob, BlobProperties)
        ]
    except ResourceNotFoundError:  # no inbox yet: nothing was ever submitted
        return []
    known = set(await accounted([file.batch_id for file in files])) if files else set()
    return sorted((file for file in files if file.batch_id not in known), key=lambda file: file.created)


async def resend(storage: Storage, settings: Settings, batch_id: str) -> BatchRequest:
    """Send the request of a batch's inbox file again (the caller announces it); :class:`InputError` when the
    inbox holds no file of that batch."""
    properties = await inbox_file(storage.container(settings.inbox_container), batch_id)
    if properties is None:
        raise InputError(f"batch {batch_id} has no file in the inbox: nothing sent")
    request = request_of(properties)
    await send_request(storage, settings, request)
    return request


async def resend_stale(
    storage: Storage, settings: Settings, age: float, accounted: Callable[[list[str]], Awaitable[Collection[str]]]
) -> list[InboxFile]:
    """Send again the request of each inbox file at least ``age`` seconds old that no batch accounts for, whose
    request no initiator took, does not wait in the requests queue and was last sent at least ``age`` ago (so at
    most once per ``age``); those resent are returned. A listing when nothing is stale; one request more per file."""
    container = storage.container(settings.inbox_container)
    now = datetime.now(UTC)
    stale = [file for file in await unbilled(container, accounted) if file.age(now) >= age]
    waiting = await queued(storage, settings) if stale else set()
    if waiting is None:  # a backlog of requests: the initiator is behind, not missing any
        return []
    resent = []
    for file in stale:
        if file.batch_id in waiting or await taken(container, file.batch_id):
            continue
        last = await last_requested(container, file.batch_id)
        if last is None or (now - last).total_seconds() >= age:
            await resend(storage, settings, file.batch_id)
            resent.append(file)
    return resent
