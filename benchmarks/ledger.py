"""The ledger benchmark (``billing bench-ledger``): a 1,000,000-row batch on an empty ledger and on one that
already holds 50,000,000 transaction ids, side by side, on SQLite or PostgreSQL.

The large ledger is loaded in bulk: synthetic ids in segments (:func:`store.ids.insert_ids`, sorted by hash),
their bits in the id filter, as many batch rows as it took. The batch then goes through the roles' code in
this process (:class:`InProcess`): the initiator's cut and marking with the filter and its merge, the
processors' rating, the controller's ``Store.apply`` of the manifest (its ids recorded) and of the results
(held rows decided against the ledger). Each phase's wall time is reported and the batch's total; the
phases run one after the other here, as on a machine with one core per role. Peak RSS is that of this
process, which does every role's part (each role alone takes less).
"""

from __future__ import annotations

import io
import json
import resource
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

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
from shared.protocol import Manifest, WorkHeader, WorkItemResult, parse_results
from shared.rules.idfilter import IdFilter
from shared.rules.reference import load_price_book, load_tax_table
from store import BatchState, Store
from store.engine import writing
from store.ids import IDS, SEGMENT_ROWS, id_hashes, insert_ids
from store.ledger import BATCH_SEQ
from store.schema import batches, counters

from .postgres import PostgresServer

#: Ids loaded per statement while the large ledger is built.
LOAD_ROWS = 1_000_000


@dataclass
class Cut:
    """A batch as the initiator left it: its manifest and the results the processors made of its items."""

    manifest: Manifest
    results: list[WorkItemResult]
    seconds: dict[str, float] = field(default_factory=dict)


class InProcess:
    """The roles' work on batches, in this process: the shared id filter (as its blob would hold it, with its
    serial), the initiator's cut, marking and merge, the processors' rating."""

    def __init__(self, *, bits: int, work_item_size: int = 40_000) -> None:
        self.filter = IdFilter(bits)
        self.serial = 0
        self.work_item_size = work_item_size
        self.price_book, self.tax_table = sample_price_book_bytes(), sample_tax_table_bytes()
        book, taxes = load_price_book(self.price_book), load_tax_table(self.tax_table)
        self.hashes = (book.content_hash, taxes.content_hash)

    def cut(self, batch_id: str, data: bytes, *, marked_with: IdFilter | None = None, merge: bool = True) -> Cut:
        """Cut, mark (with ``marked_with``, a copy taken earlier, else the filter now) and rate a CSV batch; merge
        its ids into the filter unless ``merge`` is False (then :meth:`merge` it later)."""
        started = time.perf_counter()
        serial = self.serial
        debatch = Debatch(work_item_size=self.work_item_size, ledger=marked_with or self.filter)
        blob, frames = inbox.in_memory(io.BytesIO(data), inbox.frame_bytes(len(data)))
        references = dict(zip(self.hashes, (self.price_book, self.tax_table), strict=True))
        results, rating = [], 0.0
        for index, cut in enumerate(debatch.parts(batch_id, "csv", frames, io.BytesIO(blob))):
            header = WorkHeader(f"{batch_id}:{index:07d}", batch_id, *self.hashes, cut.rows, cut.part)
            text = blob[cut.part.start : cut.part.end] if cut.part else b""
            rated_at = time.perf_counter()
            envelope, poisoned = rate_work_items([(header, cut.payload, text)], references, [{}])
            rating += time.perf_counter() - rated_at
            if envelope is None or poisoned:
                raise RuntimeError(f"work item {index} could not be rated: {poisoned}")
            results += parse_results(envelope)
        manifest = Manifest(
            batch_id=batch_id,
            source=f"{batch_id}.csv",
            rows=debatch.rows,
            work_items=debatch.work_items,
            pricebook_hash=self.hashes[0],
            taxes_hash=self.hashes[1],
            accepted_at=datetime.now(UTC),
            filter_serial=serial,
            ids=debatch.ids(),
        )
        cut_seconds = time.perf_counter() - started - rating
        merged = time.perf_counter()
        if merge:
            manifest = self.merge(manifest, debatch.hashes())
        seconds = {"initiator": cut_seconds + time.perf_counter() - merged, "processors": rating}
        return Cut(manifest, results, seconds)

    def merge(self, manifest: Manifest, hashes: np.ndarray) -> Manifest:
        """Merge a batch's ids into the filter: its manifest, with the merge's serial."""
        self.filter.add(hashes)
        self.serial += 1
        return Manifest(**{**manifest.__dict__, "id_serial": self.serial})


def apply(store: Store, cut: Cut, *, group: int = 4) -> float:
    """The controller's part: the manifest, then the results ``group`` at a time; wall seconds."""
    started = time.perf_counter()
    store.apply([cut.manifest], [])
    for start in range(0, len(cut.results), group):
        store.apply([], cut.results[start : start + group])
    return time.perf_counter() - started


def load_ledger(store: Store, shared: InProcess, ids: int, *, batch_rows: int = 1_000_000) -> float:
    """Fill an empty ledger with ``ids`` synthetic ids of complete batches of ``batch_rows``: the batch rows,
    the ids a segment at a time (sorted by hash, so each segment is written in key order), their bits in the
    filter; wall seconds."""
    started = time.perf_counter()
    now = datetime.now(UTC)
    count = -(-ids // batch_rows)
    with writing(store.engine) as conn:
        for first in range(0, ids, SEGMENT_ROWS):
            numbers = np.arange(first, min(first + SEGMENT_ROWS, ids), dtype=np.int64)
            texts = pc.binary_join_element_wise("ledger-", pa.array(numbers).cast(pa.string()), "")
            hashes = id_hashes(texts)
            seqs, rows = numbers // batch_rows + 1, numbers % batch_rows + 1
            insert_ids(conn, first // SEGMENT_ROWS, hashes, seqs, rows, texts)
            shared.filter.add(hashes.view(np.uint64))
        conn.execute(sa.insert(batches), [_loaded_batch(f"ledger-{s:06d}", s, batch_rows, now) for s in range(1, count + 1)])
        shared.serial = count
        conn.execute(sa.delete(counters).where(counters.c.name.in_((BATCH_SEQ, IDS))))
        conn.execute(sa.insert(counters), [{"name": BATCH_SEQ, "value": count}, {"name": IDS, "value": ids}])
    return time.perf_counter() - started


def _loaded_batch(batch_id: str, seq: int, rows: int, now: datetime) -> dict[str, object]:
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
    )


@contextmanager
def _store(kind: str, folder: Path) -> Iterator[Store]:
    """A fresh store of ``kind`` under ``folder``."""
    if kind == "sqlite":
        with Store(f"sqlite:///{folder}/billing.db") as store:
            yield store
        return
    with PostgresServer(data_dir=folder / "pg") as server, Store(server.url) as store:
        yield store


def _one(kind: str, data: bytes, ledger_ids: int, bits: int, scratch: Path, console: Console) -> dict[str, float]:
    """The batch on a ledger of ``ledger_ids`` ids: its phases' seconds and what loading the ledger took."""
    shared = InProcess(bits=bits)
    with _store(kind, scratch) as store:
        loaded = 0.0
        if ledger_ids:
            with console.status(f"{kind}: loading {ledger_ids:,} ids"):
                loaded = load_ledger(store, shared, ledger_ids)
        with console.status(f"{kind}: the batch on {ledger_ids:,} ids"):
            cut = shared.cut("bench", data)
            controller = apply(store, cut)
            status = store.batch("bench")
    if status is None or status.state != BatchState.complete or status.accepted + status.rejected != status.rows:
        raise RuntimeError(f"the batch did not complete exactly: {status}")
    phases = {**cut.seconds, "controller": controller}
    return {**{k: round(v, 2) for k, v in phases.items()}, "batch": round(sum(phases.values()), 2)} | {
        "load": round(loaded, 1),
        "held": sum(r.held.num_rows for r in cut.results),
    }


def run(*, store: str, rows: int, ledger_ids: int, bits: int, output: Path, console: Console) -> dict[str, object]:
    """The batch on an empty ledger and on one of ``ledger_ids`` ids; prints both side by side, writes JSON."""
    with tempfile.TemporaryDirectory(prefix="billing-bench-ledger-") as folder:
        source = Path(folder) / "batch.csv"
        generate(rows, source, seed=7)
        data = source.read_bytes()
        runs = {}
        for size in (0, ledger_ids):
            scratch = Path(folder) / f"ledger-{size}"
            scratch.mkdir()
            runs[size] = _one(store, data, size, bits, scratch, console)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ratio = runs[ledger_ids]["batch"] / runs[0]["batch"]
    report = {"store": store, "rows": rows, "ledger_ids": ledger_ids, "filter_bits": bits, "runs": runs}
    report |= {"ratio": round(ratio, 3), "peak_rss_mib": round(rss)}
    table = Table(title=f"{rows:,} rows on {store}: empty ledger vs {ledger_ids:,} ids")
    for name in ("ledger ids", "initiator s", "processors s", "controller s", "batch s", "held rows", "load s"):
        table.add_column(name, justify="right")
    for size, figures in runs.items():
        keys = ("initiator", "processors", "controller", "batch", "held", "load")
        table.add_row(f"{size:,}", *(str(figures[k]) for k in keys))
    console.print(table)
    console.print(f"ratio {ratio:.3f} (at most 1.25 wanted); peak RSS of this process {rss:.0f} MiB")
    output.write_text(json.dumps(report, indent=2))
    return report
