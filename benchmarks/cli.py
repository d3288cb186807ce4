"""``billing bench``, ``bench-listener``, ``bench-recovery``, ``bench-celery``, ``bench-ledger`` and ``soak``: the
benchmarks' commands, which :mod:`billing.cli` adds to ``billing`` where this package is installed. As there,
defining them imports only click and rich: each command imports its benchmark when it runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from shared.roles import ROLES

if TYPE_CHECKING:
    from .pipeline import FileKind, StoreKind
    from .soak import StoreKind as SoakStoreKind

console = Console(stderr=True)

#: Idle polls of a pull-mode processor at its cap that the idle window must span for its count to mean anything.
IDLE_POLLS = 3


def _idle_window(ctx: click.Context, param: click.Parameter, seconds: float) -> float:
    """Refuse an idle window too short to count pull's polls (it could count none, and rank pull below push)."""
    from shared.settings import Settings

    cap = Settings().max_idle_interval
    if seconds < IDLE_POLLS * cap:
        raise click.BadParameter(
            f"{seconds:g} s spans fewer than {IDLE_POLLS} idle polls; at least {IDLE_POLLS * cap:g} s"
            f" ({IDLE_POLLS} × BILLING_MAX_IDLE_INTERVAL, {cap:g} s)"
        )
    return seconds


@click.command("bench-listener")
@click.option("--trials", default=50, show_default=True, help="Trigger wake-ups timed per backend.")
@click.option(
    "--idle-seconds", default=60.0, show_default=True, callback=_idle_window, help="Idle window measured per mode."
)
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("bench-listener.json"))
def bench_listener_command(trials: int, idle_seconds: float, output: Path) -> None:
    """Measure trigger wake-up latency, idle requests per hour and scaling of the listener."""
    from . import listener

    listener.run(trials=trials, idle_seconds=idle_seconds, output=output, console=console)


@click.command("bench-recovery")
@click.option("--rows", default=300_000, show_default=True, help="Transactions in the batch.")
@click.option("--role", "roles", type=click.Choice(ROLES), multiple=True, help="Role to kill (default: each in turn).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".billing/bench-data"))
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("bench-recovery.json"))
def bench_recovery_command(rows: int, roles: tuple[str, ...], data_dir: Path, output: Path) -> None:
    """Kill each role while it holds its messages, restart it 1 s later: seconds from the kill to the batch complete."""
    from . import recovery

    recovery.run(rows=rows, roles=roles or ROLES, data_dir=data_dir, output=output, console=console)


@click.command("bench-celery")
@click.option("--rows", default=1_000_000, show_default=True, help="Rows of the messy batch file.")
@click.option(
    "--chunk-rows", type=click.IntRange(1), multiple=True, help="Rows per Celery task (repeatable) [default: 2000]."
)
@click.option("--repeat", type=click.IntRange(1), default=3, show_default=True, help="Runs of each chunk size.")
@click.option("--count-requests", is_flag=True, help="One more run, untimed, counting requests in Azurite's log.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".billing/bench-data"))
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("bench-celery.json"))
def bench_celery_command(
    rows: int, chunk_rows: tuple[int, ...], repeat: int, count_requests: bool, data_dir: Path, output: Path
) -> None:
    """The batch done with Celery (kombu's Azure Storage Queues broker, prefork workers): submit → complete,
    CPU, requests; exit 1 unless it bills exactly as the reference model."""
    try:
        from . import celery_baseline  # Celery and kombu: the optional `bench` dependencies
    except ImportError as exc:
        raise click.ClickException(f"{exc}: install the benchmarks with `pip install -e '.[bench]'`") from exc
    try:
        report = celery_baseline.run(
            rows=rows,
            chunk_rows=chunk_rows or (2000,),
            repeat=repeat,
            data_dir=data_dir,
            output=output,
            console=console,
            count_requests=count_requests,
        )
    except celery_baseline.ChunkTooLarge as exc:
        raise click.BadParameter(str(exc), param_hint="--chunk-rows") from None
    if not report.exact:
        raise click.ClickException("the Celery baseline did not bill as the reference model: see the table above")


@click.command("bench-ledger")
@click.option("--store", type=click.Choice(["sqlite", "postgresql"]), default="sqlite", show_default=True)
@click.option("--rows", default=1_000_000, show_default=True, help="Transactions in the batch.")
@click.option("--ledger-ids", default=50_000_000, show_default=True, help="Ids in the large ledger.")
@click.option("--filter-bits", default=1 << 30, show_default=True, help="The id filter's size (a power of two).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".billing/bench-data"))
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("bench-ledger.json"))
def bench_ledger_command(
    store: str, rows: int, ledger_ids: int, filter_bits: int, data_dir: Path, output: Path
) -> None:
    """Time a batch through the roles on an empty ledger, one of --ledger-ids ids and an empty one again (JSON)."""
    from . import ledger

    ledger.run(
        store=store,
        rows=rows,
        ledger_ids=ledger_ids,
        bits=filter_bits,
        data_dir=data_dir,
        output=output,
        console=console,
    )


@click.command("soak")
@click.option("--minutes", type=click.FloatRange(min=0.5), default=60.0, show_default=True, help="Load and faults.")
@click.option("--store", type=click.Choice(["sqlite", "postgresql"]), default="sqlite", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--min-batches",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Go on past --minutes until this many batches were submitted (at most 3 times as long).",
)
@click.option(
    "--batches-per-minute",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Submit new batches no faster than this (default: back to back, two to three in flight).",
)
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("soak.json"))
def soak_command(
    minutes: float,
    store: SoakStoreKind,
    seed: int,
    min_batches: int,
    batches_per_minute: float | None,
    output: Path,
) -> None:
    """Batches under random faults, then every batch checked exactly (JSON + PNG); exit 1 if not."""
    from . import soak

    report = soak.run(
        minutes=minutes,
        store=store,
        seed=seed,
        output=output,
        console=console,
        min_batches=min_batches,
        batches_per_minute=batches_per_minute,
    )
    if not report.ok:
        sys.exit(1)


@click.command("bench")
@click.option("--rows", type=int, default=1_000_000, show_default=True, help="The large batch (optimised pipeline).")
@click.option("--compare-rows", type=int, default=5_000, show_default=True, help="The batch run through both designs.")
@click.option(
    "--idle-seconds",
    type=float,
    default=60.0,
    show_default=True,
    callback=_idle_window,
    help="Idle window measured per mode.",
)
@click.option("--scaling-rows", type=int, help="Also measure partitions 1/2/4/8 × processors 1/2/3 with this batch.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".billing/bench-data"))
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("bench-results.json"))
@click.option(
    "--repeat",
    type=click.IntRange(1),
    help="Runs of the large batch (median) [default: 3; with --scale-out 1 per processor count].",
)
@click.option("--main-only", is_flag=True, help="Only the large batch: no naive design, listener or scaling runs.")
@click.option(
    "--batches",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="With --main-only: split into files sent at once.",
)
@click.option(
    "--file",
    "file_kind",
    type=click.Choice(["clean", "messy"]),
    default="messy",
    show_default=True,
    help="The large batch as a clean file, or as a real export writes it (quoted fields, padding, a notes column).",
)
@click.option(
    "--store",
    type=click.Choice(["memory", "disk"]),
    default="disk",
    show_default=True,
    help="Azurite held in memory, or persisted to disk as `billing up` runs it.",
)
@click.option(
    "--variants", is_flag=True, help="With --main-only: time the other files and stores too (always without it)."
)
@click.option(
    "--scale-out",
    is_flag=True,
    help="Only the scale-out curve: the large batch through 1, 2, 4 processors, each in a CPU cgroup (root).",
)
@click.option(
    "--processors",
    default="1,2,4",
    show_default=True,
    help="With --scale-out: the processor counts, comma-separated.",
)
@click.option(
    "--cap",
    type=click.FloatRange(min=0),
    default=0.15,
    show_default=True,
    help="With --scale-out: cores each processor and its rating workers may use (0: uncapped).",
)
@click.option(
    "--workers-per-processor",
    type=click.IntRange(min=1),
    help="With --scale-out: rating workers each processor runs (default: as many as its cores; no cgroup needed).",
)
def bench_command(
    rows: int,
    compare_rows: int,
    idle_seconds: float,
    scaling_rows: int | None,
    data_dir: Path,
    output: Path,
    repeat: int | None,
    main_only: bool,
    batches: int,
    file_kind: FileKind,
    store: StoreKind,
    variants: bool,
    scale_out: bool,
    processors: str,
    cap: float,
    workers_per_processor: int | None,
) -> None:
    """Measure the pipeline against the naive design: submit → complete, throughput, CPU per role,
    requests, idle cost, memory (JSON + PNG charts). The large batch's headline is --file on --store
    (the user's default: a messy file on persisted Azurite). --scale-out writes <output>-scaleout.json."""
    if scale_out:
        try:
            counts = tuple(sorted({int(n) for n in processors.split(",")}))
        except ValueError:
            raise click.BadParameter(f"not a list of counts: {processors!r}", param_hint="--processors") from None
        if not counts or counts[0] < 1:
            raise click.BadParameter("counts start at 1", param_hint="--processors")
        from . import scaleout

        try:
            report = scaleout.run(
                rows=rows,
                data_dir=data_dir,
                output=output.with_name(f"{output.stem}-scaleout.json"),
                console=console,
                cap=cap,
                processors=counts,
                repeat=repeat or 1,
                file=file_kind,
                store=store,
                workers_per_processor=workers_per_processor,
            )
        except scaleout.CgroupUnavailable as exc:
            raise click.ClickException(str(exc)) from None
        if not report.exact:
            raise click.ClickException("the runs did not bill the same: see the table above")
        return
    from . import pipeline

    if main_only:
        pipeline.run_main(
            rows=rows,
            repeat=repeat or 3,
            data_dir=data_dir,
            output=output,
            console=console,
            batches=batches,
            file=file_kind,
            store=store,
            variants=variants,
        )
        return
    pipeline.run(
        repeat=repeat or 3,
        rows=rows,
        compare_rows=compare_rows,
        idle_seconds=idle_seconds,
        scaling_rows=scaling_rows,
        data_dir=data_dir,
        output=output,
        console=console,
        file=file_kind,
        store=store,
    )


COMMANDS: tuple[click.Command, ...] = (
    bench_command,
    bench_listener_command,
    bench_recovery_command,
    bench_celery_command,
    bench_ledger_command,
    soak_command,
)
