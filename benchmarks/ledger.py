"""The ledger benchmark (``billing bench-ledger``): a 1,000,000-row batch on an empty ledger and on one that
already holds 50,000,000 transaction ids, side by side, on SQLite or PostgreSQL.

The large ledger is loaded in bulk: synthetic ids of complete batches, each batch's in one statement series
sorted by hash into the segment the controller would have given it (:func:`store.ids.insert_ids`), their bits in
the id filter. The batch
then goes through the roles' code (:class:`InProcess`), each role's part in a process of its own, one after
the other: the initiator's cut, marking with the filter and merge; the processors' rating (one process here);
the controller's ``Store.apply`` of the manifest (its ids recorded) and of the results (held rows decided
against the ledger). Each part's wall time and peak RSS are reported, and the batch's time is their sum.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import multiprocessing.queues
import pickle
import resource
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from billing.sample import generate, sample_price_book_bytes, sample_tax_table_bytes
from initiator.debatch import Debatch
from processor.jobs import rate_work_items
from shared import inbox
from shared.protocol import IdsPart, Manifest, WorkHeader, WorkItemResult, parse_results
from shared.rules.idfilter import IdFilter
from shared.rules.reference import load_price_book, load_tax_table
from shared.settings import Settings
from store import BatchState, Store
from store.engine import writing
from store.ids import ID_KEYS, IDS, SEGMENT_ROWS, id_hashes, insert_ids
from store.ledger import BATCH_SEQ
from store.schema import batches, counters

from .postgres import PostgresServer

T = TypeVar("T")


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
        taken before it; the ids merged into the filter."""
        debatch = Debatch(work_item_size=self.work_item_size, ledger=marked_with or self.filter)
        blob, frames = inbox.in_memory(io.BytesIO(data), inbox.frame_bytes(len(data)))
        work: list[tuple[WorkHeader, bytes, bytes]] = []
        parts: list[IdsPart] = []
        for index, cut in enumerate(debatch.parts(batch_id, "csv", frames, io.BytesIO(blob))):
            header = WorkHeader(f"{batch_id}:{index:07d}", batch_id, *self.hashes, cut.rows, cut.part)
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


def load_ledger(store: Store, shared: InProcess, ids: int, *, batch_rows: int = 1_000_000) -> None:
    """Fill an empty ledger with ``ids`` synthetic ids of complete batches of ``batch_rows``, each in the segment
    the controller would have given it, sorted by hash, its seq its key; their bits in the filter."""
    now = datetime.now(UTC)
    loaded = []
    with writing(store.engine) as conn:
        for seq, first in enumerate(range(0, ids, batch_rows), start=1):
            numbers = np.arange(first, min(first + batch_rows, ids), dtype=np.int64)
            texts = pc.binary_join_element_wise("ledger-", pa.array(numbers).cast(pa.string()), "")
            hashes, segment = id_hashes(texts), first // SEGMENT_ROWS
            insert_ids(conn, segment, hashes, np.full(len(numbers), seq), numbers - first + 1, texts)
            shared.filter.add(hashes.view(np.uint64))
            loaded.append(_loaded_batch(f"ledger-{seq:06d}", seq, len(numbers), segment, now))
        conn.execute(sa.insert(batches), loaded)
        conn.execute(sa.delete(counters).where(counters.c.name.in_((BATCH_SEQ, IDS, ID_KEYS))))
        numbered = (BATCH_SEQ, len(loaded)), (IDS, ids), (ID_KEYS, len(loaded))
        conn.execute(sa.insert(counters), [{"name": name, "value": value} for name, value in numbered])
    shared.serial = len(loaded)


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


@contextmanager
def _database(kind: str, folder: Path) -> Iterator[str]:
    """A fresh, migrated database of ``kind`` under ``folder``: its URL."""
    with contextlib.ExitStack() as stack:
        url = f"sqlite:///{folder}/billing.db"
        if kind == "postgresql":  # a folder of its own under /tmp: as root the server runs as `postgres`
            data = stack.enter_context(tempfile.TemporaryDirectory(prefix="billing-bench-ledger-pg-"))
            server = PostgresServer(data_dir=Path(data))
            url = server.start()
            stack.callback(server.stop)
        Store(url).close()
        yield url


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


def _load(url: str, ids: int, bits: int, state: Path) -> float:
    """Load the large ledger; keep the filter and its serial in ``state``; wall seconds."""
    started = time.perf_counter()
    shared = InProcess(bits=bits)
    with Store(url, migrate=False) as store:
        load_ledger(store, shared, ids)
    state.write_bytes(pickle.dumps((shared.filter.to_bytes(), shared.serial)))
    return time.perf_counter() - started


def _shared(bits: int, state: Path) -> InProcess:
    shared = InProcess(bits=bits)
    if state.exists():
        data, shared.serial = pickle.loads(state.read_bytes())
        shared.filter = IdFilter(bits, data)
    return shared


def _initiator(source: Path, bits: int, state: Path, cut_file: Path) -> float:
    """The initiator's part (the filter read, the cut and marking, the merge); wall seconds."""
    started = time.perf_counter()
    shared = _shared(bits, state)
    cut_file.write_bytes(pickle.dumps(shared.cut_only("bench", source.read_bytes())))
    return time.perf_counter() - started


def _processor(bits: int, cut_file: Path, results_file: Path) -> float:
    """The processors' part: rate every work item; wall seconds."""
    work, manifest, ids = pickle.loads(cut_file.read_bytes())
    started = time.perf_counter()
    results = InProcess(bits=64).rate(work)
    results_file.write_bytes(pickle.dumps(Cut(manifest, results, ids)))
    return time.perf_counter() - started


def _controller(url: str, results_file: Path) -> tuple[float, dict[str, Any]]:
    """The controller's part: apply the manifest and the results; wall seconds and the batch's status."""
    cut = pickle.loads(results_file.read_bytes())
    with Store(url, migrate=False) as store:
        seconds = apply(store, cut)
        status = store.batch("bench")
    return seconds, {} if status is None else status.to_json_dict()


def _one(kind: str, source: Path, ledger_ids: int, bits: int, scratch: Path, console: Console) -> dict[str, Any]:
    """The batch on a ledger of ``ledger_ids`` ids, each role's part in a process of its own: its seconds and
    peak RSS, and what loading the ledger took."""
    state, cut_file, results_file = scratch / "filter.pickle", scratch / "cut.pickle", scratch / "results.pickle"
    figures: dict[str, Any] = {}
    with _database(kind, scratch) as url:
        if ledger_ids:
            with console.status(f"{kind}: loading {ledger_ids:,} ids"):
                figures["load"], figures["load_rss_mib"] = _in_child(_load, url, ledger_ids, bits, state)
        with console.status(f"{kind}: the batch on {ledger_ids:,} ids"):
            figures["initiator"], figures["initiator_rss_mib"] = _in_child(_initiator, source, bits, state, cut_file)
            figures["processors"], figures["processors_rss_mib"] = _in_child(_processor, bits, cut_file, results_file)
            (figures["controller"], status), figures["controller_rss_mib"] = _in_child(_controller, url, results_file)
    if status.get("state") != BatchState.complete or status["accepted"] + status["rejected"] != status["rows"]:
        raise RuntimeError(f"the batch did not complete exactly: {status}")
    figures["batch"] = figures["initiator"] + figures["processors"] + figures["controller"]
    figures["held"] = pickle.loads(results_file.read_bytes()).held_rows
    return {name: round(value, 2) if isinstance(value, float) else value for name, value in figures.items()}


def run(*, store: str, rows: int, ledger_ids: int, bits: int, output: Path, console: Console) -> dict[str, object]:
    """The batch on an empty ledger and on one of ``ledger_ids`` ids; prints both side by side, writes JSON."""
    with tempfile.TemporaryDirectory(prefix="billing-bench-ledger-") as folder:
        source = Path(folder) / "batch.csv"
        generate(rows, source, seed=7)
        runs = {}
        for size in (0, ledger_ids):
            scratch = Path(folder) / f"ledger-{size}"
            scratch.mkdir()
            runs[size] = _one(store, source, size, bits, scratch, console)
    ratio = runs[ledger_ids]["batch"] / runs[0]["batch"]
    report = {"store": store, "rows": rows, "ledger_ids": ledger_ids, "filter_bits": bits, "runs": runs}
    report["ratio"] = round(ratio, 3)
    table = Table(title=f"{rows:,} rows on {store}: empty ledger vs {ledger_ids:,} ids (seconds, peak RSS MiB)")
    columns = ("initiator", "processors", "controller")
    for name in ("ledger ids", *columns, "batch", "held rows"):
        table.add_column(name, justify="right")
    for size, figures in runs.items():
        cells = [f"{figures[c]} s, {figures[c + '_rss_mib']:.0f}" for c in columns]
        table.add_row(f"{size:,}", *cells, f"{figures['batch']} s", str(figures["held"]))
    console.print(table)
    console.print(f"ratio {ratio:.3f} (at most 1.25 wanted); loading the ledger took {runs[ledger_ids].get('load')} s")
    output.write_text(json.dumps(report, indent=2))
    return report
