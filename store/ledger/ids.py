"""The ledger's transaction ids: an id counted in a batch of lower sequence number, not voided, is a
``duplicate_transaction_id`` in a later one (``docs/billing-rules.md``; ``docs/architecture.md``, "Transaction ids
across batches").

- **Where they live.** ``ledger_ids`` keeps, per batch, each id's first occurrence: recorded as the initiator
  cuts the file (its ids parts, :func:`record_parts`, then the rest with the manifest; :func:`record_ids`), so
  that little is left to record when the last work item is rated. They go into the *segment* of
  :data:`SEGMENT_ROWS` ids that was current at the batch's first ids (the key starts with it, so a batch's
  inserts stay in one part of the index however large the ledger), sorted by hash, under the batch's key
  (``id_key``, given then: its seq comes only with its manifest). Each id is its hash and its row there: the ids'
  text goes, as recorded together, into parts of ``ledger_id_texts`` (Parquet), read only for the rows where a hash
  is found again. A batch completes once all its parts are recorded; then the ids it did not count are deleted
  (:func:`forget_uncounted`; their text stays in its part, never read again); a void or a refusal deletes all of
  them, and their text (:func:`release`).
- **Who is checked.** The initiator marks the first occurrences the id filter may hold; they are held and
  decided here, exactly, against every earlier batch (:func:`decide`): an id counted in a complete earlier
  batch is taken; one in an earlier batch still running makes this batch wait for it, as does an earlier batch
  with an ids part not recorded yet (the id may be in it).
- **What the filter could not hold.** An earlier batch whose ids were merged into the filter after this one
  was marked (two initiators at once) is compared with this batch id by id: if they share an id this batch
  counted unchecked, the batch is refused (nothing of it counts; submit it again under a new id).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from shared.messages import IdsPart
from shared.rules.duplicates import id_hashes
from shared.rules.schemas import IDS_SCHEMA
from shared.tables import decode_table, encode_table

from ..batches import SETTLED, BatchRow, BatchState
from ..engine import CHUNK, chunks
from ..schema import batches, counters, held, ledger_id_parts, ledger_id_texts, ledger_ids, rejects
from .numbers import take_numbers

#: An id as the ledger finds it: its hash and its text.
IdKey = tuple[int, str]
#: Ids a segment takes before the next one starts.
SEGMENT_ROWS = 1 << 20
#: The counter of ids recorded (what fills the segments).
IDS = "ledger_ids"
#: The counter of the batches' keys in ``ledger_ids``.
ID_KEYS = "ledger_id_keys"
#: Ids inserted at a time, and the most a part of their text holds (a hash found again reads one part).
_INSERT_ROWS = 100_000
_COLUMNS = "segment, id_hash, batch_key, row"
#: What each id brings to an insert (the segment and the batch's key are the insert's).
_COLUMNS_OF_ID = ("id_hash", "row")
#: Ids named per SQLite insert statement.
_SQLITE_STATEMENT_IDS = 100
_NEW_PART, _NEW_TEXTS = (
    {
        name: insert(table).on_conflict_do_nothing(index_elements=key)
        for name, insert in (("postgresql", postgresql.insert), ("sqlite", sqlite.insert))
    }
    for table, key in (
        (ledger_id_parts, ["batch_id", "part"]),
        (ledger_id_texts, ["batch_key", "first_row", "last_row"]),
    )
)
_PG_PROBED = sa.text(
    "SELECT l.id_hash, l.batch_key, l.row FROM unnest(CAST(:hashes AS bigint[])) AS h(id_hash) "
    "CROSS JOIN LATERAL (SELECT id_hash, batch_key, row FROM ledger_ids "
    "WHERE segment = ANY(CAST(:segments AS bigint[])) AND id_hash = h.id_hash) AS l"
)
_DELETE_ID = sa.delete(ledger_ids).where(
    *(ledger_ids.c[name] == sa.bindparam(name) for name in ("segment", "id_hash", "batch_key", "row"))
)
_PG_INSERT = sa.text(
    f"INSERT INTO ledger_ids ({_COLUMNS}) SELECT :segment, h, :batch_key, r FROM unnest(CAST(:id_hash AS bigint[]),"
    " CAST(:row AS bigint[])) AS u(h, r) ON CONFLICT DO NOTHING"
)


@dataclass
class Verdict:
    """What the ledger says of a batch about to complete: the earlier batch it waits for, or why it is
    refused, or the first occurrences (rows) whose id an earlier batch counted."""

    wait_for: str | None = None
    refused: str | None = None
    taken: set[int] = field(default_factory=set)


def record_parts(conn: sa.Connection, rows: Mapping[str, BatchRow], parts: Iterable[IdsPart]) -> None:
    """Record the ids parts not recorded before, of batches still running (those of a settled or refused batch
    are spent: its ids are decided)."""
    for part in parts:
        row = rows[part.batch_id]
        if row["state"] in SETTLED or row["refused_reason"] is not None:
            continue
        taken = conn.execute(_NEW_PART[conn.dialect.name], {"batch_id": part.batch_id, "part": part.part})
        if taken.rowcount:
            record_ids(conn, row, part.ids)
            row["id_parts_recorded"] += 1


def record_ids(conn: sa.Connection, row: BatchRow, ids: pa.Table | None) -> None:
    """Record ids (``IDS_SCHEMA``) of batch ``row`` in hash order, in its segment under its key (both given to the
    batch with its first ids)."""
    if ids is None or not ids.num_rows:
        return
    key = row["id_key"]
    if key is None:
        key = row["id_key"] = take_numbers(conn, ID_KEYS, 1)
    counted = take_numbers(conn, IDS, ids.num_rows)
    segment = row["id_segment"]
    if segment is None:
        segment = row["id_segment"] = (counted - 1) // SEGMENT_ROWS
    texts = ids["transaction_id"]
    insert_ids(conn, segment, key, id_hashes(texts), ids["row"].to_numpy(), texts)


def insert_ids(
    conn: sa.Connection,
    segment: int,
    key: int,
    hashes: np.ndarray,
    rows: np.ndarray,
    ids: pa.Array | pa.ChunkedArray,
) -> None:
    """Insert ids of the batch of ``key`` (each with its row there) into ``segment``, sorted by hash first, and
    their text in parts (also the benchmark's bulk load). An id already recorded for its batch and row is left as
    it is: the ids of a row never change, so one recorded twice (a part cut again by an initiator that took the
    batch over) is the same, as is its text."""
    order = np.argsort(hashes, kind="stable")
    for start in range(0, len(order), _INSERT_ROWS):
        at = order[start : start + _INSERT_ROWS]
        of_ids = hashes[at], rows[at]
        if conn.dialect.name == "postgresql":
            arrays = {name: values.tolist() for name, values in zip(_COLUMNS_OF_ID, of_ids, strict=True)}
            conn.execute(_PG_INSERT, {"segment": segment, "batch_key": key, **arrays})
        else:
            _sqlite_insert(conn, segment, key, *of_ids)
    texts = pa.table([pa.array(rows, pa.int64()), ids], schema=IDS_SCHEMA)
    parts = [_text_part(key, texts.slice(start, _INSERT_ROWS)) for start in range(0, len(texts), _INSERT_ROWS)]
    if parts:
        conn.execute(_NEW_TEXTS[conn.dialect.name], parts)


def _text_part(key: int, part: pa.Table) -> dict[str, Any]:
    """A row of ``ledger_id_texts``: the ids of ``part`` (``IDS_SCHEMA``) of the batch of ``key``."""
    first, last = pc.min_max(part["row"]).values()
    return {
        "batch_key": key,
        "first_row": first.as_py(),
        "last_row": last.as_py(),
        "ids": encode_table(part, dictionary=()),
    }


def _sqlite_insert(conn: sa.Connection, segment: int, key: int, hashes: np.ndarray, rows: np.ndarray) -> None:
    """Insert ids into ``segment`` under ``key``, each given as its hash and row: many ids per statement, as most of
    what SQLite spends on a statement per id goes to the statement. The segment and the key are the statement's own
    numbers, each id's values plain ``?`` (a numbered placeholder costs a look-up per value, and on some Python
    versions a warning); a statement's values are a row of the ids' values side by side."""
    values = np.stack([hashes, rows], axis=1).astype(np.int64)
    cut = len(values) - len(values) % _SQLITE_STATEMENT_IDS
    if cut:
        statements = list(map(tuple, values[:cut].reshape(-1, _SQLITE_STATEMENT_IDS * len(_COLUMNS_OF_ID)).tolist()))
        conn.exec_driver_sql(_sqlite_insert_sql(segment, key, _SQLITE_STATEMENT_IDS), statements)
    if cut < len(values):
        conn.exec_driver_sql(_sqlite_insert_sql(segment, key, len(values) - cut), tuple(values[cut:].ravel().tolist()))


def _sqlite_insert_sql(segment: int, key: int, ids: int) -> str:
    """An insert of ``ids`` ids into ``segment`` under ``key`` (the columns ``_COLUMNS``)."""
    one = f"({int(segment)}, ?, {int(key)}, ?)"
    return f"INSERT OR IGNORE INTO ledger_ids ({_COLUMNS}) VALUES " + ", ".join([one] * ids)


def decide(
    conn: sa.Connection, row: BatchRow, seq: int, firsts: Mapping[int, IdKey], settled: Mapping[int, str]
) -> Verdict:
    """The ledger's verdict on batch ``row`` (numbered ``seq``), whose held rows repeat the first occurrences
    ``firsts`` (their ids, as held rows tell them); ``settled`` maps the seq of batches settled earlier in this
    transaction to their new state."""
    unfiltered = _unfiltered(conn, row, seq)
    hits = _earlier_rows(conn, seq, firsts)
    recording = _recording(conn, seq) if firsts else []

    def state(hit: _Hit) -> str:
        return settled.get(hit.batch_seq, hit.state)

    running = [hit for hit in unfiltered + hits + recording if state(hit) == BatchState.processing]
    if running:
        return Verdict(wait_for=min(running, key=lambda hit: hit.batch_seq).batch_id)
    for other in unfiltered:
        shared = _shared_rows(conn, row, other) - _marked(conn, row) if state(other) == "complete" else ()
        if shared:
            return Verdict(
                refused=f"shares {len(shared)} transaction ids with batch {other.batch_id}, debatched at the same "
                "time, that this batch could not check: submit it again under a new batch id"
            )
    return Verdict(taken={hit.row for hit in hits if state(hit) == BatchState.complete})


def forget_uncounted(conn: sa.Connection, row: BatchRow, kept: Iterable[int]) -> None:
    """Delete the ids batch ``row`` did not count: those of its rejected first occurrences (each rejected row tells
    its id's hash where it is one) but the ``kept``, whose id a held row counts. Each is deleted by its whole key."""
    if row["id_key"] is None:
        return
    query = sa.select(rejects.c.row, rejects.c.id_hash).where(
        rejects.c.batch_id == row["batch_id"], rejects.c.id_hash.is_not(None)
    )
    counted = set(kept)
    keys = [
        {"segment": row["id_segment"], "id_hash": id_hash, "batch_key": row["id_key"], "row": number}
        for number, id_hash in conn.execute(query)
        if number not in counted
    ]
    if keys:
        conn.execute(_DELETE_ID, keys)


def release(conn: sa.Connection, row: BatchRow) -> None:
    """Delete every id of batch ``row`` (refused, or voided), and their text: later batches may count them."""
    conn.execute(sa.delete(ledger_ids).where(*_of_batch(ledger_ids, row["id_segment"], row["id_key"])))
    conn.execute(sa.delete(ledger_id_texts).where(ledger_id_texts.c.batch_key == row["id_key"]))


def _of_batch(table: sa.FromClause, segment: int | None, key: int | None) -> tuple[sa.ColumnElement[bool], ...]:
    """The rows of ``table`` (``ledger_ids`` or an alias) that hold the ids of the batch of ``key``, in its
    ``segment``."""
    return table.c.segment == segment, table.c.batch_key == key


@dataclass(frozen=True)
class _Hit:
    """An earlier batch (and, for an id found there, the row of this batch whose id it holds)."""

    batch_id: str
    batch_seq: int
    state: str
    row: int = 0
    segment: int | None = None
    key: int | None = None


def _unfiltered(conn: sa.Connection, row: BatchRow, seq: int) -> list[_Hit]:
    """Earlier batches (than ``row``'s, numbered ``seq``), not voided, complete or running, whose ids the filter did
    not hold when ``row``'s batch was marked (all earlier batches with ids, when no filter was used)."""
    query = sa.select(batches.c.batch_id, batches.c.seq, batches.c.state, batches.c.id_segment, batches.c.id_key).where(
        *_counting_before(seq),
        batches.c.id_serial.is_not(None),
        batches.c.state.in_((BatchState.processing.value, BatchState.complete.value)),
    )
    if row["filter_serial"] is not None:
        query = query.where(batches.c.id_serial > row["filter_serial"])
    return [_Hit(r.batch_id, r.seq, r.state, segment=r.id_segment, key=r.id_key) for r in conn.execute(query)]


def _recording(conn: sa.Connection, seq: int) -> list[_Hit]:
    """Earlier batches, not voided or refused, with an ids part not recorded yet (on its way, in a message a killed
    controller held): an id the filter marked may be one of theirs that no probe finds yet. As stored: a part recorded
    in this transaction counts from the next one on (the batch waits one apply more at most)."""
    query = sa.select(batches.c.batch_id, batches.c.seq, batches.c.state).where(
        *_counting_before(seq), batches.c.id_parts_recorded < batches.c.id_parts
    )
    return [_Hit(r.batch_id, r.seq, r.state) for r in conn.execute(query)]


def _counting_before(seq: int) -> tuple[sa.ColumnElement[bool], ...]:
    """The batches numbered before ``seq`` whose ids may count: not voided, not refused."""
    return batches.c.seq < seq, batches.c.voided_at.is_(None), batches.c.refused_reason.is_(None)


def _marked(conn: sa.Connection, row: BatchRow) -> set[int]:
    """The rows of ``row``'s batch the filter marked (held as repeats of themselves): checked here, exactly. A
    first occurrence that only a later row of its batch repeats was counted unchecked."""
    query = sa.select(held.c.row).where(held.c.batch_id == row["batch_id"], held.c.row == held.c.repeat_of)
    return set(conn.scalars(query))


def _segments(conn: sa.Connection) -> list[int]:
    """Every segment that may hold ids."""
    recorded = conn.scalar(sa.select(counters.c.value).where(counters.c.name == IDS)) or 0
    return list(range(max(recorded - 1, 0) // SEGMENT_ROWS + 1))


def _earlier_rows(conn: sa.Connection, seq: int, own: Mapping[int, IdKey]) -> list[_Hit]:
    """For each of ``own`` (row → hash, id), the earlier batches, not voided, holding the same id. The ids are
    found by hash in every segment, then their batches read by key: two single-table reads. Joined to the batches,
    the probes ran once per batch where PostgreSQL, without statistics on them, took them for one row."""
    if not own:
        return []
    by_id: dict[tuple[int, str], list[int]] = {}
    for number, id_key in own.items():
        by_id.setdefault(id_key, []).append(number)
    segments = _segments(conn)
    probed: dict[int, dict[int, int]] = {}  # batch key → its rows holding one of the hashes → the hash
    for chunk in chunks(sorted({h for h, _ in by_id}), CHUNK):
        for r in _probed(conn, segments, chunk):
            probed.setdefault(r.batch_key, {})[r.row] = r.id_hash
    found: dict[int, list[int]] = {}  # batch key → rows of ``own`` whose id it holds
    for batch_key, rows in probed.items():
        texts = _texts(conn, batch_key, rows)
        found[batch_key] = [number for theirs, h in rows.items() for number in by_id.get((h, texts[theirs]), ())]
    earlier = sa.select(batches.c.id_key, batches.c.batch_id, batches.c.seq, batches.c.state).where(
        batches.c.seq < seq, batches.c.voided_at.is_(None)
    )
    hits = []
    for keys in chunks(sorted(key for key, numbers in found.items() if numbers), CHUNK):
        for b in conn.execute(earlier.where(batches.c.id_key.in_(keys))):
            hits += [_Hit(b.batch_id, b.seq, b.state, number) for number in found[b.id_key]]
    return hits


def _probed(conn: sa.Connection, segments: list[int], hashes: list[int]) -> sa.CursorResult[Any]:
    """The ids of ``hashes`` in ``segments``: their hash, batch key and row, each hash probed in every segment. On
    PostgreSQL a probe per hash is all the statement allows (a lateral subquery): given the hashes as one list,
    statistics older than a segment made it read the segment whole and check each id against the list."""
    if conn.dialect.name == "postgresql":
        return conn.execute(_PG_PROBED, {"segments": segments, "hashes": hashes})
    columns = ledger_ids.c.id_hash, ledger_ids.c.batch_key, ledger_ids.c.row
    return conn.execute(sa.select(*columns).where(ledger_ids.c.segment.in_(segments), ledger_ids.c.id_hash.in_(hashes)))


def _shared_rows(conn: sa.Connection, row: BatchRow, other: _Hit) -> set[int]:
    """Rows of batch ``row`` whose id batch ``other`` holds too. Each batch's ids are read on their own, in passes
    over its segment, hashes first: joined, PostgreSQL with statistics older than their segment scanned the
    segment once per id."""
    mine, theirs = (row["id_segment"], row["id_key"]), (other.segment, other.key)
    mine_hashes, their_hashes = (
        np.fromiter(conn.scalars(_ids_of(*batch, ledger_ids.c.id_hash)), np.int64) for batch in (mine, theirs)
    )
    common = set(np.intersect1d(mine_hashes, their_hashes).tolist())
    if not common:
        return set()
    my_rows, their_rows = (
        {
            number: h
            for number, h in conn.execute(_ids_of(*batch, ledger_ids.c.row, ledger_ids.c.id_hash))
            if h in common
        }
        for batch in (mine, theirs)
    )
    their_texts = _texts(conn, other.key, their_rows)
    their_ids = {(h, their_texts[number]) for number, h in their_rows.items()}
    my_texts = _texts(conn, row["id_key"], my_rows)
    return {number for number, h in my_rows.items() if (h, my_texts[number]) in their_ids}


def _texts(conn: sa.Connection, key: int | None, rows: Iterable[int]) -> dict[int, str]:
    """The ids of ``rows`` of the batch of ``key``, from the parts of its text that may hold them."""
    wanted = pa.array(sorted(rows), pa.int64())
    if not len(wanted):
        return {}
    query = sa.select(ledger_id_texts.c.ids).where(
        ledger_id_texts.c.batch_key == key,
        ledger_id_texts.c.first_row <= wanted[-1].as_py(),
        ledger_id_texts.c.last_row >= wanted[0].as_py(),
    )
    texts: dict[int, str] = {}
    for data in conn.scalars(query):
        part = decode_table(data)
        part = part.filter(pc.is_in(part["row"], value_set=wanted))
        texts.update(zip(part["row"].to_pylist(), part["transaction_id"].to_pylist(), strict=True))
    return texts


def _ids_of(segment: int | None, key: int | None, *columns: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """``columns`` of the ids of the batch of ``key``, in its ``segment``."""
    return sa.select(*columns).where(*_of_batch(ledger_ids, segment, key))
