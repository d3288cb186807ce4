"""The ledger benchmark (``billing bench-ledger``): the batch ``billing bench`` headlines (1,000,000 rows, the
messy file, Azurite persisted) on an empty ledger and on one that already holds 50,000,000 transaction ids, side
by side, on SQLite or PostgreSQL.

Each run is :func:`benchmarks.pipeline.run_pipeline`'s: a fresh Azurite and store, the real role processes,
``billing submit --wait`` timed, CPU and peak RSS per role. Before the roles start, the store is migrated and
the large ledger loaded in bulk (:func:`load_ledger`: synthetic ids of complete batches, each sorted by hash
into the segment the controller would have given it) and its id filter written to the run's Azurite as the
initiators keep it (:mod:`initiator.id_filter`). The runs go empty, loaded, empty again.

:class:`InProcess`, :class:`Cut` and :func:`apply` run the roles' code on batches in one process, for tests.
"""

from __future__ import annotations

import asyncio
import io
import json
import multiprocessing
import multiprocessing.queues
import os
import resource
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from azure.core import MatchConditions
from rich.console import Console
from rich.table import Table

from billing.sample import sample_price_book_bytes, sample_tax_table_bytes
from initiator.debatch import Debatch
from initiator.id_filter import BLOB, SERIAL
from processor.jobs import rate_work_items
from shared import inbox
from shared.messages import IdsPart, Manifest, WorkHeader, WorkItemResult
from shared.messaging.storage import Storage
from shared.rules.bloom import IdFilter
from shared.rules.duplicates import id_hashes
from shared.rules.reference import load_price_book, load_tax_table
from shared.settings import Settings
from shared.tables import decode_table
from shared.wire import parse_results
from store import BatchState, Store
from store.engine import writing
from store.ledger.ids import ID_KEYS, IDS, SEGMENT_ROWS, insert_ids
from store.ledger.numbers import BATCH_SEQ
from store.schema import batches, counters

from .pipeline import DEFAULT_FILE, DEFAULT_STORE, PipelineRun, _batch_file, run_pipeline
from .postgres import PostgresServer

T = TypeVar("T")
#: Ids in each synthetic batch of a loaded ledger.
LEDGER_BATCH_ROWS = 1_000_000
_FILTER_SLICE = 100_000
#: The roles whose CPU and peak RSS are reported.
ROLES = ("initiator", "processor", "rating worker", "controller")


@dataclass
class Cut:
    """A batch as the initiator left it: its manifest and the results the processors made of its items."""

    manifest: Manifest
    results: list[WorkItemResult]
    ids: list[IdsPart] = field(default_factory=list)  # the ids parts sent before the manifest

    @property
    def held_rows(self) -> int:
        """Rows the processors held for the controller's decision."""
        return sum(result.held.num_rows for result in self.results)


class InProcess:
    """The roles' work on batches, in this process: the shared id filter (as its blob would hold it, with its
    serial), the initiator's cut, marking and merge, the processors' rating."""

    def __init__(self, *, bits: int, work_item_size: int = 40_000, part_rows: int | None = None) -> None:
        self.filter = IdFilter(bits)
        self.serial = 0
        self.work_item_size = work_item_size
        self.part_rows = part_rows or Settings.model_fields["ids_part_rows"].default
        self.price_book, self.tax_table = sample_price_book_bytes(), sample_tax_table_bytes()
        book, taxes = load_price_book(self.price_book), load_tax_table(self.tax_table)
        self.hashes = (book.content_hash, taxes.content_hash)

    def cut(self, batch_id: str, data: bytes, *, marked_with: IdFilter | None = None) -> Cut:
        """Cut, mark and rate a CSV batch (see :meth:`cut_only`)."""
        work, manifest, ids = self.cut_only(batch_id, data, marked_with=marked_with)
        return Cut(manifest, self.rate(work), ids)

    def cut_only(
        self, batch_id: str, data: bytes, *, marked_with: IdFilter | None = None
    ) -> tuple[list[tuple[WorkHeader, bytes, bytes]], Manifest, list[IdsPart]]:
        """The initiator's part: the work items (header, payload, their part's bytes) marked with
        ``marked_with`` (a copy of the filter taken earlier) or else the filter now, the manifest and the ids parts
        taken before it; the ids merged into the filter. Each work item names the serial it was marked against (none
        for ``marked_with``, whose serial this instance does not know)."""
        debatch = Debatch(work_item_size=self.work_item_size, id_filter=marked_with or self.filter)
        blob, frames = inbox.in_memory(io.BytesIO(data), inbox.frame_bytes(len(data)))
        work: list[tuple[WorkHeader, bytes, bytes]] = []
        parts: list[IdsPart] = []
        for index, cut in enumerate(debatch.parts(batch_id, "csv", frames, io.BytesIO(blob))):
            marked = None if marked_with is not None else self.serial
            header = WorkHeader(f"{batch_id}:{index:07d}", batch_id, *self.hashes, cut.rows, cut.part, marked)
            work.append((header, cut.payload, blob[cut.part.start : cut.part.end] if cut.part else b""))
            if (ids := debatch.take_ids(self.part_rows)) is not None:
                parts.append(IdsPart(batch_id, len(parts), ids))
        manifest = replace(self._manifest(batch_id, debatch), id_parts=len(parts))
        return work, self.merge(manifest, debatch.hashes()), parts

    def rate(self, work: list[tuple[WorkHeader, bytes, bytes]]) -> list[WorkItemResult]:
        """The processors' part: each work item rated on its own."""
        references = dict(zip(self.hashes, (self.price_book, self.tax_table), strict=True))
        results = []
        for item in work:
            envelope, poisoned = rate_work_items([item], references, [{}])
            if envelope is None or poisoned:
                raise RuntimeError(f"work item {item[0].work_item_id} could not be rated: {poisoned}")
            results += parse_results(envelope)
        return results

    def _manifest(self, batch_id: str, debatch: Debatch) -> Manifest:
        return Manifest(
            batch_id=batch_id,
            source=f"{batch_id}.csv",
            rows=debatch.rows,
            work_items=debatch.work_items,
            pricebook_hash=self.hashes[0],
            taxes_hash=self.hashes[1],
            accepted_at=datetime.now(UTC),
            filter_serial=self.serial,
            ids=debatch.ids(),
        )

    def merge(self, manifest: Manifest, hashes: np.ndarray) -> Manifest:
        """Merge a batch's ids into the filter: its manifest, with the merge's serial."""
        self.filter.add(hashes)
        self.serial += 1
        return Manifest(**{**manifest.__dict__, "id_serial": self.serial})


def apply(store: Store, cut: Cut, *, group: int = 4) -> float:
    """The controller's part: the ids parts, the manifest, then the results ``group`` at a time; wall seconds."""
    started = time.perf_counter()
    for part in cut.ids:
        store.apply([], [], ids=[part])
    store.apply([cut.manifest], [])
    for start in range(0, len(cut.results), group):
        store.apply([], cut.results[start : start + group])
    return time.perf_counter() - started


def load_ledger(store: Store, ids: int, *, batch_rows: int = LEDGER_BATCH_ROWS) -> int:
    """Fill an empty ledger with ``ids`` synthetic ids of complete batches of ``batch_rows``, each in the segment
    the controller would have given it, sorted by hash, its seq its key: the number of batches."""
    now = datetime.now(UTC)
    loaded = []
    with writing(store.engine) as conn:
        for seq, first, texts, hashes in _ledger_batches(ids, batch_rows):
            rows, segment = len(texts), first // SEGMENT_ROWS
            insert_ids(conn, segment, seq, hashes, np.arange(1, rows + 1), texts)
            loaded.append(_loaded_batch(f"ledger-{seq:06d}", seq, rows, segment, now))
        conn.execute(sa.insert(batches), loaded)
        conn.execute(sa.delete(counters).where(counters.c.name.in_((BATCH_SEQ, IDS, ID_KEYS))))
        numbered = (BATCH_SEQ, len(loaded)), (IDS, ids), (ID_KEYS, len(loaded))
        conn.execute(sa.insert(counters), [{"name": name, "value": value} for name, value in numbered])
    return len(loaded)


def ledger_filter(ids: int, bits: int, *, batch_rows: int = LEDGER_BATCH_ROWS) -> tuple[IdFilter, int]:
    """The id filter of :func:`load_ledger`'s ledger of ``ids`` ids, and its serial (the batches merged); the ids
    hashed a slice at a time, so that little besides the filter is held."""
    merged = IdFilter(bits)
    for first in range(0, ids, _FILTER_SLICE):
        merged.add(id_hashes(_ledger_ids(first, min(first + _FILTER_SLICE, ids))).view(np.uint64))
    return merged, -(-ids // batch_rows)


def _ledger_batches(ids: int, batch_rows: int) -> Iterator[tuple[int, int, pa.Array, np.ndarray]]:
    """The synthetic batches of a ledger of ``ids`` ids, one at a time: seq, first id number, ids, their hashes."""
    for seq, first in enumerate(range(0, ids, batch_rows), start=1):
        texts = _ledger_ids(first, min(first + batch_rows, ids))
        yield seq, first, texts, id_hashes(texts)


def _ledger_ids(first: int, end: int) -> pa.Array:
    """The synthetic ids numbered ``first`` to ``end`` (excluded)."""
    return pc.binary_join_element_wise("ledger-", pa.array(np.arange(first, end, dtype=np.int64)).cast(pa.string()), "")


def _loaded_batch(batch_id: str, seq: int, rows: int, segment: int, now: datetime) -> dict[str, object]:
    """A complete batch row for ids loaded in bulk."""
    return dict(
        batch_id=batch_id,
        source="synthetic",
        state=BatchState.complete.value,
        rows=rows,
        accepted=rows,
        rejected=0,
        work_items=0,
        completed_items=0,
        poisoned_items=0,
        transactions_recorded=rows,
        accepted_at=now,
        completed_at=now,
        updated_at=now,
        seq=seq,
        id_serial=seq,
        id_segment=segment,
        id_key=seq,
    )


@dataclass(frozen=True)
class LedgerRun:
    """The bench's batch through the roles on a store whose ledger held ``ledger_ids`` ids."""

    ledger_ids: int
    pipeline: PipelineRun
    load_seconds: float  # migrating the store and loading the ids into it
    load_rss_mib: float  # peak RSS of the process that did it
    store_bytes: int  # the store's size once loaded: the SQLite database's pages, the PostgreSQL database
    filter_seconds: float  # building the ids' filter and writing its blob
    filter_rss_mib: float  # peak RSS of the process that did it (and counted the marked rows)
    marked_rows: int  # rows the initiator marks for the exact check: the batch's repeats and the filter's candidates
    load_average: list[float]  # this machine's 1, 5, 15 min load as the roles started


def run_ledger(
    kind: str,
    *,
    rows: int,
    ledger_ids: int,
    bits: int,
    data_dir: Path,
    console: Console,
    settle_seconds: float | None = None,
) -> LedgerRun:
    """The batch ``billing bench`` headlines (``rows`` rows) through a fresh local pipeline on ``kind``'s store,
    that store and the id filter blob prepared with a ledger of ``ledger_ids`` ids before the roles start."""
    prepared: dict[str, Any] = {}

    def prepare(settings: Settings) -> None:
        source = _batch_file(rows, data_dir, console, messy=DEFAULT_FILE == "messy")
        with console.status(f"{kind}: loading {ledger_ids:,} ids"):
            (prepared["load"], prepared["store"]), prepared["load_rss"] = _in_child(
                _load_sql, settings.sql_url_value, ledger_ids
            )
            (seconds, prepared["marked"]), rss = _in_child(_load_filter, settings, ledger_ids, source)
            prepared["filter"] = seconds, rss
        prepared["load_average"] = [round(figure, 2) for figure in os.getloadavg()]

    with _database(kind) as url, console.status(f"{kind}: {rows:,} rows on a ledger of {ledger_ids:,} ids"):
        pipeline = run_pipeline(
            rows,
            data_dir=data_dir,
            console=console,
            file=DEFAULT_FILE,
            store=DEFAULT_STORE,
            overrides={"ledger_filter_bits": bits, **({"sql_url": url} if url else {})},
            prepare=prepare,
            settle_seconds=settle_seconds,
        )
    return LedgerRun(
        ledger_ids=ledger_ids,
        pipeline=pipeline,
        load_seconds=round(prepared["load"], 2),
        load_rss_mib=round(prepared["load_rss"], 1),
        store_bytes=prepared["store"],
        filter_seconds=round(prepared["filter"][0], 2),
        filter_rss_mib=round(prepared["filter"][1], 1),
        marked_rows=prepared["marked"],
        load_average=prepared["load_average"],
    )


@contextmanager
def _database(kind: str) -> Iterator[str | None]:
    """A fresh PostgreSQL server's URL for ``postgresql``; None (the run's own SQLite file) for ``sqlite``."""
    if kind != "postgresql":
        yield None
        return
    with tempfile.TemporaryDirectory(
        prefix="billing-bench-ledger-pg-"
    ) as data:  # as root the server runs as `postgres`
        server = PostgresServer(data_dir=Path(data))
        try:
            yield server.start()
        finally:
            server.stop()


def _in_child(target: Callable[..., T], *args: object) -> tuple[T, float]:
    """``target(*args)`` in a fresh process of its own: its result and that process's peak RSS in MiB."""
    context = multiprocessing.get_context("spawn")
    answers: multiprocessing.queues.Queue[tuple[str, Any]] = context.Queue()
    child = context.Process(target=_child, args=(answers, target, args))
    child.start()
    kind, answer = answers.get()
    child.join()
    if kind == "error":
        raise RuntimeError(answer)
    result, rss = answer
    return result, float(rss)


def _child(
    answers: multiprocessing.queues.Queue[tuple[str, Any]], target: Callable[..., T], args: tuple[object, ...]
) -> None:
    try:
        result = target(*args)
    except Exception as exc:  # the parent raises it
        answers.put(("error", f"{type(exc).__name__}: {exc}"))
        return
    answers.put(("ok", (result, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))


def _load_sql(url: str, ids: int) -> tuple[float, int]:
    """Migrate the store and load a ledger of ``ids`` ids into it: wall seconds, and the store's size in bytes then.
    On PostgreSQL the table is then vacuumed and analysed, as autovacuum keeps a ledger that grew batch by batch
    (without statistics, the planner reads a freshly loaded table in full)."""
    started = time.perf_counter()
    with Store(url) as store:
        if ids:
            load_ledger(store, ids)
            if store.engine.dialect.name == "postgresql":
                with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    conn.exec_driver_sql("VACUUM ANALYZE ledger_ids")
        seconds = time.perf_counter() - started
        with store.engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                size = conn.exec_driver_sql("SELECT pg_database_size(current_database())").scalar_one()
            else:
                pages, page = (
                    conn.exec_driver_sql(f"PRAGMA {name}").scalar_one() for name in ("page_count", "page_size")
                )
                size = pages * page
    return seconds, int(size)


def _load_filter(settings: Settings, ids: int, source: Path) -> tuple[float, int]:
    """Write the filter of a ledger of ``ids`` ids into the work container as the initiators keep it: wall
    seconds; then the rows of ``source`` the initiator will mark against it (one copy of the filter's bits at
    a time)."""
    started = time.perf_counter()
    built, serial = ledger_filter(ids, settings.ledger_filter_bits)
    if ids:
        asyncio.run(_write_filter(settings, built.to_bytes(), serial))
    seconds = time.perf_counter() - started
    return seconds, _marked_rows(source, built, settings.work_item_size)


async def _write_filter(settings: Settings, data: bytes, serial: int) -> None:
    """The filter blob as :class:`initiator.id_filter.SharedFilter`'s first merge writes it: its serial the
    number of batches merged, written only where none is stored yet."""
    async with Storage(settings) as storage:
        await storage.ensure(containers=[settings.work_container])
        blob = storage.container(settings.work_container).get_blob_client(BLOB)
        await blob.upload_blob(
            data, overwrite=True, metadata={SERIAL: str(serial)}, match_condition=MatchConditions.IfMissing
        )


def _marked_rows(source: Path, ledger: IdFilter, work_item_size: int) -> int:
    """The rows of a CSV batch that the initiator's marking holds for the exact check against ``ledger``."""
    debatch = Debatch(work_item_size=work_item_size, id_filter=ledger)
    with source.open("rb") as stream:
        marked = (
            pc.sum(pc.greater(decode_table(cut.payload)["repeat_of"], 0)).as_py()
            for cut in debatch.tables(stream, "csv")
        )
        return sum(count or 0 for count in marked)


def run(
    *, store: str, rows: int, ledger_ids: int, bits: int, data_dir: Path, output: Path, console: Console
) -> dict[str, Any]:
    """The batch on an empty ledger, on one of ``ledger_ids`` ids, and on an empty one again (the machine's load
    drifts); checks that every run counted the same rows, prints them side by side, writes JSON."""
    runs = [
        run_ledger(store, rows=rows, ledger_ids=size, bits=bits, data_dir=data_dir, console=console)
        for size in (0, ledger_ids, 0)
    ]
    _check_exact(runs)
    loaded = runs[1].pipeline
    ratios = {
        measure: [round(getattr(loaded, measure) / getattr(empty.pipeline, measure), 3) for empty in (runs[0], runs[2])]
        for measure in ("submit_to_complete_seconds", "latency_seconds")
    }
    report = {
        "store": store,
        "rows": rows,
        "ledger_ids": ledger_ids,
        "filter_bits": bits,
        "ratios": ratios,  # the loaded ledger's time over each empty run's (before, after)
        "runs": [asdict(one) for one in runs],
    }
    console.print(_table(store, runs))
    console.print(
        "loaded over empty (before, after; at most 1.25 wanted): submit → complete "
        + ", ".join(f"{r:.3f}" for r in ratios["submit_to_complete_seconds"])
        + "; accepted → complete "
        + ", ".join(f"{r:.3f}" for r in ratios["latency_seconds"])
    )
    output.write_text(json.dumps(report, indent=2))
    return report


def _check_exact(runs: list[LedgerRun]) -> None:
    """Every run's batch completed (:func:`run_pipeline` checks) and counted the same rows: its ids are fresh."""
    first = runs[0].pipeline
    for one in runs[1:]:
        counted = (one.pipeline.accepted, one.pipeline.rejected, one.pipeline.aggregates_sha256)
        if counted != (first.accepted, first.rejected, first.aggregates_sha256):
            raise RuntimeError(
                f"on {one.ledger_ids:,} ids the batch counted {counted[:2]} (accepted, rejected),"
                f" on the empty ledger {(first.accepted, first.rejected)}, or billed other aggregates"
            )


def _table(store: str, runs: list[LedgerRun]) -> Table:
    """The runs side by side: times, CPU and peak RSS per role, marked rows, the machine's load."""
    table = Table(title=f"{runs[0].pipeline.rows:,} rows on {store}, through the roles: empty ledger, loaded, empty")
    table.add_column("ledger ids")
    for one in runs:
        table.add_column(f"{one.ledger_ids:,}", justify="right")
    lines: list[tuple[str, Callable[[LedgerRun], str]]] = [
        ("submit → complete s", lambda one: f"{one.pipeline.submit_to_complete_seconds:.2f}"),
        ("accepted → complete s", lambda one: f"{one.pipeline.latency_seconds:.2f}"),
        *((f"{role}: CPU s, peak RSS MiB", _role_cell(role)) for role in ROLES),
        ("rows marked for the exact check", lambda one: f"{one.marked_rows:,}"),
        ("load average (1 min) as the roles started", lambda one: f"{one.load_average[0]:.1f}"),
        ("loading the ids into SQL: s, peak RSS MiB", lambda one: f"{one.load_seconds:.0f}, {one.load_rss_mib:.0f}"),
        ("the store then: MiB", lambda one: f"{one.store_bytes / 2**20:,.0f}"),
        ("writing their filter: s, peak RSS MiB", lambda one: f"{one.filter_seconds:.0f}, {one.filter_rss_mib:.0f}"),
    ]
    for label, cell in lines:
        table.add_row(label, *map(cell, runs))
    return table


def _role_cell(role: str) -> Callable[[LedgerRun], str]:
    """A role's CPU seconds (a rating worker's are its processor's) and peak RSS in a run."""

    def cell(one: LedgerRun) -> str:
        cpu = one.pipeline.cpu_seconds.get(role)
        return f"{'-' if cpu is None else f'{cpu:.1f}'}, {one.pipeline.peak_rss_mib.get(role, 0.0):.0f}"

    return cell
