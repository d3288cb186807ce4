"""``billing bench``: the pipeline measured on the local stack, optimised against the naive design.

In one invocation: a large batch through the optimised pipeline (throughput, latency, memory); one
same smaller batch through the optimised pipeline and through the naive mode (one transaction per
message, one message per receive, delete on receive, fixed 1 s polling, no triggers); the listener's
idle cost and trigger wake-up latency (:mod:`billing.listenbench`); optionally the scaling curve over
partitions and processor processes. Storage requests are what every process's own request counter
(an SDK pipeline policy) saw, all roles plus the submitting client. Every run gets a fresh Azurite
and SQLite under a scratch home. Prints one table, writes it as JSON and draws a PNG chart.

The large batch is timed as a clean file (no quoting, no padding, no extra column) and as a messy one
(:func:`billing.sample.generate`'s ``messy``: the same rows as a real export writes them), each
on an Azurite held in memory and on one persisted to disk; the headline is the user's default: the
messy file on the persisted Azurite that `billing up` starts. Every run records its batch's stored
aggregates (totals per currency and a digest), so runs of any file and store can be compared exactly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr
from rich.console import Console
from rich.table import Table

from billing import cost, reports
from billing.demo import role_processes
from billing.sample import generate, write_price_book, write_tax_table
from shared.localstack import AzuriteStack
from shared.messaging.service import STATE_INTERVAL
from shared.settings import Settings
from store import MONEY_COLUMNS, BatchStatus, Store

from . import listener as listenbench
from .cpu import Sampler, busy, tree_cpu_seconds

Mode = Literal["optimised", "naive"]
FileKind = Literal["clean", "messy"]
StoreKind = Literal["memory", "disk"]
FILES: tuple[FileKind, ...] = ("clean", "messy")
STORES: tuple[StoreKind, ...] = ("memory", "disk")
#: What a user runs: a real export (quoted fields, padding, extra columns) on `billing up`'s persisted Azurite.
DEFAULT_FILE: FileKind = "messy"
DEFAULT_STORE: StoreKind = "disk"

#: What a first version would do (settings, so the same code runs both designs).
NAIVE: dict[str, Any] = {
    "work_item_size": 1,
    "work_item_rows": "message",
    "dequeue_batch_size": 1,
    "dequeue_tasks": 1,
    "delete_on_receive": True,
    "min_idle_interval": 1.0,
    "max_idle_interval": 1.0,
    "trigger_backend": "none",
}
#: How long a run waits for the roles to be idle before and after its batch (pull mode never is).
SETTLE_SECONDS: dict[str, float] = {"optimised": 30.0, "naive": 3.0}
#: A batch's phases, in order, as its status records them.
PHASES = ("accepted_at", "uploaded_at", "first_item_sent_at", "last_item_sent_at", "debatched_at", "completed_at")
#: Throughput targets the capacity table sizes each role for (transactions per second).
CAPACITY_TARGETS = (100_000, 1_000_000, 10_000_000)
SCALING_PARTITIONS = (1, 2, 4, 8)
SCALING_PROCESSORS = (1, 2, 3)


@dataclass(frozen=True)
class PipelineRun:
    mode: Mode
    rows: int  # in all, over ``batches`` files submitted at once
    batches: int
    partitions: int
    processors: int
    accepted: int
    work_items: int
    submit_to_complete_seconds: float  # what the user waits: `billing submit --wait`, start to exit
    submit_transactions_per_second: float
    latency_seconds: float  # accepted → complete, as the batch's status says
    transactions_per_second: float
    phases: dict[str, float]  # seconds from the start of `billing submit` to each phase
    cpu_seconds: dict[str, float]  # CPU seconds each role (and Azurite, and the client) spent on the batch
    storage_requests: int
    requests_per_1000: float
    setup_requests: int  # before the batch: creating queues and containers, polls until the roles were idle
    work_requests_per_1000: float  # the batch's own: from submission until the roles were idle again
    attributed_requests_per_1000: float | None  # what the batch's own status counted for it (shared.tally)
    requests_by_kind: dict[str, int]
    peak_rss_mib: dict[str, float]
    file: FileKind = "clean"
    store: StoreKind = "memory"  # Azurite held in memory, or persisted to disk
    cpu_cap: float | None = None  # cores each processor (with its rating workers) was capped at
    load_average: list[float] = field(default_factory=list)  # this machine's 1, 5, 15 min load as the run began
    rejected: int = 0
    items_by_processor: list[int] = field(default_factory=list)  # work items each processor handled, in order
    totals: dict[str, dict[str, int]] = field(default_factory=dict)  # currency -> transactions, net, tax, total
    aggregates_sha256: str = ""  # of the batches' stored aggregates: equal for runs that billed the same
    busy: list[dict[str, Any]] = field(default_factory=list)  # per span of the batch: the cores each role kept busy


@dataclass(frozen=True)
class BenchReport:
    main: PipelineRun  # the median of ``main_runs`` by submit → complete
    main_runs: list[PipelineRun]
    optimised: PipelineRun
    naive: PipelineRun
    listener: listenbench.ListenerBench
    scaling: list[PipelineRun]
    monthly_cost: dict[str, dict[str, Any]]  # design → projection at 10 M transactions/day, 22 idle hours
    variants: list[PipelineRun] = field(default_factory=list)  # the large batch as the other files and stores


def monthly_costs(
    main: PipelineRun, naive: PipelineRun, listener: listenbench.ListenerBench
) -> dict[str, dict[str, Any]]:
    """Both designs projected by ``billing cost``'s code, from what was measured here."""
    idle = listener.idle_requests_per_hour
    prices = cost.Prices.load()
    return {
        "optimised": cost.project(cost.Workload(main.work_requests_per_1000, idle["push (local bus)"]), prices),
        "naive": cost.project(cost.Workload(naive.work_requests_per_1000, idle["naive 1 s polling"]), prices),
    }


def run_pipeline(
    rows: int,
    *,
    data_dir: Path,
    console: Console,
    mode: Mode = "optimised",
    partitions: int = 4,
    processors: int = 1,
    batches: int = 1,
    file: FileKind = "clean",
    store: StoreKind = "memory",
    processor_cgroups: Sequence[Path] = (),
    cpu_cap: float | None = None,
    settle_seconds: float | None = None,
    overrides: Mapping[str, Any] | None = None,
    prepare: Callable[[Settings], None] | None = None,
) -> PipelineRun:
    """Generate (or reuse) ``batches`` CSV files (``file``: clean or messy) of ``rows`` rows in all and
    time them through a fresh local pipeline on Azurite (``store``: in memory or persisted), submitted as
    a user does: one ``billing submit FILE... --wait`` for all of them, timed from its start to its exit.
    Each processor runs in its cgroup of ``processor_cgroups`` when given (``cpu_cap``: what they allow,
    as recorded); the roles get ``settle_seconds`` to be idle before and after the batch. ``overrides``: more
    settings for the roles (a SQL URL, say); ``prepare`` runs once the stack is up, before the roles start."""
    files = [
        _batch_file(rows // batches, data_dir, console, seed=42 + number, messy=file == "messy")
        for number in range(batches)
    ]
    load = [round(figure, 2) for figure in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="billing-bench-") as scratch:
        home = Path(scratch)
        stack = AzuriteStack(home=home, persist=store == "disk")
        settings = Settings(
            home=home,
            storage_connection_string=SecretStr(stack.start()),
            partitions=partitions,
            **(NAIVE if mode == "naive" else {}),
            **(overrides or {}),
        )
        try:
            if prepare is not None:
                prepare(settings)
            settle = SETTLE_SECONDS[mode] if settle_seconds is None else settle_seconds
            with role_processes(
                settings, home / "logs", processors=processors, processor_cgroups=processor_cgroups
            ) as processes:
                before = _settled(home, roles=2 + processors, timeout=settle)
                cpu_before = _cpu(processes, stack)
                waited = _submit_and_wait(settings, files, data_dir, _roles(processes, stack))
                with Store(settings.sql_url_value) as sql:
                    statuses = [sql.batch(batch_id) for batch_id in waited.batch_ids]
                    done = [status for status in statuses if status is not None and status.state == "complete"]
                    assert len(done) == batches, f"not every batch completed: {statuses}"
                    billed = _billed(sql, waited.batch_ids)
                cpu = {role: seconds - cpu_before[role] for role, seconds in _cpu(processes, stack).items()}
                cpu[CLIENT] = waited.cpu_seconds
                time.sleep(STATE_INTERVAL + 0.5)  # no stale state file shows the roles idle
                _settled(home, roles=2 + processors, timeout=settle)  # the wake-ups' trailing polls count too
                processor_pids = [process.pid for process in processes[1 : 1 + processors]]
            states = [json.loads(p.read_text()) for p in sorted((home / "state").glob("*.json"))]
        finally:
            stack.stop()
    by_kind: dict[str, int] = {"client (billing submit)": waited.requests}
    rss: dict[str, float] = {}
    for state in states:
        for kind, count in state["requests"].items():
            by_kind[kind] = by_kind.get(kind, 0) + count
        rss[state["role"]] = max(state["peak_rss_mib"], rss.get(state["role"], 0.0))
        if state["role"] == "processor":  # its rating workers, reaped by the time the final state is written
            rss["rating worker"] = max(state["peak_child_rss_mib"], rss.get("rating worker", 0.0))
    total = by_kind.pop("total") + waited.requests
    setup = before  # creating queues and containers, and polls until every listener was idle
    accepted = sum(status.accepted for status in done)
    latency = max(float(status.latency_seconds or 0.0) for status in done)
    attributed = sum(status.requests for status in done)
    return PipelineRun(
        mode=mode,
        rows=rows,
        batches=batches,
        partitions=partitions,
        processors=processors,
        accepted=accepted,
        work_items=sum(status.work_items or 0 for status in done),
        submit_to_complete_seconds=round(waited.seconds, 2),
        submit_transactions_per_second=round(accepted / waited.seconds),
        latency_seconds=round(latency, 2),
        transactions_per_second=round(accepted / latency) if latency else 0.0,
        phases=_phases(done[0], waited.started),
        cpu_seconds={role: round(seconds, 2) for role, seconds in cpu.items()},
        storage_requests=total,
        requests_per_1000=round(1000 * total / max(1, accepted), 3),
        setup_requests=setup,
        work_requests_per_1000=round(1000 * (total - setup) / max(1, accepted), 3),
        attributed_requests_per_1000=round(1000 * attributed / max(1, accepted), 3),
        requests_by_kind=by_kind,
        peak_rss_mib=rss,
        file=file,
        store=store,
        cpu_cap=cpu_cap,
        load_average=load,
        rejected=sum(status.rejected for status in done),
        items_by_processor=_items_by_processor(states, processor_pids),
        totals=billed.totals,
        aggregates_sha256=billed.digest,
        busy=busy(waited.samples, _spans(_phases(done[0], waited.started), waited.seconds)),
    )


@dataclass(frozen=True)
class _Billed:
    """What the batches of a run stored, as the reports read it back."""

    totals: dict[str, dict[str, int]]  # currency -> transactions, net, tax, total (minor units)
    digest: str  # SHA-256 of every aggregate row (account, product, day, currency, counts and money)


def _billed(sql: Store, batch_ids: list[str]) -> _Billed:
    """The stored aggregates of ``batch_ids`` (in that order): their totals per currency and a digest."""
    digest = hashlib.sha256()
    totals: dict[str, dict[str, int]] = {}
    for batch_id in batch_ids:
        frame = reports.aggregates(sql, batch_id)[reports.AGGREGATE_COLUMNS]
        digest.update(frame.to_csv(index=False).encode())
        for currency, group in frame.groupby("currency"):
            sums = totals.setdefault(str(currency), dict.fromkeys(("transactions", *MONEY_COLUMNS), 0))
            for column in sums:
                sums[column] += sum(int(value) for value in group[column])
    return _Billed(totals=dict(sorted(totals.items())), digest=digest.hexdigest())


def _items_by_processor(states: list[dict[str, Any]], pids: list[int]) -> list[int]:
    """The messages (work items) each processor's listeners handled, from its last state file, in the
    order of ``pids``: a processor's state file is named after its pid (``processor-<pid>.json``)."""
    handled = {
        int(state["pid"]): sum(int(listener["processed"]) for listener in state["listeners"])
        for state in states
        if state["role"] == "processor"
    }
    return [handled.get(pid, 0) for pid in pids]


@dataclass(frozen=True)
class _Waited:
    """What the users waited: ``billing submit --wait`` for each file, all started together."""

    started: datetime
    seconds: float  # from the first start to the last exit
    batch_ids: list[str]
    cpu_seconds: float
    requests: int  # as each client reported them
    samples: list[tuple[float, dict[str, float]]]  # CPU seconds of each role by then, from the client's start


def _submit_and_wait(settings: Settings, files: list[Path], data_dir: Path, roles: Mapping[int, str]) -> _Waited:
    """Run ``billing submit FILE... --wait`` for every file at once, as a user submits them together; the CPU of
    ``roles`` (pid → role) and of the client sampled meanwhile."""
    references = ["--pricebook", str(data_dir / "pricebook.csv"), "--taxes", str(data_dir / "taxes.csv")]
    env = {**os.environ, **settings.as_env()}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [sys.executable, "-m", "billing", "submit", *map(str, files), "--wait", *references]
    with Sampler() as sampler:
        for pid, role in roles.items():
            sampler.watch(role, pid)
        started, clock = datetime.now(UTC), time.monotonic()
        with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as client:
            sampler.watch(CLIENT, client.pid)
            stdout, stderr = client.communicate()
        seconds = time.monotonic() - clock
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if client.returncode != 0:
        raise RuntimeError(f"billing submit --wait failed ({client.returncode}): {stderr[-2000:]}")
    submitted = re.findall(r"^batch (\S+) submitted \(\w+; (\d+) storage requests\)", stdout, re.MULTILINE)
    if len(submitted) != len(files):
        raise RuntimeError(f"billing submit printed {len(submitted)} batch ids for {len(files)} files: {stdout}")
    return _Waited(
        started=started,
        seconds=seconds,
        batch_ids=[batch_id for batch_id, _ in submitted],
        cpu_seconds=after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        requests=sum(int(requests) for _, requests in submitted),
        samples=[(at - (clock - sampler.began), cpu) for at, cpu in sampler.samples],
    )


#: The client's name among the roles whose CPU the bench reports.
CLIENT = "client (billing submit)"
#: The spans of a batch the bench reports the busy cores of: from the phase before to the phase after (None: the
#: start of `billing submit`, or its exit).
SPANS = (
    ("client checks, hashes", None, "accepted_at"),
    ("client uploads", "accepted_at", "uploaded_at"),
    ("first item cut", "uploaded_at", "first_item_sent_at"),
    ("cut and rated", "first_item_sent_at", "last_item_sent_at"),
    ("last items recorded", "last_item_sent_at", "completed_at"),
    ("seen by --wait", "completed_at", None),
)


def _spans(phases: Mapping[str, float], seconds: float) -> list[tuple[str, float, float]]:
    """The :data:`SPANS` of a run, in seconds since `billing submit` started (``seconds``: when it exited)."""

    def at(phase: str | None, otherwise: float) -> float:
        return otherwise if phase is None else phases.get(phase, otherwise)

    return [(label, at(begin, 0.0), at(end, seconds)) for label, begin, end in SPANS]


def _roles(processes: list[subprocess.Popen[bytes]], stack: AzuriteStack) -> dict[int, str]:
    """Pid → role of the role processes and of Azurite."""
    roles = {
        process.pid: str(process.args[-1] if isinstance(process.args, list) else process.args) for process in processes
    }
    return roles | ({stack.pid: "azurite"} if stack.pid else {})


def _phases(status: BatchStatus, submitted: datetime) -> dict[str, float]:
    """Seconds from the moment ``billing submit`` started to each phase the batch went through."""
    moments = {name: getattr(status, name) for name in PHASES}
    return {name: round((moment - submitted).total_seconds(), 3) for name, moment in moments.items() if moment}


def _cpu(processes: list[subprocess.Popen[bytes]], stack: AzuriteStack) -> dict[str, float]:
    """CPU seconds so far of each role (its rating workers with the processor) and of Azurite."""
    cpu: dict[str, float] = {}
    for process in processes:
        role = process.args[-1] if isinstance(process.args, list) else str(process.args)
        cpu[str(role)] = cpu.get(str(role), 0.0) + tree_cpu_seconds(process.pid)
    cpu["azurite"] = tree_cpu_seconds(stack.pid) if stack.pid else 0.0
    return cpu


def _settled(home: Path, *, roles: int, timeout: float) -> int:
    """Wait until every role runs with no dequeue task (push mode scaled to zero), at most
    ``timeout`` seconds; return the storage requests the roles have made so far."""
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for path in home.glob("state/*.json"):
            with contextlib.suppress(OSError, ValueError):
                states.append(json.loads(path.read_text()))
        listeners = [listener for state in states for listener in state["listeners"]]
        idle = len(states) == roles and all(not t["active_tasks"] and t["idle_polls"] for t in listeners)
        if idle or time.monotonic() >= deadline:
            return sum(int(state["requests"]["total"]) for state in states)
        time.sleep(0.5)


def _batch_file(rows: int, data_dir: Path, console: Console, *, seed: int = 42, messy: bool = False) -> Path:
    """A sample batch of ``rows`` rows (made once, kept in ``data_dir``), and the reference data."""
    data_dir.mkdir(parents=True, exist_ok=True)
    name = f"bench-{rows}" + ("" if seed == 42 else f"-{seed}") + ("-messy" if messy else "")
    batch = data_dir / f"{name}.csv"
    if not batch.exists():
        with console.status(f"generating {rows:,} {'messy ' if messy else ''}rows"):
            partial = batch.with_suffix(".partial")
            generate(rows, partial, seed=seed, messy=messy)
            partial.replace(batch)  # an interrupted run leaves no half file to reuse
    write_price_book(data_dir / "pricebook.csv")
    write_tax_table(data_dir / "taxes.csv")
    return batch


def run(
    *,
    rows: int,
    compare_rows: int,
    idle_seconds: float,
    scaling_rows: int | None,
    data_dir: Path,
    output: Path,
    console: Console,
    repeat: int = 3,
    file: FileKind = DEFAULT_FILE,
    store: StoreKind = DEFAULT_STORE,
) -> BenchReport:
    """Every measurement; prints the tables, writes ``output`` (JSON), the chart next to it (PNG) and
    the large batch's timeline (``<output>-timeline.png``). The large batch runs ``repeat`` times as
    every file and store, interleaved; the median run (by submit → complete) of ``file`` on ``store``
    is the one reported."""
    started = time.monotonic()
    main, main_runs, variants = _main_runs(
        rows, repeat=repeat, data_dir=data_dir, console=console, headline=(file, store), variants=True
    )
    optimised = run_pipeline(compare_rows, data_dir=data_dir, console=console)
    with console.status(f"naive design, {compare_rows:,} transactions"):
        naive = run_pipeline(compare_rows, data_dir=data_dir, console=console, mode="naive")
    listener = listenbench.measure(trials=20, idle_seconds=idle_seconds, console=console)
    scaling = (
        [
            run_pipeline(scaling_rows, data_dir=data_dir, console=console, partitions=p, processors=n)
            for n in SCALING_PROCESSORS
            for p in SCALING_PARTITIONS
        ]
        if scaling_rows
        else []
    )
    report = BenchReport(
        main, main_runs, optimised, naive, listener, scaling, monthly_costs(main, naive, listener), variants
    )
    _print(report, console)
    console.print(_variants(main, main_runs + variants))
    output.write_text(json.dumps(asdict(report), indent=2))
    chart, timeline = output.with_suffix(".png"), output.with_name(f"{output.stem}-timeline.png")
    _chart(report, chart)
    _timeline(main, timeline)
    console.print(f"wrote {output}, {chart} and {timeline} in {time.monotonic() - started:.0f} s")
    return report


def run_main(
    *,
    rows: int,
    repeat: int,
    data_dir: Path,
    output: Path,
    console: Console,
    batches: int = 1,
    file: FileKind = DEFAULT_FILE,
    store: StoreKind = DEFAULT_STORE,
    variants: bool = False,
) -> PipelineRun:
    """Only the large batch (or ``batches`` files of its rows, submitted at once) as ``file`` on
    ``store``, ``repeat`` times (and as the other files and stores, interleaved, with ``variants``):
    its table, CPU per role, JSON (all runs) and timeline."""
    main, main_runs, others = _main_runs(
        rows,
        repeat=repeat,
        data_dir=data_dir,
        console=console,
        batches=batches,
        headline=(file, store),
        variants=variants,
    )
    files = f" in {batches} batches submitted at once" if batches > 1 else ""
    table = Table(
        title=f"{rows:,} transactions{files}, {file} file, Azurite {_STORE_NAMES[store]}, {repeat} runs"
        " (local Azurite + SQLite, this machine)"
    )
    for column in (
        "run",
        "submit → complete s",
        "tx/s",
        "accepted → complete s",
        "requests / 1,000 tx",
        "load (1 min)",
    ):
        table.add_column(column, justify="right")
    for number, run_ in enumerate(main_runs, start=1):
        table.add_row(
            f"{number}{' (median)' if run_ is main else ''}",
            f"{run_.submit_to_complete_seconds:.2f}",
            f"{run_.submit_transactions_per_second:,.0f}",
            f"{run_.latency_seconds:.2f}",
            f"{run_.requests_per_1000:.2f}",
            f"{run_.load_average[0]:.1f}",
        )
    console.print(table)
    if others:
        console.print(_variants(main, main_runs + others))
    console.print(_capacity(main))
    console.print(_busy(main))
    report = {
        "main": asdict(main),
        "main_runs": [asdict(r) for r in main_runs],
        "variants": [asdict(r) for r in others],
    }
    output.write_text(json.dumps(report, indent=2))
    timeline = output.with_name(f"{output.stem}-timeline.png")
    _timeline(main, timeline)
    console.print(f"wrote {output} and {timeline}")
    return main


def _main_runs(
    rows: int,
    *,
    repeat: int,
    data_dir: Path,
    console: Console,
    batches: int = 1,
    headline: tuple[FileKind, StoreKind] = (DEFAULT_FILE, DEFAULT_STORE),
    variants: bool = False,
) -> tuple[PipelineRun, list[PipelineRun], list[PipelineRun]]:
    """The large batch ``repeat`` times as ``headline``'s file and store (and, with ``variants``, as every
    other file and store, one run of each in turn): the median headline run by submit → complete, all
    headline runs, and the other runs."""
    kinds = [headline] + ([(f, s) for f in FILES for s in STORES if (f, s) != headline] if variants else [])
    runs: list[PipelineRun] = []
    for attempt in range(repeat):
        for file, store in kinds:
            with console.status(f"{rows:,} transactions, {file} file, {store} Azurite, run {attempt + 1} of {repeat}"):
                runs.append(
                    run_pipeline(rows, data_dir=data_dir, console=console, batches=batches, file=file, store=store)
                )
    mine = [r for r in runs if (r.file, r.store) == headline]
    return median_run(mine), mine, [r for r in runs if (r.file, r.store) != headline]


def median_run(runs: list[PipelineRun]) -> PipelineRun:
    """The median run by submit → complete (the lower middle one of an even number)."""
    return sorted(runs, key=lambda r: r.submit_to_complete_seconds)[(len(runs) - 1) // 2]


_STORE_NAMES: dict[str, str] = {"memory": "in memory", "disk": "persisted"}


def _variants(headline: PipelineRun, runs: list[PipelineRun]) -> Table:
    """Submit → complete of each file and store (median, and every run), and whether all billed the same."""
    table = Table(title=f"{headline.rows:,} transactions: each file on each Azurite (submit → complete s)")
    for column in ("file", "Azurite", "median", "runs", "same aggregates as the headline"):
        table.add_column(column, justify="left" if column in ("file", "Azurite") else "right")
    for file in FILES:
        for store in STORES:
            mine = [r for r in runs if (r.file, r.store) == (file, store)]
            if not mine:
                continue
            median = median_run(mine)
            star = " (headline)" if (file, store) == (headline.file, headline.store) else ""
            table.add_row(
                file + star,
                _STORE_NAMES[store],
                f"{median.submit_to_complete_seconds:.2f}",
                ", ".join(f"{r.submit_to_complete_seconds:.2f}" for r in mine),
                "yes" if all(r.aggregates_sha256 == headline.aggregates_sha256 for r in mine) else "NO",
            )
    return table


def _print(report: BenchReport, console: Console) -> None:
    table = Table(title="Benchmark (local Azurite + SQLite, this machine)")
    table.add_column("measure")
    for run_ in (report.main, report.optimised, report.naive):
        table.add_column(f"{run_.mode}, {run_.rows:,} tx", justify="right")
    runs = (report.main, report.optimised, report.naive)
    rows: list[tuple[str, list[str]]] = [
        ("submit → complete s (`billing submit --wait`)", [f"{r.submit_to_complete_seconds:.1f}" for r in runs]),
        ("transactions / s (submit → complete)", [f"{r.submit_transactions_per_second:,.0f}" for r in runs]),
        ("accepted → complete s (batch status)", [f"{r.latency_seconds:.1f}" for r in runs]),
        ("transactions / s (accepted → complete)", [f"{r.transactions_per_second:,.0f}" for r in runs]),
        ("storage requests", [f"{r.storage_requests:,}" for r in runs]),
        ("storage requests / 1,000 tx", [f"{r.requests_per_1000:,.2f}" for r in runs]),
        ("  the batch's own (submit → idle again)", [f"{r.work_requests_per_1000:,.2f}" for r in runs]),
        ("  attributed to it (billing status)", [f"{r.attributed_requests_per_1000 or 0:,.2f}" for r in runs]),
        ("peak RSS MiB", [", ".join(f"{k} {v:.0f}" for k, v in r.peak_rss_mib.items()) for r in runs]),
    ]
    idle = report.listener.idle_requests_per_hour
    rows.append(
        (
            "idle requests / hour / processor",
            [
                f"{idle['push (local bus)']:,.0f} (push)",
                f"{idle['pull (back-off to 10 s)']:,.0f} (pull)",
                f"{idle['naive 1 s polling']:,.0f}",
            ],
        )
    )
    wake = report.listener.wake_latency_ms
    rows.append(
        (
            "trigger wake-up latency ms (p50 / p95)",
            [", ".join(f"{b} {w['p50']:.0f}/{w['p95']:.0f}" for b, w in wake.items()), "", "none (polls)"],
        )
    )
    optimised, naive = (report.monthly_cost[design]["monthly_storage_cost"] for design in ("optimised", "naive"))
    for name in optimised:
        rows.append(
            (f"storage $/month at 10 M tx/day, {name}", [f"${optimised[name]:,.2f}", "", f"${naive[name]:,.2f}"])
        )
    for label, values in rows:
        table.add_row(label, *values)
    console.print(table)
    if len(report.main_runs) > 1:
        each = ", ".join(f"{r.submit_to_complete_seconds:.1f}" for r in report.main_runs)
        console.print(
            f"{report.main.rows:,} transactions, submit → complete over {len(report.main_runs)} runs: {each} s"
        )
    console.print(_capacity(report.main))
    ratio = report.naive.work_requests_per_1000 / report.optimised.work_requests_per_1000
    console.print(f"on the same batch the naive design makes {ratio:,.0f}× the storage requests per transaction")
    if report.scaling:
        curve = Table(title=f"Scaling: transactions / s, {report.scaling[0].rows:,} tx")
        curve.add_column("processors \\ partitions")
        for p in SCALING_PARTITIONS:
            curve.add_column(str(p), justify="right")
        for n in SCALING_PROCESSORS:
            curve.add_row(str(n), *(f"{r.transactions_per_second:,.0f}" for r in report.scaling if r.processors == n))
        console.print(curve)


def capacity(run: PipelineRun) -> dict[str, dict[str, float]]:
    """Per role: CPU seconds per 1,000,000 transactions, and the cores it needs for each target rate."""
    table = {}
    for role, seconds in run.cpu_seconds.items():
        per_million = seconds * 1_000_000 / max(1, run.accepted)
        table[role] = {"cpu_seconds_per_million": round(per_million, 2)} | {
            f"cores_at_{target}": round(per_million * target / 1_000_000, 1) for target in CAPACITY_TARGETS
        }
    return table


def _capacity(run: PipelineRun) -> Table:
    table = Table(title=f"CPU per role ({run.rows:,} transactions) and the cores each needs for a target rate")
    table.add_column("role")
    table.add_column("CPU s", justify="right")
    table.add_column("CPU s / 1 M tx", justify="right")
    for target in CAPACITY_TARGETS:
        table.add_column(f"cores at {target:,} tx/s", justify="right")
    for role, figures in sorted(capacity(run).items(), key=lambda item: -item[1]["cpu_seconds_per_million"]):
        cores = [f"{figures[f'cores_at_{target}']:,.1f}" for target in CAPACITY_TARGETS]
        table.add_row(role, f"{run.cpu_seconds[role]:.1f}", f"{figures['cpu_seconds_per_million']:.2f}", *cores)
    return table


def _busy(run: PipelineRun) -> Table:
    """The critical path: per span of the batch, the cores each role kept busy (1.0: one core all the time)."""
    roles = sorted({role for span in run.busy for role in span["cores"]}, key=lambda r: -run.cpu_seconds.get(r, 0.0))
    table = Table(title=f"Where the time went ({run.rows:,} transactions): cores busy per role, span by span")
    table.add_column("span")
    table.add_column("seconds", justify="right")
    for role in roles:
        table.add_column("client" if role == CLIENT else role, justify="right")
    table.add_column("busiest")
    for span in run.busy:
        cores = span["cores"]
        busiest = max(cores, key=lambda role: cores[role]) if cores else ""
        busiest = "client" if busiest == CLIENT else busiest
        seconds = f"{span['from']:.1f}–{span['to']:.1f}"
        table.add_row(span["span"], seconds, *(f"{cores.get(role, 0.0):.2f}" for role in roles), busiest)
    return table


def _timeline(run: PipelineRun, path: Path) -> None:
    """One batch's phases as bars per role, in seconds from the start of ``billing submit``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = run.phases
    done = p["completed_at"]
    spans = [
        ("client: check, hash, upload", 0.0, p.get("uploaded_at", p["accepted_at"])),
        ("initiator: read, mark repeats, send", p.get("uploaded_at", p["accepted_at"]), p.get("debatched_at", done)),
        ("processors and controller: read, validate, rate, record", p.get("first_item_sent_at", done), done),
        ("billing submit --wait (what the user waits)", 0.0, run.submit_to_complete_seconds),
    ]
    figure, axes = plt.subplots(figsize=(10, 3))
    for row, (_, begin, end) in enumerate(reversed(spans)):
        axes.barh(row, end - begin, left=begin, color=f"C{row}")
        axes.text(end, row, f" {end:.1f} s", va="center")
    axes.set_yticks(range(len(spans)), [label for label, _, _ in reversed(spans)])
    axes.set_xlabel("seconds since `billing submit` started")
    axes.set_title(f"{run.accepted:,} transactions, submit → complete {run.submit_to_complete_seconds:.1f} s")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _chart(report: BenchReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(14, 4))
    names = ["optimised", "naive"]
    left.bar(
        names,
        [report.optimised.work_requests_per_1000, report.naive.work_requests_per_1000],
        color=["tab:green", "tab:red"],
    )
    left.set_yscale("log")
    left.set_title("storage requests per 1,000 transactions")
    idle = report.listener.idle_requests_per_hour
    right.bar(
        ["push", "pull", "naive"],
        [idle["push (local bus)"], idle["pull (back-off to 10 s)"], idle["naive 1 s polling"]],
        color=["tab:green", "tab:blue", "tab:red"],
    )
    right.set_yscale("log")
    right.set_title("idle requests per hour per processor")
    today = next(iter(report.monthly_cost["optimised"]["monthly_storage_cost"]))
    middle.bar(
        names, [report.monthly_cost[n]["monthly_storage_cost"][today] for n in names], color=["tab:green", "tab:red"]
    )
    middle.set_yscale("log")
    middle.set_title(f"storage $/month at 10 M tx/day ({today})")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
