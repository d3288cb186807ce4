"""Reference data (price books, tax tables) stored once by content hash, fetched and cached; and the
registered set (``billing reference set``): the price book and tax table a batch submitted without its own
is rated with."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

from .errors import PoisonMessage
from .messaging.envelope import content_hash
from .messaging.storage import Storage

PRICEBOOK, TAXES = "pricebook", "taxes"
#: The blob naming the registered set (a name no content-addressed blob has).
REGISTERED = "registered.json"


@dataclass(frozen=True)
class ReferenceSet:
    """A price book and a tax table, by content hash."""

    pricebook_hash: str
    taxes_hash: str


class ReferenceStore:
    """Content-addressed blobs ``<kind>/<sha256>.csv``; reads are cached for the process's life."""

    def __init__(self, storage: Storage, *, container: str) -> None:
        self._container = storage.container(container)
        self._cache: dict[tuple[str, str], bytes] = {}

    async def put(self, kind: str, data: bytes) -> str:
        """Store ``data`` (once) and return its content hash."""
        digest = content_hash(data)
        if (kind, digest) not in self._cache:
            with contextlib.suppress(ResourceExistsError):  # stored before: same content, same name
                await self._container.upload_blob(f"{kind}/{digest}.csv", data, overwrite=False)
            self._cache[kind, digest] = data
        return digest

    async def get(self, kind: str, digest: str) -> bytes:
        """The content named ``digest``; :class:`PoisonMessage` if it does not exist."""
        data = self._cache.get((kind, digest))
        if data is None:
            try:
                stream = await self._container.download_blob(f"{kind}/{digest}.csv")
            except ResourceNotFoundError as exc:
                raise PoisonMessage("unknown_reference_data", f"no {kind} with hash {digest}") from exc
            data = await stream.readall()
            if content_hash(data) != digest:
                raise PoisonMessage("unknown_reference_data", f"{kind} {digest} does not match its hash")
            self._cache[kind, digest] = data
        return data

    async def register(self, pricebook_hash: str, taxes_hash: str) -> ReferenceSet:
        """Make the price book and tax table named (both stored already, see :meth:`put`) the registered set."""
        registered = ReferenceSet(pricebook_hash, taxes_hash)
        body = json.dumps({PRICEBOOK: pricebook_hash, TAXES: taxes_hash}).encode()
        await self._container.upload_blob(REGISTERED, body, overwrite=True)
        return registered

    async def registered(self) -> ReferenceSet | None:
        """The registered set, or None when none was ever registered."""
        try:
            stream = await self._container.download_blob(REGISTERED)
        except ResourceNotFoundError:
            return None
        found = json.loads(await stream.readall())
        return ReferenceSet(found[PRICEBOOK], found[TAXES])
