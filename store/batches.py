"""Batches and their states: what a batch row holds, and how a batch moves from state to state.

A batch is :attr:`BatchState.processing` until every work item is accounted for; then
:attr:`~BatchState.complete` (all recorded) or :attr:`~BatchState.failed` (at least one work item was
poisoned; replaying it from the poison queue can still complete the batch); :attr:`~BatchState.refused`
when the initiator refused the file, even after some of its work items were recorded: then nothing of
it is counted. ``complete`` and ``refused`` never change. A batch whose work items are all in has
``completed_at`` and ``latency_seconds`` (``completed_at - accepted_at``) set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypedDict, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from .engine import CHUNK, chunks
from .schema import batches

if TYPE_CHECKING:  # the message types in annotations only: a command that only reads the store loads no Arrow
    from shared.messages import Manifest


class BatchState(StrEnum):
    """A batch's state, stored as its value (a ``StrEnum``: equal to, and written as, that text)."""

    processing = "processing"
    complete = "complete"
    failed = "failed"
    refused = "refused"


#: States a batch rests in (only a replay of its poisoned items moves a ``failed`` batch on).
FINAL_STATES = frozenset({BatchState.complete, BatchState.failed, BatchState.refused})
#: States in which a batch's aggregates never change again.
SETTLED = frozenset({BatchState.complete, BatchState.refused})


@dataclass(frozen=True)
class BatchStatus:
    """One batch's progress as stored."""

    batch_id: str
    source: str
    state: BatchState
    rows: int
    accepted: int
    rejected: int
    work_items: int | None
    completed_items: int
    poisoned_items: int
    transactions_recorded: int
    pricebook_hash: str | None
    taxes_hash: str | None
    refused_reason: str | None
    accepted_at: datetime | None
    uploaded_at: datetime | None
    first_item_sent_at: datetime | None
    last_item_sent_at: datetime | None
    debatched_at: datetime | None
    completed_at: datetime | None
    latency_seconds: float | None
    requests: int
    updated_at: datetime
    claims_deleted_at: datetime | None
    #: The batch's number in acceptance order (None until accepted; never for a refused batch).
    seq: int | None = None
    voided_at: datetime | None = None
    #: Its counted rows of a period closed before it completed, per period (see :mod:`store.ledger.periods`).
    late: dict[str, int] = field(default_factory=dict, hash=False)
    #: The earlier batch it waits for, every work item in: it shares ids with that one, still running.
    waiting_for: str | None = None
    #: Why it has not moved for a while, still ``processing`` (None: it moves, or is settled): see :func:`stalled`.
    stalled: str | None = None

    @property
    def voided(self) -> bool:
        """Whether the batch was voided (it then counts nowhere; see :mod:`store.ledger.numbers`)."""
        return self.voided_at is not None

    @property
    def requests_per_1000(self) -> float | None:
        """Requests made for the batch per 1,000 accepted transactions (None before its manifest)."""
        return round(self.requests * 1000 / self.accepted, 3) if self.accepted else None

    def to_json_dict(self) -> dict[str, Any]:
        """JSON-safe values: ISO 8601 datetimes, latency as a float; with ``requests_per_1000`` and ``voided``."""
        return {
            **{
                key: value.isoformat() if isinstance(value, datetime) else value
                for key, value in dataclasses.asdict(self).items()
            },
            "state": self.state.value,
            "requests_per_1000": self.requests_per_1000,
            "voided": self.voided,
        }


@dataclass(frozen=True)
class ApplyOutcome:
    """What one ``Store.apply`` call recorded."""

    new_items: int
    duplicate_items: int
    completed_batches: list[str] = field(default_factory=list)
    failed_batches: list[str] = field(default_factory=list)
    #: Seconds from accepted to complete of each completed batch (those with a manifest).
    latency_seconds: dict[str, float] = field(default_factory=dict)


#: What a batch row holds before anything is known of the batch but its id.
_NEW_BATCH_ROW = dict(
    source="",
    state=BatchState.processing.value,
    rows=0,
    accepted=0,
    rejected=0,
    work_items=None,
    completed_items=0,
    poisoned_items=0,
    transactions_recorded=0,
    requests=0,
)
#: The statements every apply runs, built once (SQLAlchemy then compiles each once, too).
_NEW_BATCH = {
    name: insert(batches).on_conflict_do_nothing(index_elements=["batch_id"])
    for name, insert in (("postgresql", postgresql.insert), ("sqlite", sqlite.insert))
}
_LOCK_BATCHES = (
    sa.select(batches)
    .where(batches.c.batch_id.in_(sa.bindparam("batch_ids", expanding=True)))
    .order_by(batches.c.batch_id)
    .with_for_update()
)
_UPDATE_BATCH = sa.update(batches).where(batches.c.batch_id == sa.bindparam("row_batch_id"))


class BatchRow(TypedDict):
    """A row of ``batches`` as the transaction that records results reads and changes it (:func:`lock_batches`);
    :func:`update_batch` writes it back."""

    batch_id: str
    source: str
    state: str
    rows: int
    accepted: int
    rejected: int
    work_items: int | None
    completed_items: int
    poisoned_items: int
    transactions_recorded: int
    pricebook_hash: str | None
    taxes_hash: str | None
    refused_reason: str | None
    accepted_at: datetime | None
    uploaded_at: datetime | None
    first_item_sent_at: datetime | None
    last_item_sent_at: datetime | None
    debatched_at: datetime | None
    completed_at: datetime | None
    latency_seconds: float | None
    requests: int
    updated_at: datetime
    claims_deleted_at: datetime | None
    seq: int | None
    voided_at: datetime | None
    filter_serial: int | None
    id_serial: int | None
    id_segment: int | None
    id_key: int | None
    waiting_for: str | None
    id_parts: int
    id_parts_recorded: int


def lock_batches(conn: sa.Connection, batch_ids: list[str], now: datetime) -> dict[str, BatchRow]:
    """Create missing batch rows (state ``processing``), then lock all of them in id order."""
    conn.execute(
        _NEW_BATCH[conn.dialect.name], [{**_NEW_BATCH_ROW, "batch_id": b, "updated_at": now} for b in batch_ids]
    )
    locked = conn.execute(_LOCK_BATCHES, {"batch_ids": batch_ids}).mappings()
    return {row["batch_id"]: cast(BatchRow, dict(row)) for row in locked}


def fill_from_manifest(row: BatchRow, manifest: Manifest) -> None:
    """What a batch's manifest tells of it, into its row."""
    row.update(
        {
            "source": manifest.source,
            "rows": manifest.rows,
            "work_items": manifest.work_items,
            "pricebook_hash": manifest.pricebook_hash,
            "taxes_hash": manifest.taxes_hash,
            "refused_reason": manifest.refused,
            "accepted_at": manifest.accepted_at,
            "uploaded_at": manifest.uploaded_at,
            "first_item_sent_at": manifest.first_item_sent_at,
            "last_item_sent_at": manifest.last_item_sent_at,
            "debatched_at": manifest.debatched_at,
            "id_serial": manifest.id_serial,
            "id_parts": manifest.id_parts,
        }
    )
    marked_with(row, manifest.filter_serial)


def marked_with(row: BatchRow, serial: int | None) -> None:
    """Lower a batch's ``filter_serial`` to ``serial``, the filter some of its rows were marked against. A batch
    cut again after its initiator died has work items of each cut (those recorded first count), each marked against
    the filter of its time: the ledger must compare it with every batch the oldest of them could not hold."""
    if serial is not None and (row["filter_serial"] is None or serial < row["filter_serial"]):
        row["filter_serial"] = serial


def count(row: BatchRow, accepted: int, rejected: int) -> None:
    """Add rows accepted (counted in the aggregates) and rejected to a batch's row."""
    row["accepted"] += accepted
    row["transactions_recorded"] += accepted
    row["rejected"] += rejected


def next_state(row: BatchRow) -> BatchState | None:
    """The final state a batch moves to now that every work item and ids part is accounted for, if it moves (``failed``
    may still become ``complete`` when its poisoned items are replayed)."""
    if row["state"] in SETTLED:
        return None
    if row["refused_reason"] is not None:
        state = BatchState.refused
    elif not _accounted(row):
        return None
    else:
        state = BatchState.failed if row["poisoned_items"] else BatchState.complete
    return None if state == row["state"] else state


def _accounted(row: BatchRow) -> bool:
    """Whether the manifest, every work item and every ids part (:mod:`store.ledger.ids`) of a batch are recorded,
    and the batch numbered (:func:`store.ledger.numbers.number_batches`)."""
    items = row["work_items"] is not None and row["completed_items"] + row["poisoned_items"] >= row["work_items"]
    return items and row["id_parts_recorded"] >= row["id_parts"] and row["seq"] is not None


def settle(row: BatchRow, state: BatchState, now: datetime) -> None:
    """Move a batch to a final state (see :func:`next_state`)."""
    row["state"] = state.value
    row["completed_at"] = now
    row["latency_seconds"] = (now - row["accepted_at"]).total_seconds() if row["accepted_at"] else None


def update_batch(conn: sa.Connection, row: BatchRow, now: datetime) -> None:
    """Write a batch's row as it now is."""
    values = {k: v for k, v in row.items() if k != "batch_id"} | {"updated_at": now}
    conn.execute(_UPDATE_BATCH, {**values, "row_batch_id": row["batch_id"]})


def waiting_batches(conn: sa.Connection) -> list[str]:
    """Batches whose work items are all recorded but that are not complete: those waiting for an earlier one."""
    query = sa.select(batches.c.batch_id).where(
        batches.c.state == BatchState.processing.value,
        batches.c.work_items.is_not(None),
        batches.c.refused_reason.is_(None),
        batches.c.poisoned_items == 0,
        batches.c.completed_items >= batches.c.work_items,
        batches.c.id_parts_recorded >= batches.c.id_parts,
    )
    return list(conn.scalars(query))


def accounted(engine: sa.Engine, batch_ids: Iterable[str]) -> set[str]:
    """Those of ``batch_ids`` the store accounts for: their manifest is recorded (accepted or refused), so the
    initiator took their request and finished with their file."""
    query = sa.select(batches.c.batch_id).where(
        batches.c.batch_id.in_(sa.bindparam("ids", expanding=True)),
        sa.or_(batches.c.work_items.is_not(None), batches.c.refused_reason.is_not(None)),
    )
    found: set[str] = set()
    with engine.connect() as conn:
        for chunk in chunks(batch_ids, CHUNK):
            found.update(conn.scalars(query, {"ids": chunk}))
    return found


def status(row: sa.RowMapping, late: Mapping[str, int] | None = None, stalled: str | None = None) -> BatchStatus:
    """A batch row as a :class:`BatchStatus`, with its late rows per period and why it stalled (if it did)."""
    values = {f.name: row[f.name] for f in dataclasses.fields(BatchStatus) if f.name not in ("late", "stalled")}
    return BatchStatus(**{**values, "state": BatchState(values["state"]), "late": dict(late or {}), "stalled": stalled})


def stalled(row: BatchRow | sa.RowMapping, merges_numbered: int) -> str:
    """Why a batch still ``processing`` makes no progress, as far as the store can tell (``merges_numbered``: every
    merge up to it is numbered, :mod:`store.ledger.numbers`)."""
    if row["work_items"] is None:
        return "no manifest yet: its initiator still cuts it, or the manifest is on its way (or in a poison queue)"
    missing = row["work_items"] - row["completed_items"] - row["poisoned_items"]
    if missing > 0:
        return f"{missing} of its {row['work_items']} work items not recorded: still rated, or on their way"
    if row["id_parts_recorded"] < row["id_parts"]:
        return f"{row['id_parts'] - row['id_parts_recorded']} of its ids parts not recorded: on their way"
    if row["seq"] is None:
        return (
            f"every work item recorded, not numbered: it waits for the manifest of merge {merges_numbered + 1}, "
            "an earlier batch's"
        )
    if row["waiting_for"] is not None:
        return (
            f"every work item recorded: it waits for batch {row['waiting_for']}, which shares ids with it or has ids "
            "parts on their way"
        )
    return "every work item recorded, not decided yet"
