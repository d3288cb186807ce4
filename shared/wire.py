"""How the messages of :mod:`shared.messages` travel: each kind's envelope, built and read back.

Each message kind has a pair of functions (``*_envelope`` builds, ``parse_*`` reads) over the
generic :class:`~shared.messaging.envelope.Envelope` frame; tables travel as Parquet (dictionary
encoding, zstd: small, exact types; a work item's partial aggregates as an Arrow stream, fast:
:mod:`shared.tables`). A message of a kind no role knows is poison
(:func:`kind_of`), as is one of a kind the reader does not take.
"""

from __future__ import annotations

import io
import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from .errors import FileRefused, PoisonMessage
from .inbox import Part
from .messages import REPEATS_SCHEMA, BatchRequest, IdsPart, Kind, Manifest, PoisonNotice, WorkHeader, WorkItemResult
from .messaging.envelope import ClaimCheck, Envelope
from .rules.batchfile import CHUNK_SCHEMA, read_chunks
from .rules.schemas import HELD_SCHEMA, IDS_SCHEMA, PARTIAL_SCHEMA, REJECTED_SCHEMA
from .rules.versions import Version
from .tables import decode_table, encode_stream, encode_table

if TYPE_CHECKING:  # the poison queue in annotations only: the rating workers decode messages without it
    from .messaging.poison import OnPoisoned

T = TypeVar("T")
_log = logging.getLogger(__name__)


def warm_up() -> None:
    """Make now the imports Arrow makes on first use: pandas, at its first conversion from Python objects or NumPy
    arrays, and Acero with the dataset modules, at its first grouping. A process that builds tables for each message
    calls this as it starts, so that its first message does not wait for them."""
    import pyarrow.acero  # noqa: F401  (here: a command that only reads messages needs none of it)

    pa.array([0])


def kind_of(envelope: Envelope) -> Kind:
    """What ``envelope`` is, by the kind it names; raises :class:`PoisonMessage` (``unknown_kind``, naming it)
    if that is no kind a role knows."""
    try:
        return Kind(envelope.kind)
    except ValueError:
        raise PoisonMessage("unknown_kind", f"no role knows a message of kind {envelope.kind!r}") from None


def request_envelope(request: BatchRequest) -> Envelope:
    return Envelope(Kind.REQUEST, _with_versions(_with_times(request.__dict__, BatchRequest.TIMES)))


def parse_request(envelope: Envelope) -> BatchRequest:
    fields = _read_times(_expect(envelope, Kind.REQUEST), BatchRequest.TIMES)
    return _build(BatchRequest, _read_versions(fields))


def work_envelope(header: WorkHeader, encoded: bytes) -> Envelope:
    """A work item; ``encoded`` is :func:`encode_table` of its payload."""
    fields = _with_versions({**header.__dict__, "part": header.part and header.part.to_json()})
    return Envelope(Kind.WORK, {name: value for name, value in fields.items() if value is not None}, encoded)


def parse_work_header(envelope: Envelope) -> WorkHeader:
    fields = _read_versions(_expect(envelope, Kind.WORK))
    part = fields.get("part")
    return _build(WorkHeader, {**fields, "part": None if part is None else Part.from_json(part)})


def versions_json(versions: Sequence[Version]) -> list[dict[str, str | None]]:
    """Versions as the messages and the inbox's metadata carry them."""
    return [version.to_json() for version in versions]


def parse_versions(carried: Any) -> tuple[Version, ...]:
    """The versions :func:`versions_json` wrote (none where absent: a message from before versions); raises
    :class:`PoisonMessage` if they are not that."""
    try:
        return tuple(Version.from_json(item) for item in carried or ())
    except (KeyError, TypeError, ValueError) as exc:
        raise PoisonMessage("bad_envelope", f"versions are not versions: {exc}") from exc


def _with_versions(fields: dict[str, Any]) -> dict[str, Any]:
    return {**fields, "versions": versions_json(fields["versions"])}


def _read_versions(headers: dict[str, Any]) -> dict[str, Any]:
    return {**headers, "versions": parse_versions(headers.get("versions"))}


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


#: The tables of a results message after its partial aggregates, in the order their rows lie in it, with each item's
#: count of rows.
_RESULT_TABLES = (("rejects", "rejects", REJECTED_SCHEMA), ("held", "held", HELD_SCHEMA))


def results_envelope(results: list[WorkItemResult]) -> Envelope:
    """Coalesce the results of one dequeued batch into one envelope: each item's partial aggregates as a stream of its
    own (what the store keeps of it), then per table the items' rows one after the other, encoded where there are
    any; the headers say how many bytes each takes and each item's rows."""
    streams = [encode_stream(r.partials) for r in results]
    items = [
        {
            "work_item_id": r.work_item_id,
            "batch_id": r.batch_id,
            "transactions": r.transactions,
            "groups": r.partials.num_rows,
            "partials_bytes": len(stream),
            **{count: getattr(r, name).num_rows for name, count, _ in _RESULT_TABLES},
            **({"trace": r.trace} if r.trace else {}),
            **({"marked": r.marked} if r.marked is not None else {}),
        }
        for r, stream in zip(results, streams, strict=True)
    ]
    payload = bytearray(b"".join(streams))
    sizes = {"partials": len(payload)}
    for name, _, schema in _RESULT_TABLES:
        table = pa.concat_tables([getattr(r, name) for r in results]) if results else schema.empty_table()
        if table.num_rows:
            encoded = encode_table(table)
            sizes[name] = len(encoded)
            payload += encoded
    return Envelope(Kind.RESULTS, {"items": items, "tables": sizes}, bytes(payload))


def parse_results(envelope: Envelope) -> list[WorkItemResult]:
    h = _expect(envelope, Kind.RESULTS)
    payload = memoryview(envelope.payload)
    tables: dict[str, pa.Table] = {}
    try:
        items = list(h["items"])
        sizes = {str(name): int(size) for name, size in h["tables"].items()}
        offset = sizes.get("partials", 0)
        partials = _partials(items, payload[:offset])
        for name, _, schema in _RESULT_TABLES:
            size = sizes.get(name)
            tables[name] = schema.empty_table() if size is None else _decode(payload[offset : offset + size])
            offset += size or 0
            if tables[name].schema != schema:
                raise PoisonMessage("bad_results", f"{name} do not have the expected schema")
        results, taken = [], dict.fromkeys(tables, 0)
        for item, (table, stream) in zip(items, partials, strict=True):
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
                    table,
                    trace=trace,
                    marked=marked,
                    encoded_partials=stream,
                    **parts,
                )
            )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise PoisonMessage("bad_results", str(exc)) from exc
    if offset != len(payload) or any(taken[name] != table.num_rows for name, table in tables.items()):
        raise PoisonMessage("bad_results", "the tables and the item headers disagree")
    return results


def _partials(items: list[dict[str, Any]], data: memoryview) -> list[tuple[pa.Table, bytes | None]]:
    """Each item's partial aggregates and the stream they came in, from the start of a results message's payload
    (``data``): a stream per item (its ``partials_bytes``), or, in a message written before, one table of every item's
    rows (Parquet: no stream to keep)."""
    found: list[tuple[pa.Table, bytes | None]] = []
    if items and all("partials_bytes" in item for item in items):
        offset = 0
        for item in items:
            stream = bytes(data[offset : offset + int(item["partials_bytes"])])
            found.append((_partial_table(_decode(stream), int(item["groups"])), stream))
            offset += len(stream)
        if offset != len(data):
            raise PoisonMessage("bad_results", "the partials and the item headers disagree")
        return found
    table = _decode(data) if len(data) else PARTIAL_SCHEMA.empty_table()
    table, taken = _partial_table(table, sum(int(item.get("groups", 0)) for item in items)), 0
    for item in items:
        rows = int(item.get("groups", 0))
        found.append((table.slice(taken, rows), None))
        taken += rows
    return found


def _partial_table(table: pa.Table, rows: int) -> pa.Table:
    """``table``, checked to be ``rows`` partial aggregates."""
    if table.schema != PARTIAL_SCHEMA:
        raise PoisonMessage("bad_results", "partials do not have the expected schema")
    if table.num_rows != rows:
        raise PoisonMessage("bad_results", "the partials and the item headers disagree")
    return table


def poisoned_envelope(notice: PoisonNotice) -> Envelope:
    return Envelope(Kind.POISONED, dict(notice.__dict__))


def parse_poisoned(envelope: Envelope) -> PoisonNotice:
    return _build(PoisonNotice, _expect(envelope, Kind.POISONED))


def work_items_named(kind: str, headers: dict[str, Any]) -> list[tuple[str, str]]:
    """``(batch_id, work_item_id)`` of every work item a message carries, from its headers alone
    (so a message whose payload is unreadable can still be attributed); empty if none can be told."""
    try:
        if kind == Kind.WORK:
            return [(str(headers["batch_id"]), str(headers["work_item_id"]))]
        if kind == Kind.RESULTS:
            return [(str(item["batch_id"]), str(item["work_item_id"])) for item in headers["items"]]
    except (KeyError, TypeError):
        pass
    return []


def manifest_envelope(manifest: Manifest) -> Envelope:
    """A manifest; its ids (when it has them) are the payload."""
    headers = {name: value for name, value in manifest.__dict__.items() if name != "ids"}
    payload = b"" if manifest.ids is None else _encode_ids(manifest.ids)
    return Envelope(Kind.MANIFEST, _with_versions(_with_times(headers, Manifest.TIMES)), payload)


def parse_manifest(envelope: Envelope) -> Manifest:
    fields = _read_versions(_read_times(_expect(envelope, Kind.MANIFEST), Manifest.TIMES))
    if envelope.payload:
        fields["ids"] = _decode(envelope.payload)
        if fields["ids"].schema != IDS_SCHEMA:
            raise PoisonMessage("bad_payload", "the manifest's ids do not have the expected schema")
    return _build(Manifest, fields)


def ids_envelope(part: IdsPart) -> Envelope:
    """An ids part; its ids are the payload."""
    return Envelope(Kind.IDS, {"batch_id": part.batch_id, "part": part.part}, _encode_ids(part.ids))


def _encode_ids(ids: pa.Table) -> bytes:
    """Ids (``IDS_SCHEMA``) encoded: first occurrences, distinct, so no column is worth a dictionary (none counted)."""
    return encode_table(ids, dictionary=())


def parse_ids(envelope: Envelope) -> IdsPart:
    headers = _expect(envelope, Kind.IDS)
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


def _expect(envelope: Envelope, kind: Kind) -> dict[str, Any]:
    """The headers of ``envelope``, a message of ``kind``; raises :class:`PoisonMessage` if it is not one."""
    if (found := kind_of(envelope)) is not kind:
        raise PoisonMessage("unexpected_kind", f"expected a {kind} message, got a {found} message")
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
