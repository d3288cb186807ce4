"""Batch sequence numbers and voids.

- **Sequence numbers.** A batch is numbered from the gap-free counter ``batch_seq`` (table ``counters``): 1, 2, 3,
  … in the order the initiators merged the batches' ids into the id filter (each merge has the filter's next
  serial, the manifest's ``id_serial``), whatever order their manifests arrive in: a batch whose manifest came
  before that of an earlier merge waits, unnumbered, until that one is recorded (counter ``batch_merges``: every
  merge up to it is numbered). A batch cut without the filter is numbered as its manifest is recorded; a refused
  batch gets none. The counters' rows are updated before they are read, so concurrent transactions take numbers
  one after the other (PostgreSQL's row lock; SQLite's ``BEGIN IMMEDIATE``) and a rolled back one gives its
  numbers back.
- **Voiding** (:func:`void`): a ``complete`` batch is marked voided and its transaction ids are released for
  later batches (:mod:`store.ledger.ids`). Its aggregates stay stored, but it counts nowhere any more
  (:mod:`store.queries` leaves it out of every report, query and invoice). An unknown,
  incomplete or already voided batch is refused with :class:`LedgerError` and nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import cast

import sqlalchemy as sa

from shared.errors import InputError

from ..batches import BatchRow, BatchState, BatchStatus, status
from ..engine import index_plans, writing
from ..schema import batches, counters
from .periods import late

#: The counter of batch sequence numbers.
BATCH_SEQ = "batch_seq"
#: The counter of merges numbered: every batch whose merge serial is at most it has its sequence number.
BATCH_MERGES = "batch_merges"


class LedgerError(InputError):
    """A ledger operation refused (one line, nothing changed)."""


class AlreadyVoided(LedgerError):
    """The batch was voided before."""


def take_numbers(conn: sa.Connection, counter: str, count: int) -> int:
    """Take ``count`` numbers from a gap-free counter (created at 0 when missing); the first is returned. The
    row is updated before it is read: concurrent writers queue behind its lock until this transaction ends."""
    if count <= 0:
        raise ValueError("take at least one number")
    bump = sa.update(counters).where(counters.c.name == counter).values(value=counters.c.value + count)
    if conn.execute(bump).rowcount == 0:
        conn.execute(sa.insert(counters).values(name=counter, value=count))
    last = conn.execute(sa.select(counters.c.value).where(counters.c.name == counter)).scalar_one()
    return int(last) - count + 1


def number_batches(conn: sa.Connection, rows: Iterable[BatchRow]) -> None:
    """Give the batch rows that can be numbered now (accepted: manifest recorded, not refused; no seq yet) the next
    sequence numbers: those cut without the id filter at once, in acceptance order (then by id); the others in the
    order of their merges, each only once every earlier merge is numbered (:data:`BATCH_MERGES`)."""
    waiting = [row for row in rows if row["seq"] is None and row["work_items"] is not None]
    waiting = [row for row in waiting if row["refused_reason"] is None]
    numbered = sorted(
        (row for row in waiting if row["id_serial"] is None),
        key=lambda row: (row["accepted_at"] is None, row["accepted_at"] or 0, row["batch_id"]),
    )
    merged = sorted(((serial, row) for row in waiting if (serial := row["id_serial"]) is not None), key=_first)
    if merged:
        done = _merges_numbered(conn, merged[0][0])
        for serial, row in merged:
            if serial > done + 1:
                break  # an earlier merge's manifest has not come yet
            numbered.append(row)
            done = max(done, serial)
        conn.execute(sa.update(counters).where(counters.c.name == BATCH_MERGES).values(value=done))
    if numbered:
        first = take_numbers(conn, BATCH_SEQ, len(numbered))
        for offset, row in enumerate(numbered):
            row["seq"] = first + offset


def _first(serial_row: tuple[int, BatchRow]) -> int:
    return serial_row[0]


def _merges_numbered(conn: sa.Connection, first: int) -> int:
    """:data:`BATCH_MERGES`, its row locked; made where missing, from the merges of the batches numbered so far, or
    else as if every merge before ``first`` (the earliest waiting now) were numbered (a store begun beside a filter
    that held earlier merges)."""
    bump = sa.update(counters).where(counters.c.name == BATCH_MERGES).values(value=counters.c.value)
    if conn.execute(bump).rowcount == 0:
        numbered = conn.scalar(sa.select(sa.func.max(batches.c.id_serial)).where(batches.c.seq.is_not(None)))
        conn.execute(sa.insert(counters).values(name=BATCH_MERGES, value=first - 1 if numbered is None else numbered))
    return int(conn.execute(sa.select(counters.c.value).where(counters.c.name == BATCH_MERGES)).scalar_one())


def merges_numbered(conn: sa.Connection) -> int:
    """:data:`BATCH_MERGES` as it stands (0 before any merge was numbered)."""
    return int(conn.scalar(sa.select(counters.c.value).where(counters.c.name == BATCH_MERGES)) or 0)


def unnumbered_batches(conn: sa.Connection) -> list[str]:
    """Batches accepted and not numbered yet: an earlier merge's manifest has not come (:func:`number_batches`)."""
    query = sa.select(batches.c.batch_id).where(
        batches.c.seq.is_(None), batches.c.work_items.is_not(None), batches.c.refused_reason.is_(None)
    )
    return list(conn.scalars(query))


def void(engine: sa.Engine, batch_id: str, *, now: datetime | None = None) -> BatchStatus:
    """Mark a complete batch voided, in one transaction; its status after is returned. Raises
    :class:`LedgerError` (:class:`AlreadyVoided` for a batch voided before) and changes nothing when the batch is
    unknown, not complete or already voided."""
    now = now or datetime.now(UTC)
    with writing(engine) as conn:
        index_plans(conn)
        locked = sa.select(batches).where(batches.c.batch_id == batch_id).with_for_update()
        row = conn.execute(locked).mappings().first()
        if row is None:
            raise LedgerError(f"batch {batch_id} is unknown (never submitted, or not yet debatched): nothing voided")
        if row["voided_at"] is not None:
            raise AlreadyVoided(f"batch {batch_id} was voided before ({row['voided_at'].isoformat()}): nothing changed")
        if row["state"] != BatchState.complete:
            raise LedgerError(f"batch {batch_id} is {row['state']}, not complete: only a complete batch can be voided")
        conn.execute(sa.update(batches).where(batches.c.batch_id == batch_id).values(voided_at=now))
        from .ids import release  # here: store.ledger.ids takes its numbers from this module

        release(conn, cast(BatchRow, row))  # its ids, free for later batches
        row = conn.execute(sa.select(batches).where(batches.c.batch_id == batch_id)).mappings().one()
        return status(row, late(conn, [batch_id]).get(batch_id))
