"""``billing bench-celery``: the same batch done the way a team would build it with Celery, as the figure
the pipeline is compared with (``docs/performance.md``, "Celery baseline").

The batch is the main benchmark's messy file (:func:`benchmarks.pipeline._batch_file`) on a fresh Azurite
persisted to disk, as ``billing up`` runs it. The client (this process) reads it with the project's reader,
marks the rows whose transaction id repeats an earlier row's (:class:`shared.rules.duplicates.FirstOccurrences`,
as the initiator does) and sends one Celery task per chunk of ``chunk_rows`` rows, the rows in the message,
over kombu's Azure Storage Queues transport. Celery prefork workers (concurrency = CPUs) validate and rate
each chunk with the processor's rules (:mod:`benchmarks.celery_app`) and store their partial aggregates in
Celery's SQLAlchemy result backend on SQLite. The client collects the results in order, sums them with
pyarrow and decides the held repeats once every row is validated (:func:`shared.rules.duplicates.keep_first`):
Celery's chunks cannot see each other, so the within-batch duplicate rule is the client's. Submit → complete
runs from the first read of the file to the summed totals; the sums are then checked against the reference
model (:mod:`benchmarks.expected`) to the minor unit, every aggregate. Storage requests are what Azurite's own
``--debug`` log shows, in one extra run (the log slows Azurite, so that run is not timed).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from azure.core.exceptions import HttpResponseError
from celery import Celery
from celery.result import AsyncResult, ResultSet
from rich.console import Console
from rich.table import Table

from shared.localstack import ACCOUNT_KEY, AzuriteStack
from shared.messaging.storage import request_kind
from shared.rules.batchfile import RAW_COLUMNS, read_chunks
from shared.rules.duplicates import FirstOccurrences, keep_first
from shared.rules.schemas import PARTIAL_SCHEMA

from . import celery_app
from .cpu import tree_cpu_seconds
from .expected import Expected, expected
from .pipeline import _batch_file

#: Where ``celery -A benchmarks.celery_app`` imports the app from.
ROOT = Path(__file__).resolve().parent.parent
KEYS = ["account_id", "product", "billing_day", "currency"]
SUMS = ["transactions", "quantity", "net", "tax", "total"]
TOTALS = ("transactions", "net", "tax", "total")  # per currency, in the report
#: Seconds the worker gets to start consuming, and to finish its tasks when stopped, before it is killed.
START_SECONDS, STOP_SECONDS = 60.0, 10.0
#: One line per request in Azurite's debug log: the service middleware, the method and the URL.
_REQUEST = r"(Queue|Blob)StorageContextMiddleware: RequestMethod=(\w+) RequestURL=(\S+)"


class ChunkTooLarge(ValueError):
    """A task's chunk does not fit a storage queue message."""


@dataclass(frozen=True)
class CeleryRun:
    rows: int
    chunk_rows: int
    tasks: int
    concurrency: int  # prefork worker processes
    submit_to_complete_seconds: float  # first read of the file → every chunk's result summed
    sent_seconds: float  # first read of the file → the last task sent
    transactions_per_second: float
    accepted: int
    rejected: int
    cpu_seconds: dict[str, float]  # client, Celery worker (main and children), Azurite
    exact: bool  # every aggregate and both counts equal the reference model's
    totals: dict[str, dict[str, int]]  # currency -> transactions, net, tax, total (minor units)
    load_average: list[float] = field(default_factory=list)
    storage_requests: dict[str, int] = field(default_factory=dict)  # by kind, in a counted run only


@dataclass(frozen=True)
class CeleryReport:
    runs: list[CeleryRun]
    medians: dict[int, float]  # chunk rows -> median submit → complete seconds
    chunk_rows: int  # the fastest
    counted: CeleryRun | None  # the untimed run whose storage requests Azurite logged

    @property
    def exact(self) -> bool:
        return all(run.exact for run in self.runs) and (self.counted is None or self.counted.exact)


def run(
    *,
    rows: int,
    chunk_rows: Sequence[int],
    repeat: int,
    data_dir: Path,
    output: Path,
    console: Console,
    count_requests: bool = False,
) -> CeleryReport:
    """Each chunk size ``repeat`` times (interleaved), then with ``count_requests`` one logged run of the
    fastest; prints the table, writes ``output`` (JSON)."""
    batch = _batch_file(rows, data_dir, console, messy=True)
    with console.status(f"reference model, {rows:,} rows one at a time"):
        model = expected(batch, (data_dir / "pricebook.csv").read_text(), (data_dir / "taxes.csv").read_text())
    runs = []
    for attempt in range(repeat):
        for size in chunk_rows:
            with console.status(f"Celery, {rows:,} rows in chunks of {size:,}, run {attempt + 1} of {repeat}"):
                runs.append(run_celery(batch, chunk_rows=size, data_dir=data_dir, model=model))
    medians = {
        size: statistics.median_low([r.submit_to_complete_seconds for r in runs if r.chunk_rows == size])
        for size in chunk_rows
    }
    fastest = min(medians, key=lambda size: medians[size])
    counted = None
    if count_requests:
        with console.status("Celery, storage requests counted from Azurite's debug log"):
            counted = run_celery(batch, chunk_rows=fastest, data_dir=data_dir, model=model, count_requests=True)
    report = CeleryReport(runs, medians, fastest, counted)
    _print(report, console)
    output.write_text(json.dumps(asdict(report) | {"exact": report.exact}, indent=2))
    console.print(f"wrote {output}")
    return report


def run_celery(
    batch: Path,
    *,
    chunk_rows: int,
    data_dir: Path,
    model: Expected,
    count_requests: bool = False,
    timeout: float = 1800.0,
) -> CeleryRun:
    """One run on a fresh, persisted Azurite and a fresh worker; the worker is stopped whatever happens."""
    load = [round(figure, 2) for figure in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="billing-celery-") as scratch:
        home = Path(scratch)
        debug_log = home / "azurite-debug.log" if count_requests else None
        stack = AzuriteStack(home=home, persist=True, debug_log=debug_log)
        try:
            queue_endpoint = _endpoints(stack.start())["QueueEndpoint"]
            broker = f"azurestoragequeues://{ACCOUNT_KEY}@{queue_endpoint}"
            results = f"db+sqlite:///{home / 'results.sqlite'}"
            environment = celery_app.worker_environment(broker=broker, results=results, references=data_dir)
            with celery_app.client(broker=broker, results=results) as client:
                client.backend.ResultSession().close()  # its tables, before the worker's processes race to make them
                with _worker(environment, home) as worker:
                    cpu_before = tree_cpu_seconds(worker.pid), tree_cpu_seconds(stack.pid or 0)
                    client_before, clock = time.process_time(), time.monotonic()
                    billed = _submit_and_wait(client, batch, chunk_rows, timeout=timeout)
                    seconds = time.monotonic() - clock
                    cpu = {
                        "client": time.process_time() - client_before,
                        "celery worker": tree_cpu_seconds(worker.pid) - cpu_before[0],
                        "azurite": tree_cpu_seconds(stack.pid or 0) - cpu_before[1],
                    }
        finally:
            stack.stop()
        requests = _requests(debug_log) if debug_log is not None else {}
    return CeleryRun(
        rows=billed.accepted + billed.rejected,
        chunk_rows=chunk_rows,
        tasks=billed.tasks,
        concurrency=os.cpu_count() or 1,
        submit_to_complete_seconds=round(seconds, 2),
        sent_seconds=round(billed.sent_seconds, 2),
        transactions_per_second=round(billed.accepted / seconds),
        accepted=billed.accepted,
        rejected=billed.rejected,
        cpu_seconds={name: round(value, 2) for name, value in cpu.items()},
        exact=billed.matches(model),
        totals=billed.totals(),
        load_average=load,
        storage_requests=requests,
    )


def _endpoints(connection: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in connection.split(";") if "=" in part)


@contextlib.contextmanager
def _worker(environment: dict[str, str], home: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A Celery prefork worker (concurrency = CPUs) in a process group of its own, consuming once this
    yields; on the way out the group gets SIGTERM (warm shutdown), then SIGKILL, until none of it is left."""
    ready, log = home / "celery-ready", home / "celery-worker.log"
    command = [sys.executable, "-m", "celery", "-A", "benchmarks.celery_app", "worker", "--pool", "prefork"]
    command += ["--concurrency", str(os.cpu_count() or 1), "--loglevel", "WARNING", "--hostname", f"bench@{home.name}"]
    command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    env = {**os.environ, **environment, celery_app.READY_ENV: str(ready)}
    with log.open("ab") as sink:
        worker = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + START_SECONDS
        while not ready.exists():
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Celery worker did not start: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)
        yield worker
    finally:
        _stop_group(worker)


def _stop_group(worker: subprocess.Popen[bytes]) -> None:
    """Warm shutdown of the worker's process group, SIGKILL for whatever is left after ``STOP_SECONDS``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    while _group_alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    while _group_alive(worker):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        time.sleep(0.1)


def _group_alive(worker: subprocess.Popen[bytes]) -> bool:
    """Whether any process of the worker's group is left (the worker itself reaped as it exits)."""
    worker.poll()
    try:
        os.killpg(worker.pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class _Billed:
    """What the chunks' results add up to."""

    tasks: int
    sent_seconds: float  # from the first read to the last task sent
    aggregates: pa.Table  # PARTIAL_SCHEMA, one row per key
    accepted: int
    rejected: int

    def as_model(self) -> dict[tuple[str, ...], list[Any]]:
        """The aggregates keyed as :class:`benchmarks.expected.Expected`'s."""
        rows = self.aggregates.to_pylist()
        return {tuple(row[key] for key in KEYS): [row[name] for name in SUMS] for row in rows}

    def matches(self, model: Expected) -> bool:
        return (self.accepted, self.rejected) == (model.accepted, model.rejected) and self.as_model() == {
            key: list(sums) for key, sums in model.aggregates.items()
        }

    def totals(self) -> dict[str, dict[str, int]]:
        by_currency = self.aggregates.group_by("currency").aggregate([(name, "sum") for name in TOTALS])
        return {
            row["currency"]: {name: int(row[f"{name}_sum"]) for name in TOTALS}
            for row in sorted(by_currency.to_pylist(), key=lambda row: str(row["currency"]))
        }


def _submit_and_wait(client: Celery, batch: Path, chunk_rows: int, *, timeout: float) -> _Billed:
    """The client: one task per chunk of the file, sent as it is read; then every result, in order, summed."""
    first, clock = FirstOccurrences(), time.monotonic()
    results: list[AsyncResult] = []
    with batch.open("rb") as source:
        for chunk in read_chunks(source, "csv", chunk_rows=chunk_rows):
            rows = chunk.column("row").to_numpy()
            repeat_of = first.repeat_of(pc.utf8_trim_whitespace(chunk.column("transaction_id").combine_chunks()), rows)
            repeats = {int(at): int(repeat_of[at]) for at in np.flatnonzero(repeat_of)}
            fields = {name: chunk.column(name).to_pylist() for name in RAW_COLUMNS}
            message = celery_app.chunk_message(fields, int(rows[0]), repeats)
            try:
                results.append(client.send_task(celery_app.TASK, args=[message]))
            except HttpResponseError as exc:
                if getattr(exc, "error_code", None) != "RequestBodyTooLarge":  # set by the storage SDK
                    raise
                raise ChunkTooLarge(
                    f"a task of {chunk_rows:,} rows does not fit a storage queue message (64 KiB): give fewer rows"
                ) from None
    sent, sums = time.monotonic() - clock, _Sums()
    ResultSet(results, app=client).join(timeout=timeout, interval=0.1, callback=lambda _, value: sums.add(value))
    return sums.billed(len(results), sent)


class _Sums:
    """The chunks' results as they arrive: partial aggregates, rejected rows, held repeats."""

    def __init__(self) -> None:
        self.partials: list[pa.Table] = []
        self.held: list[pa.Table] = []
        self.rejected_rows: list[int] = []

    def add(self, result: dict[str, Any]) -> None:
        self.partials.append(_partials(result["partials"]))
        held = result["held"]
        rows, repeat_of = (pa.array(held[name], pa.int64()) for name in ("row", "repeat_of"))
        self.held.append(_partials(held).append_column("row", rows).append_column("repeat_of", repeat_of))
        self.rejected_rows.extend(result["rejects"][0])

    def billed(self, tasks: int, sent_seconds: float) -> _Billed:
        """Sum everything, the held repeats decided first (the earliest valid one of an id whose first
        occurrence was rejected counts; the others are duplicates)."""
        held = pa.concat_tables(self.held)
        kept = keep_first(
            held.column("row").to_numpy(), held.column("repeat_of").to_numpy(), np.array(self.rejected_rows, np.int64)
        )
        counted = pa.concat_tables([*self.partials, held.filter(pa.array(kept)).select(PARTIAL_SCHEMA.names)])
        sums = counted.group_by(KEYS, use_threads=False).aggregate([(name, "sum") for name in SUMS])
        aggregates = pa.table({key: sums[key] for key in KEYS} | {name: sums[f"{name}_sum"] for name in SUMS})
        accepted = int(pc.sum(aggregates.column("transactions")).as_py() or 0)
        rejected = len(self.rejected_rows) + int(len(kept) - kept.sum())
        return _Billed(tasks, sent_seconds, aggregates, accepted, rejected)


def _partials(columns: dict[str, list[Any]]) -> pa.Table:
    """A result's partial aggregates (JSON columns) as a ``PARTIAL_SCHEMA`` table."""
    arrays = [
        pa.array(columns[f.name], pa.string()).cast(f.type)
        if f.name == "quantity"
        else pa.array(columns[f.name], f.type)
        for f in PARTIAL_SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=PARTIAL_SCHEMA)


def _requests(debug_log: Path) -> dict[str, int]:
    """Requests by kind (and in all), as Azurite logged receiving them."""
    seen: Counter[str] = Counter()
    for service, method, url in re.findall(_REQUEST, debug_log.read_text(errors="replace")):
        seen[request_kind(service.lower(), method, url)] += 1
    return dict(sorted(seen.items())) | {"total": sum(seen.values())}


def _print(report: CeleryReport, console: Console) -> None:
    table = Table(title=f"Celery baseline: {report.runs[0].rows:,} rows, messy file, Azurite persisted (this machine)")
    for column in (
        "chunk rows",
        "tasks",
        "submit → complete s",
        "all sent at s",
        "tx/s",
        "CPU s (client, worker, Azurite)",
        "exact",
    ):
        table.add_column(column, justify="right")
    for run_ in report.runs:
        table.add_row(
            f"{run_.chunk_rows:,}",
            f"{run_.tasks:,}",
            f"{run_.submit_to_complete_seconds:.2f}",
            f"{run_.sent_seconds:.2f}",
            f"{run_.transactions_per_second:,.0f}",
            ", ".join(f"{seconds:.1f}" for seconds in run_.cpu_seconds.values()),
            "yes" if run_.exact else "NO",
        )
    console.print(table)
    for size, median in report.medians.items():
        fastest = " (fastest)" if size == report.chunk_rows else ""
        console.print(f"chunks of {size:,} rows: median submit → complete {median:.2f} s{fastest}")
    if report.counted is not None:
        requests = report.counted.storage_requests
        per_1000 = 1000 * requests.get("total", 0) / max(1, report.counted.rows)
        kinds = ", ".join(f"{kind} {count:,}" for kind, count in requests.items() if kind != "total")
        console.print(
            f"storage requests (Azurite's log): {requests.get('total', 0):,} ({per_1000:.2f} / 1,000 rows): {kinds}"
        )
