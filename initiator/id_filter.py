"""The ledger's id filter as the initiators share it: one blob of the work container, changed only by
conditional writes.

Its metadata ``serial`` counts the batches merged into it. An initiator reads it before it debatches a batch
(again only when it changed) and, once the batch's work items are out and it is not refused, merges the
batch's ids in with a write that succeeds only if nobody wrote in between (else it reads and merges again).
The batch's manifest names both serials: what the filter held when the batch was marked, and the merge that
added it; the controller numbers batches in the order of their merges and uses the serials to see every earlier batch
the filter could not have held (:mod:`store.ledger.ids`). The filter's size is fixed by the first write
(``BILLING_LEDGER_FILTER_BITS`` then).

After the filter's bits the blob holds the log of its last :data:`LOGGED` merges (serial → batch id, JSON; its
length the metadata's ``log``), so that a batch cut again after its initiator died between its merge and its
manifest keeps the serial of that merge instead of taking another: no merge is left without a manifest, and
the controller, which numbers a batch only once every earlier merge is numbered, never waits for one in vain.
"""

from __future__ import annotations

import asyncio
import itertools
import json

import numpy as np
from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

from shared.messaging.storage import Storage
from shared.rules.bloom import IdFilter

BLOB = "ledger/id-filter"
SERIAL = "serial"
#: The metadata naming the bytes of the merge log after the filter's bits (absent: none).
LOG = "log"
#: Merges the log keeps, the newest (a batch cut again comes back within minutes, a few merges later).
LOGGED = 1000


class SharedFilter:
    """The filter blob in ``container``, cached: :meth:`load` it, :meth:`merge` a batch's ids into it (its log
    keeping the last ``logged`` merges)."""

    def __init__(self, storage: Storage, *, container: str, bits: int, logged: int = LOGGED) -> None:
        self._blob = storage.container(container).get_blob_client(BLOB)
        self._bits = bits
        self._filter: IdFilter | None = None
        self._etag: str | None = None
        self._reading = asyncio.Lock()  # one read at a time: the filter is held once
        self._log: dict[str, int] = {}  # batch id → its merge's serial, the last merges
        self._logged = logged
        self.serial = 0

    async def load(self) -> IdFilter:
        """The filter as stored now (an empty one where none is stored yet); :attr:`serial` is its serial."""
        async with self._reading:
            return await self._load()

    async def _load(self) -> IdFilter:
        try:
            properties = await self._blob.get_blob_properties()
        except ResourceNotFoundError:
            self._filter, self._etag, self._log, self.serial = IdFilter(self._bits), None, {}, 0
            return self._filter
        if self._filter is None or properties.etag != self._etag:
            self._filter = None  # the stale copy goes before the new one is read
            download = await self._blob.download_blob()
            data, at = bytearray(download.size), 0  # filled in place: the filter's one copy
            async for chunk in download.chunks():
                data[at : at + len(chunk)] = chunk
                at += len(chunk)
            metadata = download.properties.metadata
            bits = len(data) - int(metadata.get(LOG, 0))
            self._log = {batch_id: int(serial) for serial, batch_id in json.loads(data[bits:] or b"{}").items()}
            del data[bits:]
            self._filter = IdFilter(bits * 8, data)
            self._etag, self.serial = download.properties.etag, int(metadata[SERIAL])
        return self._filter

    async def merge(self, batch_id: str, hashes: np.ndarray) -> int:
        """Add batch ``batch_id``'s ids (their 64-bit hashes) to the stored filter; the serial of this merge is
        returned: that of the batch's earlier merge where the log has one (nothing is written then)."""
        while True:
            current = await self.load()
            if batch_id in self._log:
                return self._log[batch_id]
            current.add(hashes)
            serial = self.serial + 1
            kept = sorted(self._log.items(), key=lambda item: item[1])[len(self._log) + 1 - self._logged :]
            log = {str(logged): merged for merged, logged in kept} | {str(serial): batch_id}
            trailer = json.dumps(log, separators=(",", ":")).encode()
            conditions = (
                {"match_condition": MatchConditions.IfMissing}
                if self._etag is None
                else {"etag": self._etag, "match_condition": MatchConditions.IfNotModified}
            )
            try:
                written = await self._blob.upload_blob(
                    itertools.chain(current.chunks(), [trailer]),
                    length=current.bits // 8 + len(trailer),
                    overwrite=True,
                    metadata={SERIAL: str(serial), LOG: str(len(trailer))},
                    **conditions,
                )
            except (ResourceModifiedError, ResourceExistsError):
                self._filter = None  # someone merged first: read theirs, merge again
                continue
            except BaseException:
                self._filter = None  # the cached copy holds ids the stored one may not
                raise
            self._etag, self.serial = written["etag"], serial
            self._log = {merged: int(logged) for logged, merged in log.items()}
            return serial
