"""The messages the roles exchange: their kinds and what each carries, over Arrow tables.

How they travel (envelopes, Parquet payloads, the claim check) is :mod:`shared.wire`; this module loads no
storage SDK, so the store reads and writes the same types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

import pyarrow as pa

from .inbox import Part
from .rules.schemas import HELD_SCHEMA, REJECTED_SCHEMA
from .rules.versions import Version


class RatedWith:
    """What a batch is rated with: ``versions``, oldest first (:mod:`shared.rules.versions`); ``pricebook_hash`` and
    ``taxes_hash`` name the newest. A message from before versions has none: its pair is then in force on every
    date."""

    pricebook_hash: str
    taxes_hash: str
    versions: tuple[Version, ...]

    def dated(self) -> tuple[Version, ...]:
        """The versions the batch is rated with, oldest first."""
        return self.versions or (Version(None, self.pricebook_hash, self.taxes_hash),)


class Kind(StrEnum):
    """What a message between roles is, by the name its envelope carries (the wire's names: messages on the queues
    keep them). A poison queue's entries are that queue's own (:mod:`shared.messaging.poison`)."""

    REQUEST = "request"  # BatchRequest: `billing submit` to the initiator
    WORK = "work"  # WorkHeader and its payload: the initiator to a processor
    RESULTS = "results"  # WorkItemResult, one per work item: a processor to the controller
    MANIFEST = "manifest"  # Manifest: the initiator to the controller
    IDS = "ids"  # IdsPart: the initiator to the controller, before the manifest
    POISONED = "poisoned"  # PoisonNotice: a role to the controller


#: The rows of a text work item's part that repeat an earlier row's transaction id: its payload.
REPEATS_SCHEMA = pa.schema([("row", pa.int64()), ("repeat_of", pa.int64())])


@dataclass(frozen=True)
class BatchRequest(RatedWith):
    """``billing submit`` asks the initiator to debatch a file waiting in the inbox."""

    batch_id: str
    source: str
    blob_name: str
    fmt: str
    pricebook_hash: str
    taxes_hash: str
    accepted_at: datetime
    uploaded_at: datetime | None = None
    versions: tuple[Version, ...] = ()

    #: The fields that are datetimes on the wire (ISO 8601 text).
    TIMES = ("accepted_at", "uploaded_at")


@dataclass(frozen=True)
class WorkHeader(RatedWith):
    """Names a work item and where its rows are: a part of the batch's text file in the inbox, its payload
    then the rows there whose transaction id repeats an earlier row's (``row``, ``repeat_of``); or, without
    a part, the rows as read in its payload (see :mod:`initiator.debatch`)."""

    work_item_id: str
    batch_id: str
    pricebook_hash: str
    taxes_hash: str
    rows: int
    part: Part | None = None
    #: The id filter's serial the rows were marked against (:mod:`store.ledger.ids`); None from an initiator without it.
    marked: int | None = None
    versions: tuple[Version, ...] = ()


@dataclass(frozen=True)
class WorkItemResult:
    """What the processor made of one work item: the partial aggregates of its ``transactions`` counted,
    its rejected rows, the rows held as possible duplicates, and the trace context of its rating (a
    results message carries several work items, each in its own batch's trace)."""

    work_item_id: str
    batch_id: str
    transactions: int
    partials: pa.Table  # PARTIAL_SCHEMA
    rejects: pa.Table = field(default_factory=REJECTED_SCHEMA.empty_table)
    held: pa.Table = field(default_factory=HELD_SCHEMA.empty_table)
    trace: dict[str, str] = field(default_factory=dict)
    marked: int | None = None  # the header's filter serial (WorkHeader.marked)
    #: ``partials`` as its results message carried them (``shared.tables.encode_stream``), kept by the store as they
    #: came; None where the message carried them otherwise (written before) or the result was made here.
    encoded_partials: bytes | None = field(default=None, compare=False, repr=False)

    @property
    def rows(self) -> int:
        """The work item's rows: counted, rejected or held."""
        rows: int = self.transactions + self.rejects.num_rows + self.held.num_rows
        return rows


@dataclass(frozen=True)
class Manifest(RatedWith):
    """What the initiator tells the controller about a debatched (or refused) batch."""

    batch_id: str
    source: str
    rows: int
    work_items: int
    pricebook_hash: str
    taxes_hash: str
    accepted_at: datetime
    refused: str | None = None  # a file-level refusal reason; then nothing of the batch counts
    # Phases as the initiator saw them (None where a phase did not happen, e.g. no item sent).
    uploaded_at: datetime | None = None  # the client had the file in the inbox
    first_item_sent_at: datetime | None = None
    last_item_sent_at: datetime | None = None
    debatched_at: datetime | None = None  # the whole file read, every work item sent
    # The ledger's id filter (see store.ledger.ids): the merges it held when this batch was debatched, and the
    # merge that added this batch's ids (None: no filter was used, as before the ledger kept ids).
    filter_serial: int | None = None
    id_serial: int | None = None
    ids: pa.Table | None = None  # IDS_SCHEMA: the payload, the ids no ids part carried; None for a refused batch
    id_parts: int = 0  # the ids parts sent before it (IdsPart), numbered from 0
    versions: tuple[Version, ...] = ()

    #: The fields that are datetimes on the wire (ISO 8601 text).
    TIMES = ("accepted_at", "uploaded_at", "first_item_sent_at", "last_item_sent_at", "debatched_at")


@dataclass(frozen=True)
class IdsPart:
    """Ids of a batch being cut (``IDS_SCHEMA``), sent to the controller before its manifest."""

    batch_id: str
    part: int
    ids: pa.Table


@dataclass(frozen=True)
class PoisonNotice:
    """Tells the controller that a work item went to a poison queue and why."""

    batch_id: str
    work_item_id: str
    reason: str
