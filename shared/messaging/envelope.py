"""Queue message envelopes and the claim check.

A message is a small JSON object: its ``kind``, free-form ``headers``, the payload's SHA-256
and either the payload inline (base64) or a reference to the blob holding it. :class:`ClaimCheck`
decides which: inline when the whole message stays under the queue's size limit, else a blob.
A batch's blobs share one prefix (:func:`batch_blob`) so they can be deleted together once it is done.
Inside a :mod:`~shared.messaging.tally` a message also carries the ``requests`` that produced it, and inside a
span its W3C ``trace`` context (:func:`shared.telemetry.carrier`; absent from older messages and when
telemetry is off).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from azure.core.exceptions import ResourceNotFoundError

from .. import telemetry
from ..errors import PoisonMessage
from . import tally

if TYPE_CHECKING:  # the storage client in annotations only: the rating workers read envelopes without it
    from azure.storage.blob.aio import ContainerClient

    from .storage import Storage

VERSION = 1
#: A claim-check reference's ``account`` when the blob was written to the secondary account.
SECONDARY = "secondary"
#: Room kept under the queue's message size limit for the storage service's own framing.
FRAMING_ALLOWANCE = 1024
#: Room for the ``"data"`` key and the ``requests`` stamp around the payload.
STAMP_ALLOWANCE = 48
#: Claim-check blobs of a batch live under ``batches/<batch id>/``.
BATCH_PREFIX = "batches"


def content_hash(data: bytes) -> str:
    """Hex SHA-256 of some bytes: the name of content-addressed blobs and checksums."""
    return hashlib.sha256(data).hexdigest()


def batch_blob(batch_id: str, *parts: str) -> str:
    """The name of a claim-check blob for ``batch_id``: ``batches/<batch id>/<parts...>``."""
    return "/".join((BATCH_PREFIX, batch_id, *parts))


@dataclass(frozen=True)
class Envelope:
    """A decoded message: what it is, its headers, its payload bytes, the storage requests
    stamped on it (what it cost to produce, see :mod:`shared.messaging.tally`) and the trace context it
    carried (see :mod:`shared.telemetry`)."""

    kind: str
    headers: dict[str, Any] = field(default_factory=dict)
    payload: bytes = b""
    requests: int = 0
    trace: dict[str, str] = field(default_factory=dict)


def peek_headers(text: str) -> tuple[str, dict[str, Any]] | None:
    """A message's kind and headers without fetching or checking its payload; None if unreadable."""
    try:
        message = json.loads(text)
        kind, headers = message["kind"], message["headers"]
    except (ValueError, KeyError, TypeError):
        return None
    return (kind, headers) if isinstance(kind, str) and isinstance(headers, dict) else None


def peek_trace(text: str) -> dict[str, str]:
    """A message's trace context (see :mod:`shared.telemetry`) without reading the rest; empty if none."""
    try:
        return _trace(json.loads(text).get("trace"))
    except (ValueError, AttributeError):
        return {}


class ClaimCheck:
    """Packs envelopes into queue message text, overflowing large payloads to blob storage."""

    def __init__(self, storage: Storage, *, container: str, limit: int) -> None:
        self._storage = storage
        self._container = container
        self._limit = limit - FRAMING_ALLOWANCE

    async def pack(self, envelope: Envelope, *, queue: str, blob_name: str) -> str:
        """Message text for ``envelope``; the payload goes to a blob named ``blob_name`` and its digest if it does
        not fit, in the account that sends to ``queue`` use now (the secondary while it is failed over).
        In a tally, the text is stamped with the requests gathered so far and its own send."""
        digest = content_hash(envelope.payload)
        message: dict[str, Any] = {"v": VERSION, "kind": envelope.kind, "headers": envelope.headers, "sha256": digest}
        if trace := telemetry.carrier():
            message["trace"] = trace
        data = base64.b64encode(envelope.payload).decode()  # base64 needs no escaping in JSON
        if len(json.dumps(message)) + len(data) + STAMP_ALLOWANCE <= self._limit:
            message["data"] = data
        else:  # named after its content too: a message sent again with other content never changes this one's
            name = f"{blob_name}.{digest[:16]}"
            ref = {"container": self._container, "name": name}
            if await self._storage.upload_for(queue, self._container, name, envelope.payload):
                ref["account"] = SECONDARY
            message["blob"] = ref
        if (current := tally.current()) is not None:
            message["requests"] = current.stamp(ahead="queue.send")
        return json.dumps(message)

    async def send(self, queue: str, envelope: Envelope, *, blob_name: str) -> None:
        """Pack ``envelope`` and send it to ``queue`` (through the failover, when configured)."""
        await self._storage.send(queue, await self.pack(envelope, queue=queue, blob_name=blob_name))

    async def unpack(self, text: str) -> Envelope:
        """The envelope in ``text``; raises :class:`PoisonMessage` if it can never be read."""
        try:
            message = json.loads(text)
            kind, headers, digest = message["kind"], message["headers"], message["sha256"]
            requests = int(message.get("requests", 0))
            if message.get("v") != VERSION or not isinstance(headers, dict):
                raise ValueError(f"unsupported envelope version {message.get('v')!r}")
            if "data" in message:
                payload = base64.b64decode(message["data"], validate=True)
            else:
                ref = message["blob"]
                payload = await self._download(ref["container"], ref["name"], secondary=ref.get("account") == SECONDARY)
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise PoisonMessage("bad_envelope", str(exc)) from exc
        if content_hash(payload) != digest:
            raise PoisonMessage("checksum_mismatch", f"payload of {kind} message does not match its sha256")
        tally.record(tally.INHERITED, requests)
        return Envelope(kind, headers, payload, requests, _trace(message.get("trace")))

    async def delete_batch(self, batch_id: str) -> int:
        """Delete every claim-check blob of ``batch_id`` (in the secondary account too, where
        failovers wrote some); return how many there were."""
        prefix = batch_blob(batch_id, "")
        deleted = 0
        for storage in filter(None, (self._storage, self._storage.secondary)):
            container = storage.container(self._container)
            names = [blob.name async for blob in container.list_blobs(name_starts_with=prefix)]
            await asyncio.gather(*(_delete_blob(container, name) for name in names))
            deleted += len(names)
        return deleted

    async def _download(self, container: str, name: str, *, secondary: bool) -> bytes:
        storage = self._storage.secondary if secondary else self._storage
        if storage is None:
            raise PoisonMessage(
                "missing_claim_check", f"blob {container}/{name} is in the secondary account, not configured here"
            )
        try:
            stream = await storage.container(container).download_blob(name)
            return await stream.readall()
        except ResourceNotFoundError as exc:
            raise PoisonMessage("missing_claim_check", f"blob {container}/{name} not found") from exc


def _trace(carried: object) -> dict[str, str]:
    """The trace context a message carried; one that is not text by name is ignored (tracing never
    makes a message poison)."""
    if not isinstance(carried, dict):
        return {}
    return {name: value for name, value in carried.items() if isinstance(name, str) and isinstance(value, str)}


async def _delete_blob(container: ContainerClient, name: str) -> None:
    with contextlib.suppress(ResourceNotFoundError):  # another controller got there first
        await container.delete_blob(name)
