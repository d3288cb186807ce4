"""The ledger's id filter as the initiators share it: one blob of the work container, changed only by
conditional writes.

Its metadata ``serial`` counts the batches merged into it. An initiator reads it before it debatches a batch
(again only when it changed) and, once the batch's work items are out and it is not refused, merges the
batch's ids in with a write that succeeds only if nobody wrote in between (else it reads and merges again).
The batch's manifest names both serials: what the filter held when the batch was marked, and the merge that
added it; the controller uses them to see every earlier batch the filter could not have held
(:mod:`store.ids`). The filter's size is fixed by the first write (``BILLING_LEDGER_FILTER_BITS`` then).
"""

from __future__ import annotations

import asyncio

import numpy as np
from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

from shared.messaging.storage import Storage
from shared.rules.idfilter import IdFilter

BLOB = "ledger/id-filter"
SERIAL = "serial"


class SharedFilter:
    """The filter blob in ``container``, cached: :meth:`load` it, :meth:`merge` a batch's ids into it."""

    def __init__(self, storage: Storage, *, container: str, bits: int) -> None:
        self._blob = storage.container(container).get_blob_client(BLOB)
        self._bits = bits
        self._filter: IdFilter | None = None
        self._etag: str | None = None
        self._reading = asyncio.Lock()  # one read at a time: the filter is held once
        self.serial = 0

    async def load(self) -> IdFilter:
        """The filter as stored now (an empty one where none is stored yet); :attr:`serial` is its serial."""
        async with self._reading:
            return await self._load()

    async def _load(self) -> IdFilter:
        try:
            properties = await self._blob.get_blob_properties()
        except ResourceNotFoundError:
            self._filter, self._etag, self.serial = IdFilter(self._bits), None, 0
            return self._filter
        if self._filter is None or properties.etag != self._etag:
            self._filter = None  # the stale copy goes before the new one is read
            download = await self._blob.download_blob()
            data, at = bytearray(download.size), 0  # filled in place: the filter's one copy
            async for chunk in download.chunks():
                data[at : at + len(chunk)] = chunk
                at += len(chunk)
            self._filter = IdFilter(len(data) * 8, data)
            self._etag, self.serial = download.properties.etag, int(download.properties.metadata[SERIAL])
        return self._filter

    async def merge(self, hashes: np.ndarray) -> int:
        """Add ids (their 64-bit hashes) to the stored filter; the serial of this merge is returned."""
        while True:
            current = await self.load()
            current.add(hashes)
            serial = self.serial + 1
            conditions = (
                {"match_condition": MatchConditions.IfMissing}
                if self._etag is None
                else {"etag": self._etag, "match_condition": MatchConditions.IfNotModified}
            )
            try:
                written = await self._blob.upload_blob(
                    current.chunks(),
                    length=current.bits // 8,
                    overwrite=True,
                    metadata={SERIAL: str(serial)},
                    **conditions,
                )
            except (ResourceModifiedError, ResourceExistsError):
                self._filter = None  # someone merged first: read theirs, merge again
                continue
            except BaseException:
                self._filter = None  # the cached copy holds ids the stored one may not
                raise
            self._etag, self.serial = written["etag"], serial
            return serial
