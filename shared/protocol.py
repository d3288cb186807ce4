"""The wire format: every message the roles exchange, and how its payload is encoded.

Each message kind has a pair of functions (``*_envelope`` builds, ``parse_*`` reads) over the
generic :class:`~shared.messaging.envelope.Envelope` frame; tables travel as Parquet (dictionary
encoding, zstd: small, fast, exact types).
"""

from __future__ import annotations

import io
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import FileRefused, PoisonMessage
from .inbox import Part
from .messaging.envelope import ClaimCheck, Envelope
from .rules.batchfile import CHUNK_SCHEMA, read_chunks
from .rules.schemas import HELD_SCHEMA, IDS_SCHEMA, PARTIAL_SCHEMA, REJECTED_SCHEMA

if TYPE_CHECKING:  # the poison queue in annotations only: the rating workers decode messages without it
    from .messaging.poison import OnPoisoned

REQUEST, WORK, RESULTS, MANIFEST, POISONED, IDS = "request", "work", "results", "manifest", "poisoned", "ids"
#: The rows of a text work item's part that repeat an earlier row's transaction id: its payload.
REPEATS_SCHEMA = pa.schema([("row", pa.int64()), ("repeat_of", pa.int64())])
T = TypeVar("T")
_log = logging.getLogger(__name__)


def encode_table(table: pa.Table, *, dictionary: Sequence[str] | None = None) -> bytes:
    """Serialise a table densely: Parquet, zstd, the text columns worth it dictionary-encoded (denser than Arrow
    IPC, so more transactions fit a 64 KiB queue message). ``dictionary`` names those columns where the caller
    knows them (distinct ids need none); otherwise they are counted."""
    sink = pa.BufferOutputStream()
    columns = _repetitive(table) if dictionary is None else list(dictionary)
    pq.write_table(table, sink, compression="zstd", compression_level=3, use_dictionary=columns)
    encoded: bytes = sink.getvalue().to_pybytes()
    return encoded


def warm_up() -> None:
    """Make now the imports Arrow makes on first use: pandas, at its first conversion from Python objects or NumPy
    arrays, and Acero with the dataset modules, at its first grouping. A process that builds tables for each message
    calls this as it starts, so that its first message does not wait for them."""
    import pyarrow.acero  # noqa: F401  (here: a command that only reads messages needs none of it)

    pa.array([0])


def _repetitive(table: pa.Table) -> list[str]:
    """The text columns worth a dictionary: at most one distinct value in four rows (accounts,
    products, regions; not transaction ids, where a dictionary only adds bytes)."""
    return [
        field.name
        for field, column in zip(table.schema, table.columns, strict=True)
        if pa.types.is_string(field.type) and pc.count_distinct(column).as_py() * 4 <= table.num_rows
    ]


def decode_table(data: bytes | memoryview, *, metadata: bool = False) -> pa.Table:
    """The table :func:`encode_table` wrote (its schema's metadata too if ``metadata``); raises
    ``ValueError`` on damaged data."""
    try:  # the file reader, on this thread: a dataset and a thread pool cost more than such a table
        table = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"encoded table is damaged: {exc}") from exc
    return table if metadata else table.replace_schema_metadata(None)


@dataclass(frozen=True)
class Manifest:
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

    #: The fields that are datetimes on the wire (ISO 8601 text).
    TIMES = ("accepted_at", "uploaded_at", "first_item_sent_at", "last_item_sent_at", "debatched_at")


@dataclass(frozen=True)
class IdsPart:
    """Ids of a batch being cut (``IDS_SCHEMA``), sent to the controller before its manifest."""

    batch_id: str
    part: int
    ids: pa.Table


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

    @property
    def rows(self) -> int:
        """The work item's rows: counted, rejected or held."""
        rows: int = self.transactions + self.rejects.num_rows + self.held.num_rows
        return rows


@dataclass(frozen=True)
class BatchRequest:
    """``billing submit`` asks the initiator to debatch a file waiting in the inbox."""

    batch_id: str
    source: str
    blob_name: str
    fmt: str
    pricebook_hash: str
    taxes_hash: str
    accepted_at: datetime
    uploaded_at: datetime | None = None

    #: The fields that are datetimes on the wire (ISO 8601 text).
    TIMES = ("accepted_at", "uploaded_at")


@dataclass(frozen=True)
class WorkHeader:
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


def request_envelope(request: BatchRequest) -> Envelope:
    return Envelope(REQUEST, _with_times(request.__dict__, BatchRequest.TIMES))


def parse_request(envelope: Envelope) -> BatchRequest:
    return _build(BatchRequest, _read_times(_expect(envelope, REQUEST), BatchRequest.TIMES))


def work_envelope(header: WorkHeader, encoded: bytes) -> Envelope:
    """A work item; ``encoded`` is :func:`encode_table` of its payload."""
    fields = {**header.__dict__, "part": header.part and header.part.to_json()}
    return Envelope(WORK, {name: value for name, value in fields.items() if value is not None}, encoded)


def parse_work_header(envelope: Envelope) -> WorkHeader:
    fields = _expect(envelope, WORK)
    part = fields.get("part")
    return _build(WorkHeader, {**fields, "part": None if part is None else Part.from_json(part)})


def decode_work(header: WorkHeader, encoded: bytes, text: bytes = b"") -> pa.Table:
    """A work item's rows as read (with the metadata their raw text is made from) and ``repeat_of``, checked
    against its header; ``text`` is its part's bytes of the inbox blob, if it names one."""
    payload = _decode(encoded, metadata=header.part is None)
    if header.part is None:
        table = payload
    else:
        part = header.part
        try:
            source = io.BytesIO(part.text(text))
            read = list(read_chunks(source, part.fmt, rows_before=part.rows_before, lines_before=part.lines_before))
        except (FileRefused, ValueError) as exc:
            raise PoisonMessage("bad_work_item", f"{header.work_item_id}: {exc}") from exc
        table = pa.concat_tables(read) if read else CHUNK_SCHEMA.empty_table()
        at = payload["row"].to_numpy() - part.rows_before - 1 if payload.schema == REPEATS_SCHEMA else None
        if at is None or (len(at) and (at.min() < 0 or at.max() >= table.num_rows)):
            raise PoisonMessage("bad_work_item", f"{header.work_item_id}: its repeated rows are not its rows")
        repeat_of = np.zeros(table.num_rows, np.int64)
        repeat_of[at] = payload["repeat_of"].to_numpy()
        table = table.append_column("repeat_of", pa.array(repeat_of))
    if table.num_rows != header.rows:
        raise PoisonMessage("bad_work_item", f"{header.work_item_id}: row count does not match its header")
    return table


#: The tables of a results message, in the order their rows lie in it, with each item's count of rows.
_RESULT_TABLES = (
    ("partials", "groups", PARTIAL_SCHEMA),
    ("rejects", "rejects", REJECTED_SCHEMA),
    ("held", "held", HELD_SCHEMA),
)


def results_envelope(results: list[WorkItemResult]) -> Envelope:
    """Coalesce the results of one dequeued batch into one envelope: per table, the items' rows one after
    the other (encoded where there are any; the headers say how many bytes and each item's rows)."""
    items = [
        {
            "work_item_id": r.work_item_id,
            "batch_id": r.batch_id,
            "transactions": r.transactions,
            **{count: getattr(r, name).num_rows for name, count, _ in _RESULT_TABLES},
            **({"trace": r.trace} if r.trace else {}),
            **({"marked": r.marked} if r.marked is not None else {}),
        }
        for r in results
    ]
    sizes: dict[str, int] = {}
    payload = bytearray()
    for name, _, schema in _RESULT_TABLES:
        table = pa.concat_tables([getattr(r, name) for r in results]) if results else schema.empty_table()
        if table.num_rows or name == "partials":
            encoded = encode_table(table)
            sizes[name] = len(encoded)
            payload += encoded
    return Envelope(RESULTS, {"items": items, "tables": sizes}, bytes(payload))


def parse_results(envelope: Envelope) -> list[WorkItemResult]:
    h = _expect(envelope, RESULTS)
    tables: dict[str, pa.Table] = {}
    offset = 0
    try:
        sizes = {str(name): int(size) for name, size in h["tables"].items()}
        for name, _, schema in _RESULT_TABLES:
            size = sizes.get(name)
            if size is None:
                tables[name] = schema.empty_table()
                continue
            tables[name] = _decode(memoryview(envelope.payload)[offset : offset + size])
            offset += size
            if tables[name].schema != schema:
                raise PoisonMessage("bad_results", f"{name} do not have the expected schema")
        results, taken = [], dict.fromkeys(tables, 0)
        for item in h["items"]:
            parts = {}
            for name, count, _ in _RESULT_TABLES:
                rows = int(item.get(count, 0))
                parts[name] = tables[name].slice(taken[name], rows)
                taken[name] += rows
            carried = item.get("trace")  # absent from older messages, as "marked" is
            trace = {str(k): str(v) for k, v in carried.items()} if isinstance(carried, dict) else {}
            marked = None if item.get("marked") is None else int(item["marked"])
            results.append(
                WorkItemResult(
                    str(item["work_item_id"]),
                    str(item["batch_id"]),
                    int(item["transactions"]),
                    trace=trace,
                    marked=marked,
                    **parts,
                )
            )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise PoisonMessage("bad_results", str(exc)) from exc
    if offset != len(envelope.payload) or any(taken[name] != table.num_rows for name, table in tables.items()):
        raise PoisonMessage("bad_results", "the tables and the item headers disagree")
    return results


@dataclass(frozen=True)
class PoisonNotice:
    """Tells the controller that a work item went to a poison queue and why."""

    batch_id: str
    work_item_id: str
    reason: str


def poisoned_envelope(notice: PoisonNotice) -> Envelope:
    return Envelope(POISONED, dict(notice.__dict__))


def parse_poisoned(envelope: Envelope) -> PoisonNotice:
    return _build(PoisonNotice, _expect(envelope, POISONED))


def work_items_named(kind: str, headers: dict[str, Any]) -> list[tuple[str, str]]:
    """``(batch_id, work_item_id)`` of every work item a message carries, from its headers alone
    (so a message whose payload is unreadable can still be attributed); empty if none can be told."""
    try:
        if kind == WORK:
            return [(str(headers["batch_id"]), str(headers["work_item_id"]))]
        if kind == RESULTS:
            return [(str(item["batch_id"]), str(item["work_item_id"])) for item in headers["items"]]
    except (KeyError, TypeError):
        pass
    return []


def manifest_envelope(manifest: Manifest) -> Envelope:
    """A manifest; its ids (when it has them) are the payload."""
    headers = {name: value for name, value in manifest.__dict__.items() if name != "ids"}
    payload = b"" if manifest.ids is None else _encode_ids(manifest.ids)
    return Envelope(MANIFEST, _with_times(headers, Manifest.TIMES), payload)


def parse_manifest(envelope: Envelope) -> Manifest:
    fields = _read_times(_expect(envelope, MANIFEST), Manifest.TIMES)
    if envelope.payload:
        fields["ids"] = _decode(envelope.payload)
        if fields["ids"].schema != IDS_SCHEMA:
            raise PoisonMessage("bad_payload", "the manifest's ids do not have the expected schema")
    return _build(Manifest, fields)


def ids_envelope(part: IdsPart) -> Envelope:
    """An ids part; its ids are the payload."""
    return Envelope(IDS, {"batch_id": part.batch_id, "part": part.part}, _encode_ids(part.ids))


def _encode_ids(ids: pa.Table) -> bytes:
    """Ids (``IDS_SCHEMA``) encoded: first occurrences, distinct, so no column is worth a dictionary (none counted)."""
    return encode_table(ids, dictionary=())


def parse_ids(envelope: Envelope) -> IdsPart:
    headers = _expect(envelope, IDS)
    ids = _decode(envelope.payload)
    if ids.schema != IDS_SCHEMA:
        raise PoisonMessage("bad_payload", "the ids part does not have the expected schema")
    return _build(IdsPart, {**headers, "ids": ids})


def _with_times(fields: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """``fields`` with the datetimes named written as ISO 8601 text (None stays None)."""
    return {**fields, **{name: fields[name] and fields[name].isoformat() for name in names}}


def _read_times(headers: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """``headers`` with the ISO 8601 texts named parsed back (an absent or null one is None)."""
    try:
        return {**headers, **{name: headers.get(name) and datetime.fromisoformat(headers[name]) for name in names}}
    except (TypeError, ValueError) as exc:
        raise PoisonMessage("bad_envelope", f"a time is not ISO 8601: {exc}") from exc


def _expect(envelope: Envelope, kind: str) -> dict[str, Any]:
    if envelope.kind != kind:
        raise PoisonMessage("unexpected_kind", f"expected a {kind} message, got {envelope.kind!r}")
    return envelope.headers


def _decode(payload: bytes | memoryview, *, metadata: bool = False) -> pa.Table:
    try:
        return decode_table(payload, metadata=metadata)
    except ValueError as exc:
        raise PoisonMessage("bad_payload", str(exc)) from exc


def _build(cls: type[T], fields: dict[str, Any]) -> T:
    try:
        return cls(**fields)
    except (TypeError, ValueError) as exc:
        raise PoisonMessage("bad_envelope", f"{cls.__name__}: {exc}") from exc


def notify_controller(claim_check: ClaimCheck, results_queue: str) -> OnPoisoned:
    """A :class:`~shared.messaging.poison.PoisonQueue` ``on_poisoned`` callback that reports every work
    item a poisoned message names (read from its headers alone) to the controller on ``results_queue``
    as a :class:`PoisonNotice`, so the item's batch ends instead of hanging."""

    async def tell_controller(kind: str, headers: dict[str, Any], reason: str) -> None:
        items = work_items_named(kind, headers)
        if not items:
            _log.warning("the poisoned message names no work item; no batch is told")
        for batch_id, work_item_id in items:
            envelope = poisoned_envelope(PoisonNotice(batch_id, work_item_id, reason))
            await claim_check.send(results_queue, envelope, blob_name=f"poison/notices/{uuid.uuid4().hex}")

    return tell_controller
