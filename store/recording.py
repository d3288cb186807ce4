"""Recording a dequeued batch of results: one transaction, idempotent, that tracks batch progress.

:func:`apply` locks the batch rows it touches (:mod:`store.engine`), records work items, rejects and held rows
(:mod:`store.items`), their partial aggregates (:mod:`store.partials`) and the batches' transaction ids
(:mod:`store.ledger.ids`), moves batches on (:mod:`store.batches`), and writes the aggregates of those that settle,
summed exactly (:mod:`store.fold`). The ``work_items`` primary key makes double counting impossible even if the row
locks were bypassed.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
import sqlalchemy as sa

from shared.messages import IdsPart, Manifest, PoisonNotice, WorkItemResult

from . import partials
from .batches import (
    ApplyOutcome,
    BatchRow,
    BatchState,
    count,
    fill_from_manifest,
    lock_batches,
    marked_with,
    next_state,
    settle,
    update_batch,
    waiting_batches,
)
from .engine import index_plans, writing
from .items import (
    forget_counts,
    held_firsts,
    insert_held,
    insert_rejects,
    insert_work_items,
    recorded_work_items,
    resolve_held,
)
from .ledger.ids import Verdict, decide, forget_uncounted, record_ids, record_parts, release
from .ledger.numbers import number_batches, unnumbered_batches
from .ledger.periods import record_late
from .schema import work_items


def apply(
    engine: sa.Engine,
    manifests: Sequence[Manifest],
    results: Sequence[WorkItemResult],
    poisoned: Sequence[PoisonNotice] = (),
    *,
    ids: Sequence[IdsPart] = (),
    requests: Mapping[str, int] | None = None,
    folds: partials.Folds | None = None,
) -> ApplyOutcome:
    """Record manifests, work item results, poison notices and ids parts in ONE transaction on ``engine``,
    idempotently, and add ``requests`` (batch id → requests made for it) to the batches' counts. With ``folds``, the
    partials recorded are summed as they come, and batches settle from those sums where they hold all their partials
    (:mod:`store.partials`).

    A work item already recorded is skipped entirely; a manifest already recorded changes nothing.
    Results may precede their manifest: the batch then waits in ``processing`` with unknown size.
    A poisoned work item counts as accounted for (its batch ends ``failed``) until its result
    arrives after a replay: it is then recorded like any other and the batch can still complete.
    A work item's rejects are recorded with it, its ``accepted`` and ``rejected`` rows added to the batch's,
    its partial aggregates kept, its held rows (possible duplicates) kept aside until the batch
    completes: then the first of each repeated id is counted where its first occurrence was rejected, the others
    rejected as duplicates, and the batch's aggregates written (:mod:`store.partials`).
    A refused manifest deletes whatever of its batch was already counted (partials, rejects, held rows, ids,
    the counts); later results of a refused batch are recorded but never counted.
    """
    incoming = _Incoming.of(manifests, results, poisoned, ids)
    if not incoming.batch_ids:
        with engine.connect() as conn:
            if not waiting_batches(conn):
                return ApplyOutcome(new_items=0, duplicate_items=0)
    now = datetime.now(UTC)
    with _no_collection(), writing(engine) as conn:
        index_plans(conn)
        waiting = {*waiting_batches(conn), *unnumbered_batches(conn)}
        rows = lock_batches(conn, sorted({*incoming.batch_ids, *waiting}), now)
        before = {batch_id: row.copy() for batch_id, row in rows.items()}
        _take_manifests(conn, rows, incoming.manifests.values())
        record_parts(conn, rows, incoming.ids)
        _write_numbered(conn, rows, before, now)
        recorded = _record_work_items(conn, rows, incoming, now)
        counted = _count_results(conn, rows, recorded)
        sums = {} if folds is None else _summing(folds, before, rows, counted)
        for batch_id, made in (requests or {}).items():
            rows[batch_id]["requests"] += made
        settling = {batch_id: state for batch_id, row in rows.items() if (state := next_state(row))}
        kept = _complete(conn, rows, settling)
        _write_aggregates(conn, rows, settling, kept, sums)
        record_late(conn, [b for b, state in settling.items() if state == BatchState.complete])
        completed, failed = _write_batches(conn, rows, before, settling, now)
    if folds is not None:
        _keep_sums(folds, rows, sums)
    new_items = len(recorded.new) + len(recorded.recovered)
    return ApplyOutcome(
        new_items=new_items,
        duplicate_items=len(results) - new_items,
        completed_batches=completed,
        failed_batches=failed,
        latency_seconds={b: latency for b in completed if (latency := rows[b]["latency_seconds"]) is not None},
    )


@contextmanager
def _no_collection() -> Iterator[None]:
    """No cyclic garbage collection meanwhile: an apply makes a million short-lived tuples and lists (the ids it
    binds), and each collection would walk every object the process holds; what it leaves in cycles, if anything, is
    collected after."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass(frozen=True)
class _Incoming:
    """One apply's input: the first manifest of each batch, the first result of each work item, the last poison
    notice of each work item that has no result here, the first of each ids part, and every batch they name (in id
    order)."""

    manifests: dict[str, Manifest]
    results: dict[str, WorkItemResult]
    notices: dict[str, PoisonNotice]
    ids: list[IdsPart]
    batch_ids: list[str]

    @classmethod
    def of(
        cls,
        manifests: Sequence[Manifest],
        results: Sequence[WorkItemResult],
        poisoned: Sequence[PoisonNotice],
        ids: Sequence[IdsPart],
    ) -> _Incoming:
        first_manifests: dict[str, Manifest] = {}
        for manifest in manifests:
            first_manifests.setdefault(manifest.batch_id, manifest)
        first_results: dict[str, WorkItemResult] = {}
        for result in results:
            first_results.setdefault(result.work_item_id, result)
        notices = {n.work_item_id: n for n in reversed(poisoned) if n.work_item_id not in first_results}
        parts = list({(part.batch_id, part.part): part for part in reversed(ids)}.values())
        batch_ids = sorted(
            set(first_manifests)
            | {r.batch_id for r in first_results.values()}
            | {n.batch_id for n in notices.values()}
            | {part.batch_id for part in parts}
        )
        return cls(first_manifests, first_results, notices, parts, batch_ids)


@dataclass(frozen=True)
class _Recorded:
    """The work items an apply records: results new to the store, results of items poisoned before (now
    recovered), and poison notices of items not recorded before."""

    new: list[WorkItemResult]
    recovered: list[WorkItemResult]
    poisoned: list[PoisonNotice]


def _take_manifests(conn: sa.Connection, rows: Mapping[str, BatchRow], manifests: Iterable[Manifest]) -> None:
    """Fill each batch's row from its manifest unless it has one already; a refused batch forgets its counts, an
    accepted one records the ids it carries. Then every batch that can be numbered is (:mod:`store.ledger.numbers`)."""
    accepted = {}
    for manifest in manifests:
        row = rows[manifest.batch_id]
        if row["work_items"] is None:
            fill_from_manifest(row, manifest)
            if manifest.refused is not None:
                forget_counts(conn, row)
                release(conn, row)
            else:
                accepted[manifest.batch_id] = manifest
    number_batches(conn, rows.values())
    for batch_id, manifest in accepted.items():
        record_ids(conn, rows[batch_id], manifest.ids)


def _complete(
    conn: sa.Connection, rows: Mapping[str, BatchRow], settling: dict[str, BatchState]
) -> dict[str, pa.Table]:
    """Decide the held rows of the batches about to complete, in sequence order, with the ledger's ids
    (:mod:`store.ledger.ids`): a batch that must wait for an earlier one leaves ``settling``, one the ledger refuses
    settles ``refused`` and counts nothing. The partials of the held rows counted are returned, by batch."""
    kept = {}
    settled: dict[int, str] = {}
    completing = [b for b, state in settling.items() if state == BatchState.complete]
    for batch_id in sorted(completing, key=lambda b: rows[b]["seq"] or 0):
        row = rows[batch_id]
        firsts = held_firsts(conn, batch_id) if row["id_key"] is not None else {}
        seq = row["seq"]
        verdict = Verdict() if seq is None else decide(conn, row, seq, firsts, settled)
        row["waiting_for"] = verdict.wait_for
        if verdict.wait_for is not None:
            del settling[batch_id]
        elif verdict.refused is not None:
            row["refused_reason"] = verdict.refused
            forget_counts(conn, row)
            release(conn, row)
            settling[batch_id] = BatchState.refused
        else:
            counted, kept_firsts = resolve_held(conn, row, verdict.taken)
            forget_uncounted(conn, row, kept_firsts)  # held rows rejected just now too
            kept[batch_id] = counted
        if seq is not None and batch_id in settling:
            settled[seq] = settling[batch_id]
    return kept


def _write_aggregates(
    conn: sa.Connection,
    rows: Mapping[str, BatchRow],
    settling: dict[str, BatchState],
    kept: Mapping[str, pa.Table],
    sums: Mapping[str, partials.Sums],
) -> None:
    """Write the aggregates of the batches settling ``complete`` or ``failed`` (:mod:`store.partials`); one whose sums
    do not fit the store's columns settles ``refused`` instead and counts nothing."""
    for batch_id, state in sorted(settling.items()):
        if state == BatchState.refused:
            continue
        try:
            complete = state == BatchState.complete
            partials.settle(conn, batch_id, kept.get(batch_id), complete=complete, sums=sums.get(batch_id))
        except partials.Overflow as exc:
            row = rows[batch_id]
            row["refused_reason"] = str(exc)
            forget_counts(conn, row)
            release(conn, row)
            settling[batch_id] = BatchState.refused


def _record_work_items(
    conn: sa.Connection, rows: Mapping[str, BatchRow], incoming: _Incoming, now: datetime
) -> _Recorded:
    """Record the work items not recorded yet (results, and poisoned ones), and the results of items recorded as
    poisoned; count the poisoned items on their batches' rows."""
    recorded = recorded_work_items(conn, [*incoming.results, *incoming.notices])
    found = _Recorded(
        new=[r for r in incoming.results.values() if r.work_item_id not in recorded],
        recovered=[r for r in incoming.results.values() if recorded.get(r.work_item_id) is not None],
        poisoned=[n for n in incoming.notices.values() if n.work_item_id not in recorded],
    )
    records = [
        {"work_item_id": r.work_item_id, "batch_id": r.batch_id, "transactions": r.transactions, "recorded_at": now}
        for r in found.new
    ] + [
        {
            "work_item_id": n.work_item_id,
            "batch_id": n.batch_id,
            "transactions": 0,
            "recorded_at": now,
            "poison_reason": n.reason,
        }
        for n in found.poisoned
    ]
    insert_work_items(conn, records)
    for result in [*found.new, *found.recovered]:
        marked_with(rows[result.batch_id], result.marked)
    for result in found.recovered:
        conn.execute(
            sa.update(work_items)
            .where(work_items.c.work_item_id == result.work_item_id)
            .values(transactions=result.transactions, recorded_at=now, poison_reason=None)
        )
        rows[result.batch_id]["poisoned_items"] -= 1
    for notice in found.poisoned:
        rows[notice.batch_id]["poisoned_items"] += 1
    return found


def _count_results(conn: sa.Connection, rows: Mapping[str, BatchRow], recorded: _Recorded) -> list[WorkItemResult]:
    """Count the recorded results on their batches' rows, and keep their rejects, held rows and partial aggregates,
    except those of refused batches (recorded, never counted); the results counted are returned."""
    results = recorded.new + recorded.recovered
    counted = [r for r in results if rows[r.batch_id]["refused_reason"] is None]
    for result in results:
        rows[result.batch_id]["completed_items"] += 1
    for result in counted:
        count(rows[result.batch_id], result.transactions, result.rejects.num_rows)
    insert_rejects(conn, [(r.batch_id, r.rejects) for r in counted])
    insert_held(conn, [(r.batch_id, r.held) for r in counted])
    partials.record(conn, [(r.work_item_id, r.batch_id, r.partials, r.encoded_partials) for r in counted])
    return counted


def _summing(
    folds: partials.Folds,
    before: Mapping[str, BatchRow],
    rows: Mapping[str, BatchRow],
    counted: Iterable[WorkItemResult],
) -> dict[str, partials.Sums]:
    """Each batch's sums of partials as this apply leaves them, where the store holds them: those kept (none yet for a
    batch that recorded no work item before), with the partials ``counted`` now added, summed whole where the batch
    waits for one work item at most (so that the transaction that settles it sums little)."""
    added: dict[str, dict[str, pa.Table]] = {}
    for result in counted:
        added.setdefault(result.batch_id, {})[result.work_item_id] = result.partials
    sums = {}
    for batch_id, row in before.items():
        kept = folds.get(batch_id)
        if kept is None and row["completed_items"] == 0 and batch_id in added:
            kept = partials.Sums()
        if kept is not None and batch_id in added:
            try:
                kept = kept.add(added[batch_id], whole=_one_item_left(rows[batch_id]))
            except pa.ArrowInvalid:  # a sum past its column: the batch settles from its partials, refused
                kept = None
        if kept is not None:
            sums[batch_id] = kept
    return sums


def _one_item_left(row: BatchRow) -> bool:
    """Whether a batch waits for one work item at most (its manifest recorded)."""
    return row["work_items"] is not None and row["work_items"] - row["completed_items"] <= 1


def _keep_sums(folds: partials.Folds, rows: Mapping[str, BatchRow], sums: Mapping[str, partials.Sums]) -> None:
    """Keep, once committed, the sums of partials of batches that still keep their partials (running or failed)."""
    for batch_id, row in rows.items():
        running = row["state"] not in (BatchState.complete, BatchState.refused) and row["refused_reason"] is None
        folds.keep(batch_id, sums.get(batch_id) if running else None)


def _write_numbered(
    conn: sa.Connection, rows: Mapping[str, BatchRow], before: Mapping[str, BatchRow], now: datetime
) -> None:
    """Write the rows this apply gave a seq or an ids key, before the ledger's queries read them: a batch numbered
    here must be seen by a later batch completing in the same transaction (:mod:`store.ledger.ids`)."""
    for batch_id, row in rows.items():
        if (row["seq"], row["id_key"]) != (before[batch_id]["seq"], before[batch_id]["id_key"]):
            update_batch(conn, row, now)


def _write_batches(
    conn: sa.Connection,
    rows: Mapping[str, BatchRow],
    before: Mapping[str, BatchRow],
    settling: Mapping[str, BatchState],
    now: datetime,
) -> tuple[list[str], list[str]]:
    """Settle the batches that move to a final state, write every row that changed; the batches that became
    ``complete`` and those that became ``failed`` are returned."""
    moved: dict[str, list[str]] = {BatchState.complete: [], BatchState.failed: []}
    for batch_id, row in rows.items():
        if batch_id in settling:
            settle(row, settling[batch_id], now)
        if row != before[batch_id]:
            update_batch(conn, row, now)
            if row["state"] != before[batch_id]["state"]:
                moved.get(row["state"], []).append(batch_id)
    return moved[BatchState.complete], moved[BatchState.failed]
