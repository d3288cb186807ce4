"""Reference data (price books, tax tables) stored once by content hash, fetched and cached; and the registry of
versions (``billing reference set``): the price books and tax tables in force from a date on, that a batch submitted
without its own is rated with."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import UTC, date, datetime

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

from .errors import PoisonMessage
from .messaging.envelope import content_hash
from .messaging.storage import Storage
from .rules.versions import Version

PRICEBOOK, TAXES = "pricebook", "taxes"
#: The blob holding the registry (a name no content-addressed blob has).
REGISTERED = "registered.json"
#: The date a registry from before versions (one registered set) is in force from.
FIRST_DATE = date(1, 1, 1)
#: Tries of a registration that another one changed the registry under.
_TRIES = 5


@dataclass(frozen=True)
class Registered:
    """A version of the registry and when it was registered (None: registered before versions were)."""

    version: Version
    registered_at: datetime | None

    def to_json(self) -> dict[str, str | None]:
        at = None if self.registered_at is None else self.registered_at.isoformat()
        return {**self.version.to_json(), "registered_at": at}


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

    async def register(self, version: Version) -> list[Registered]:
        """Add ``version`` (its price book and tax table stored already, see :meth:`put`) to the registry; one of the
        same date replaces that date's. The registry is returned, oldest first."""
        for _ in range(_TRIES):
            found, etag = await self._read()
            kept = [r for r in found if r.version.effective_from != version.effective_from]
            registry = sorted([*kept, Registered(version, datetime.now(UTC))], key=_by_date)
            body = json.dumps({"versions": [r.to_json() for r in registry]}, indent=1).encode()
            try:
                if etag is None:
                    await self._container.upload_blob(REGISTERED, body, overwrite=False)
                else:
                    blob = self._container.get_blob_client(REGISTERED)
                    await blob.upload_blob(
                        body, overwrite=True, etag=etag, match_condition=MatchConditions.IfNotModified
                    )
            except (ResourceModifiedError, ResourceExistsError):
                continue  # registered meanwhile by another: read it again
            return registry
        raise ResourceModifiedError(f"the registry changed under {_TRIES} tries to register a version")

    async def registry(self) -> list[Registered]:
        """The registered versions, oldest first (empty when none was ever registered)."""
        return (await self._read())[0]

    async def _read(self) -> tuple[list[Registered], str | None]:
        """The registry and its blob's etag (None: no blob). A registry from before versions (one registered set)
        reads as one version in force from :data:`FIRST_DATE`."""
        try:
            stream = await self._container.download_blob(REGISTERED)
        except ResourceNotFoundError:
            return [], None
        found = json.loads(await stream.readall())
        etag = stream.properties.etag
        if "versions" not in found:
            return [Registered(Version(FIRST_DATE, found[PRICEBOOK], found[TAXES]), None)], etag
        registry = [
            Registered(Version.from_json(item), item["registered_at"] and datetime.fromisoformat(item["registered_at"]))
            for item in found["versions"]
        ]
        return sorted(registry, key=_by_date), etag


def _by_date(registered: Registered) -> date:
    return registered.version.effective_from or date.min
