"""``billing``: the command line over the pipeline (thin: parse, then delegate).

Defining the commands imports only click, rich and light modules: each command imports what it needs (the
storage SDKs, Arrow, SQLAlchemy, the roles, pandas, FastAPI) when it runs. ``billing --help`` and a refused
argument answer at once, and ``billing submit`` loads only what submitting uses
(``tests/unit/test_cli_imports.py`` holds this)."""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import sys
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import click
from rich.console import Console
from rich.markup import escape

from shared.errors import BillingError, InfrastructureError
from shared.localstack import AzuriteStack, resolve
from shared.logs import configure_logging, redact
from shared.roles import ROLES

from . import cost, ledger
from .sql import open_store

if TYPE_CHECKING:
    from shared.messaging.poison import Action as PoisonAction
    from shared.settings import Settings

    from . import client, reports

console = Console(stderr=True)


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def cli(verbose: bool) -> None:
    """A queue-based billing pipeline on Azure Storage (Azurite locally) and SQL."""
    configure_logging(verbose)


@cli.command()
def up() -> None:
    """Start the local stack (Azurite) under BILLING_HOME; idempotent."""
    from shared.settings import Settings

    settings = Settings()
    connection = AzuriteStack(home=settings.home).start()
    click.echo(f"BILLING_HOME={settings.home}")
    click.echo(f"BILLING_STORAGE_CONNECTION_STRING={redact(connection)}")
    click.echo(f"BILLING_SQL_URL={redact(settings.sql_url_value)}")
    click.echo("Other billing commands with the same BILLING_HOME use this stack.")


@cli.command()
def down() -> None:
    """Stop the local stack; idempotent."""
    from shared.settings import Settings

    AzuriteStack(home=Settings().home).stop()
    click.echo("local stack stopped")


def _role_command(role: str) -> click.Command:
    @click.option("--burst", is_flag=True, help="Drain what is queued, then exit.")
    @click.option("--partitions", type=int, help="Number of input queues (BILLING_PARTITIONS).")
    def command(burst: bool, partitions: int | None) -> None:
        from shared.roles import start  # the role's own entry: imports the role only now

        start(role, burst=burst, partitions=partitions)

    command.__doc__ = f"Run the {role} until SIGINT/SIGTERM (or drained, with --burst)."
    return click.command(role)(command)


for _role in (*ROLES, "syphon"):
    cli.add_command(_role_command(_role))


@cli.command()
@click.option(
    "--manifests",
    type=click.Path(exists=True, path_type=Path),
    required=True,
    help="KEDA ScaledObjects and the roles' Deployments: a file, a folder, or a kustomization (e.g. "
    "deploy/kubernetes/overlays/local).",
)
@click.option("--polling-interval", type=float, help="Seconds between polls, for every ScaledObject.")
@click.option("--cooldown-period", type=float, help="Seconds idle before scaling to zero, for every ScaledObject.")
@click.option("--events", type=click.Path(dir_okay=False, path_type=Path), help="Append each decision as JSON.")
def autoscale(
    manifests: Path, polling_interval: float | None, cooldown_period: float | None, events: Path | None
) -> None:
    """Scale local role processes on queue depth as KEDA scales the manifests' Deployments, until SIGINT/SIGTERM."""
    from . import autoscale as scaler

    settings = resolve()
    rules = scaler.retimed(
        scaler.scale_rules(scaler.read_manifests(manifests)), polling=polling_interval, cooldown=cooldown_period
    )
    asyncio.run(scaler.run(rules, settings, log_dir=settings.home / "logs", events=events))


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--batch-id", help="Batch id (default: SHA-256 of the file); with one file only.")
@click.option("--pricebook", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--taxes", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--wait", is_flag=True, help="Block until the batches are complete and print their summaries.")
@click.option("--timeout", type=float, help="With --wait: give up after this many seconds.")
def submit(
    files: tuple[Path, ...],
    batch_id: str | None,
    pricebook: Path | None,
    taxes: Path | None,
    wait: bool,
    timeout: float | None,
) -> None:
    """Submit batch files (CSV, JSON Lines or Parquet), each a batch of its own, all at once.

    A file refused is reported on a line of its own (exit status 2 at the end); the others go on."""
    if batch_id is not None and len(files) > 1:
        raise click.UsageError("--batch-id names one batch: give it with one file")
    from shared import telemetry

    settings = resolve()
    with telemetry.running("client"):  # exported when configured: the root span of each batch's trace
        outcomes = asyncio.run(_submit_all(settings, files, batch_id=batch_id, pricebook=pricebook, taxes=taxes))
    submitted: list[str] = []  # and those submitted before: --wait waits for them too
    for file, outcome in zip(files, outcomes, strict=True):
        if isinstance(outcome, BillingError):
            console.print("[red]error:[/red]", escape(f"{file.name}: {redact(str(outcome))}"), soft_wrap=True)
            continue
        if outcome.duplicate:
            click.echo(f"batch {outcome.batch_id} was already submitted; nothing changed")
        else:
            requests = outcome.requests["total"]
            click.echo(f"batch {outcome.batch_id} submitted ({outcome.fmt}; {requests} storage requests)")
        submitted.append(outcome.batch_id)
    incomplete = False
    if wait and submitted:
        from store import BatchState  # SQLAlchemy, only now: the batches are already on their way

        from . import progress, unbilled

        watch = unbilled.RequestWatch(settings, submitted, console)
        try:
            with open_store(settings) as store:
                statuses = progress.wait_with_progress(store, submitted, console=console, timeout=timeout, watch=watch)
        except InfrastructureError as exc:
            follow = " ".join(f"`billing status {batch_id}`" for batch_id in submitted)
            raise click.ClickException(f"{exc}; submitted, the batches go on: follow them with {follow}") from exc
        for status in statuses:
            progress.print_summary(status)
        incomplete = any(status.state != BatchState.complete for status in statuses)
    if len(submitted) < len(files):
        sys.exit(2)
    if incomplete:
        sys.exit(1)


async def _submit_all(
    settings: Settings, files: tuple[Path, ...], **options: Any
) -> list[client.Submission | BillingError]:
    """Every file's submission at once: its outcome, or why it was refused (anything else is raised)."""
    from . import client

    submissions = (client.submit(settings, file, **options) for file in files)
    outcomes = await asyncio.gather(*submissions, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, BillingError):
            raise outcome
    return cast("list[client.Submission | BillingError]", outcomes)


@cli.command()
@click.argument("batch_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(batch_id: str | None, as_json: bool) -> None:
    """Show one batch's state, or every batch, the files in the inbox that no batch accounts for (with their
    age), the running roles (dequeue tasks, storage requests, failover state per destination) and, with a
    secondary account, its backlog."""
    from shared.messaging.processes import role_states
    from shared.settings import Settings

    from . import unbilled

    settings = Settings()
    with open_store(settings) as store:
        found = [store.batch(batch_id)] if batch_id else store.batches()
        waiting = [] if batch_id else unbilled.unbilled(resolve(settings), store)
    if batch_id and found[0] is None:
        raise click.ClickException(
            f"batch {batch_id} is unknown (not yet debatched, or never submitted; `billing status` lists files "
            "that sit unbilled)"
        )
    rows = [s.to_json_dict() for s in found if s is not None]
    if batch_id:
        click.echo(json.dumps(rows[0], indent=2) if as_json else _status_line(rows[0]))
        return
    roles = role_states(settings)
    backlog = asyncio.run(_backlog(resolve(settings))) if settings.has_secondary else {}
    if as_json:
        click.echo(
            json.dumps(
                {"batches": rows, "unbilled": unbilled.as_json(waiting), "roles": roles, "backlog": backlog}, indent=2
            )
        )
        return
    for row in rows:
        click.echo(_status_line(row))
    unbilled.echo(waiting)
    for state in roles:
        tasks = sum(listener["active_tasks"] for listener in state["listeners"])
        click.echo(f"{state['role']} pid={state['pid']} dequeue_tasks={tasks} storage_requests={state['requests']}")
        for destination, route in state["failover"].items():
            click.echo(
                f"  {destination}: {route['health']} "
                f"(failovers={route['failovers']}, sent to backlog={route['backlog_sent']})"
            )
    for queue, depth in backlog.items():
        click.echo(f"backlog {queue}: {depth} message(s)")


def _status_line(row: dict[str, Any]) -> str:
    """A batch's status as ``key=value`` pairs; a mapping (late rows per period) as ``2026-03:12,2026-04:3``; why it
    stalled, if it did, on a line of its own."""

    def text(value: object) -> object:
        if isinstance(value, dict):
            return ",".join(f"{key}:{count}" for key, count in sorted(value.items())) or "none"
        return value

    line = " ".join(f"{key}={text(value)}" for key, value in row.items() if key != "stalled")
    return line + (f"\n  stalled: {row['stalled']}" if row.get("stalled") else "")


async def _backlog(settings: Settings) -> dict[str, int]:
    from shared.messaging.storage import Storage
    from shared.messaging.syphon import backlog_depths

    async with Storage(settings) as storage:
        return await backlog_depths(storage)


@cli.command()
@click.argument("kind", type=click.Choice(["aggregates", "invoices", "rejects"]))
@click.option("--batch", "batch_ids", multiple=True, help="Only these batches, whatever their state (repeatable).")
@click.option("--period", help="Billing period YYYY-MM.")
@click.option("--account", "accounts", multiple=True, help="Only these accounts (repeatable).")
@click.option("--product", "products", multiple=True, help="Only these products (repeatable).")
@click.option("--currency", "currencies", multiple=True, help="Only these currencies (repeatable).")
@click.option("--from", "start", type=click.DateTime(["%Y-%m-%d"]), help="First billing day (UTC), inclusive.")
@click.option("--to", "end", type=click.DateTime(["%Y-%m-%d"]), help="Last billing day (UTC), inclusive.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "parquet", "html"]), default="table")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path))
def report(
    kind: str,
    batch_ids: tuple[str, ...],
    period: str | None,
    accounts: tuple[str, ...],
    products: tuple[str, ...],
    currencies: tuple[str, ...],
    start: datetime | None,
    end: datetime | None,
    fmt: str,
    output: Path | None,
) -> None:
    """Print or write a report: of one batch (--batch ID), or summed over every complete batch (or the
    batches named) under the filters. net, tax and total are exact integers in minor units (cents for USD) in
    csv, json and parquet; table and html (one self-contained file, with charts) show currency units. Invoices of
    a closed --period also name the pending difference (what the next close would issue)."""
    from shared.settings import Settings
    from store import Filters

    from . import reports  # pandas and the report writers: only for the commands that report

    try:
        filters = Filters(accounts, products, currencies, batch_ids, start and start.date(), end and end.date(), period)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--period") from exc
    one_batch = batch_ids[0] if len(batch_ids) == 1 and filters == Filters(batches=batch_ids) else None
    settings = Settings()
    with open_store(settings) as store:
        frame = getattr(reports, kind)(store, one_batch or filters)
        pending = (
            ledger.pending_report(store, period, accounts, currencies)
            if kind == "invoices" and period and not batch_ids
            else []
        )
    if fmt == "html":
        from .console import render  # Jinja2 and the charts: only for HTML

        text: str | None = render.report_file(kind, frame, filters, output)
    else:
        text = reports.write_report(frame, cast("reports.Format", fmt), output)
    if text is not None:
        click.echo(text)
    if one_batch is None and kind != "rejects":
        included = ", ".join(b.batch_id for b in frame.attrs["batches"]) or "none"
        console.print(f"batches included: {escape(included)}", soft_wrap=True)
        for batch in frame.attrs["excluded"]:
            console.print(f"batch excluded ({batch.state}): {escape(batch.batch_id)}", soft_wrap=True)
    for line in pending:
        console.print(escape(line), soft_wrap=True, highlight=False)


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback only by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
def serve(host: str, port: int) -> None:
    """Serve the read-only JSON API (/api, OpenAPI at /openapi.json) and the console (/batches, /invoices,
    /roles, /poison). Money in the API is exact integers in minor units. Poison replay and purge in the
    console need BILLING_CONSOLE_TOKEN; without it the console is read-only."""
    from .console.app import serve as run_server  # FastAPI and uvicorn: only for this command

    run_server(resolve(), host=host, port=port)


@cli.group("poison")
def poison_group() -> None:
    """Inspect, replay and purge messages that could not be processed."""


def _poison_targets(
    ids: tuple[str, ...], queue: str | None, every: bool
) -> tuple[Settings, list[str], list[str] | None]:
    settings = resolve()
    if not ids and not every:
        raise click.UsageError("name entry or message ids, or pass --all")
    return settings, [queue] if queue else settings.all_queues, list(ids) or None


@poison_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def poison_list(as_json: bool) -> None:
    """Per queue: how many messages were poisoned, and the first ones with their reasons."""
    from . import poison

    found = asyncio.run(poison.overview(resolve()))
    if as_json:
        click.echo(
            json.dumps(
                [{"queue": q, "count": n, "entries": [asdict(e) for e in entries]} for q, n, entries in found], indent=2
            )
        )
    else:
        poison.print_overview(found, Console())


def _poison_action(action: PoisonAction, verb: str) -> click.Command:
    @click.argument("ids", nargs=-1)
    @click.option("--queue", help="Only this pipeline queue (default: all of them).")
    @click.option("--all", "every", is_flag=True, help="Every entry of the chosen queues.")
    def command(ids: tuple[str, ...], queue: str | None, every: bool) -> None:
        from . import poison

        settings, queues, chosen = _poison_targets(ids, queue, every)
        entries = asyncio.run(poison.act(settings, action, queues=queues, ids=chosen))
        if action == "show":
            click.echo(json.dumps([asdict(e) for e in entries], indent=2))
        else:
            click.echo(f"{verb} {len(entries)} poisoned message(s)")
            for entry in entries:
                click.echo(f"  {entry.queue} {entry.message_id}: {entry.reason}")
        if ids and not entries:
            raise click.ClickException("no poisoned message has those ids")

    command.__doc__ = {
        "show": "Print entries (by entry id or original message id) in full, as JSON.",
        "replay": "Send entries back to the queue they came from (after fixing the cause), then remove them.",
        "purge": "Remove entries for good.",
    }[action]
    return poison_group.command(action)(command)


_POISON_ACTIONS: tuple[tuple[PoisonAction, str], ...] = (
    ("show", "showed"),
    ("replay", "replayed"),
    ("purge", "purged"),
)
for _action, _verb in _POISON_ACTIONS:
    _poison_action(_action, _verb)


@cli.command("generate")
@click.option("--rows", type=int, required=True)
@click.option("--seed", type=int, default=0)
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl", "parquet"]), default="csv")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
def generate_command(rows: int, seed: int, fmt: str, out: Path) -> None:
    """Generate a sample batch file."""
    from billing.sample import generate

    generate(rows, out, seed=seed, fmt=fmt)
    click.echo(f"wrote {rows} rows to {out}")


ledger.add_commands(cli)  # reference, void, close, documents


@cli.command("resubmit")
@click.argument("batch_id")
def resubmit_command(batch_id: str) -> None:
    """Send again the request of a batch whose file sits in the inbox and that no batch accounts for (`billing
    status` lists them). A batch already accounted for, or without a file in the inbox, is refused."""
    from . import unbilled

    unbilled.resubmit(batch_id)


@cli.command("demo")
@click.option("--rows", type=int, default=200_000, show_default=True)
@click.option("--seed", type=int, default=1)
def demo_command(rows: int, seed: int) -> None:
    """Run the whole pipeline locally on a sample batch and print the results."""
    from . import demo  # the reports it prints load pandas

    demo.run(rows=rows, seed=seed, console=console)


def _benchmark(name: str) -> ModuleType:
    """A module of the ``benchmarks`` package, which needs the optional ``bench`` dependencies."""
    try:
        return importlib.import_module(f"benchmarks.{name}")
    except ImportError as exc:
        raise click.ClickException(f"{exc}: install the benchmarks with `pip install -e '.[bench]'`") from exc


@cli.command("bench-listener")
@click.option("--trials", default=50, show_default=True, help="Trigger wake-ups timed per backend.")
@click.option("--idle-seconds", default=60.0, show_default=True, help="Idle window measured per mode.")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("bench-listener.json"))
def bench_listener_command(trials: int, idle_seconds: float, output: Path) -> None:
    """Measure trigger wake-up latency, idle requests per hour and scaling of the listener."""
    _benchmark("listener").run(trials=trials, idle_seconds=idle_seconds, output=output, console=console)


@cli.command("bench-recovery")
@click.option("--rows", default=300_000, show_default=True, help="Transactions in the batch.")
@click.option("--role", "roles", type=click.Choice(ROLES), multiple=True, help="Role to kill (default: each in turn).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".billing/bench-data"))
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("bench-recovery.json"))
def bench_recovery_command(rows: int, roles: tuple[str, ...], data_dir: Path, output: Path) -> None:
    """Kill each role while it holds its messages, restart it 1 s later: seconds from the kill to the batch complete."""
    _benchmark("recovery").run(rows=rows, roles=roles or ROLES, data_dir=data_dir, output=output, console=console)


@cli.command("bench-celery")
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
    bench = _benchmark("celery_baseline")
    try:
        report = bench.run(
            rows=rows,
            chunk_rows=chunk_rows or (2000,),
            repeat=repeat,
            data_dir=data_dir,
            output=output,
            console=console,
            count_requests=count_requests,
        )
    except bench.ChunkTooLarge as exc:
        raise click.BadParameter(str(exc), param_hint="--chunk-rows") from None
    if not report.exact:
        raise click.ClickException("the Celery baseline did not bill as the reference model: see the table above")


@cli.command("bench-ledger")
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
    _benchmark("ledger").run(
        store=store,
        rows=rows,
        ledger_ids=ledger_ids,
        bits=filter_bits,
        data_dir=data_dir,
        output=output,
        console=console,
    )


@cli.command("soak")
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
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("soak.json"))
def soak_command(minutes: float, store: Any, seed: int, min_batches: int, output: Path) -> None:
    """Batches back to back under random faults, then every batch checked exactly (JSON + PNG); exit 1 if not."""
    soak = _benchmark("soak")
    if not soak.run(
        minutes=minutes, store=store, seed=seed, output=output, console=console, min_batches=min_batches
    ).ok:
        sys.exit(1)


@cli.command("bench")
@click.option("--rows", type=int, default=1_000_000, show_default=True, help="The large batch (optimised pipeline).")
@click.option("--compare-rows", type=int, default=5_000, show_default=True, help="The batch run through both designs.")
@click.option("--idle-seconds", type=float, default=60.0, show_default=True, help="Idle window measured per mode.")
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
    file_kind: str,
    store: str,
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
        scaleout = _benchmark("scaleout")
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
    bench = _benchmark("pipeline")
    if main_only:
        bench.run_main(
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
    bench.run(
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


@cli.command("cost")
@click.option(
    "--from-bench",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Rates from `billing bench` JSON (or idle rate from `billing bench-listener` JSON).",
)
@click.option(
    "--design",
    type=click.Choice(list(cost.BENCH_KEYS)),
    default="optimised",
    show_default=True,
    help="Which design's rates to take from --from-bench.",
)
@click.option(
    "--window",
    type=float,
    help="Instead: measure the running roles this many seconds (two refreshes of their state at least); "
    "project that rate all day.",
)
@click.option("--requests-per-1000", type=float, help="Storage requests per 1,000 transactions.")
@click.option("--idle-requests-per-hour", type=float, help="Storage requests per idle hour per processor.")
@click.option(
    "--servicebus-per-1000", type=float, default=0.0, show_default=True, help="Service Bus operations per 1,000 tx."
)
@click.option("--daily-transactions", type=int, default=10_000_000, show_default=True)
@click.option("--idle-hours", type=click.FloatRange(0, 24), default=22.0, show_default=True, help="Idle hours per day.")
@click.option("--processors", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--whitepaper", is_flag=True, help="Only the whitepaper's example; no rates needed.")
@click.option(
    "--prices",
    "prices_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A prices.toml of your own.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def cost_command(
    ctx: click.Context,
    from_bench: Path | None,
    design: cost.Design,
    window: float | None,
    requests_per_1000: float | None,
    idle_requests_per_hour: float | None,
    servicebus_per_1000: float,
    daily_transactions: int,
    idle_hours: float,
    processors: int,
    whitepaper: bool,
    prices_file: Path | None,
    as_json: bool,
) -> None:
    """Project monthly cost from measured requests, and compute the whitepaper's idle example."""
    if window is not None:
        from shared.messaging.service import STATE_INTERVAL  # the roles' runtime: only for this measure

        if window < 2 * STATE_INTERVAL:
            raise click.BadParameter(
                f"{window:g} s is shorter than two refreshes of the roles' state", param_hint="--window"
            )
    if window is not None or whitepaper:
        rate_options = (
            "from_bench",
            "design",
            "requests_per_1000",
            "idle_requests_per_hour",
            "servicebus_per_1000",
            "daily_transactions",
            "idle_hours",
            "processors",
            "whitepaper" if window is not None else "window",
        )
        given = [
            name for name in rate_options if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
        ]
        if given:
            mode = "--window" if window is not None else "--whitepaper"
            raise click.UsageError(f"{mode} takes no {', '.join('--' + n.replace('_', '-') for n in given)}")
    prices = cost.Prices.load(prices_file or cost.PRICES)
    result: dict[str, object] = {}
    if window is not None:
        from shared.settings import Settings

        settings = Settings()
        measured = cost.measure_window(settings, window)
        if not measured["roles"]:
            raise click.ClickException(
                f"no role ran under BILLING_HOME={settings.home} through the {window:g} s window"
            )
        result = {"measured": measured, "projection": cost.project(cost.window_workload(measured), prices)}
    elif not whitepaper:
        rates = cost.from_bench(from_bench, design) if from_bench else {}
        rates.update(
            {
                k: v
                for k, v in (
                    ("requests_per_1000", requests_per_1000),
                    ("idle_requests_per_hour", idle_requests_per_hour),
                )
                if v is not None
            }
        )
        if missing := sorted({"requests_per_1000", "idle_requests_per_hour"} - set(rates)):
            raise click.UsageError(
                f"missing {', '.join('--' + m.replace('_', '-') for m in missing)}: give --from-bench, "
                "--window, --whitepaper, or both --requests-per-1000 and --idle-requests-per-hour"
            )
        workload = cost.Workload(
            **rates,
            servicebus_per_1000=servicebus_per_1000,
            daily_transactions=daily_transactions,
            idle_hours=idle_hours,
            processors=processors,
        )
        result = {"projection": cost.project(workload, prices)}
    result["whitepaper_example"] = cost.whitepaper_example(prices)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        cost.print_result(result, Console())


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="billing", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except BillingError as exc:
        console.print("[red]error:[/red]", escape(redact(str(exc))), soft_wrap=True)  # one line, as written
        sys.exit(2)
    finally:
        # Done: spare the interpreter's last collection a walk over every object the imports made
        # (0.3 s of what the user waits for `billing submit --wait` to return, 0.05 s frozen).
        gc.freeze()
