"""``billing submit``, ``status``, ``resubmit`` and ``generate``: batches sent, followed and made."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from shared.errors import BillingError, InfrastructureError
from shared.localstack import resolve
from shared.logs import redact

from ..sql import open_store
from .output import console, print_error

if TYPE_CHECKING:
    from shared.settings import Settings

    from .. import client


@click.command()
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
    """Submit batch files (CSV, JSON Lines or Parquet), each a batch of its own, all at once, numbered in the order
    given.

    A file refused is reported on a line of its own (exit status 2 at the end); the others go on."""
    if batch_id is not None and len(files) > 1:
        raise click.UsageError("--batch-id names one batch: give it with one file")
    from shared import telemetry

    from ..batch_ids import file_digest

    settings = resolve()
    # The default batch ids are hashed while the storage SDK loads (hashing releases the GIL).
    with ThreadPoolExecutor(thread_name_prefix="digest") as hashing:
        hashable = [] if batch_id is not None else [f for f in files if f.stat().st_size <= settings.max_file_bytes]
        digests = {file: hashing.submit(file_digest, file) for file in hashable}
        with telemetry.running("client"):  # exported when configured: the root span of each batch's trace
            outcomes = asyncio.run(
                _submit_all(settings, files, digests, batch_id=batch_id, pricebook=pricebook, taxes=taxes)
            )
    submitted: list[str] = []  # and those submitted before: --wait waits for them too
    for file, outcome in zip(files, outcomes, strict=True):
        if isinstance(outcome, BillingError):
            print_error(f"{file.name}: {redact(str(outcome))}")
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

        from .. import progress, unbilled

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
    settings: Settings, files: tuple[Path, ...], digests: Mapping[Path, Future[str]], **options: Any
) -> list[client.Submission | BillingError]:
    """Every file's submission at once, their requests sent in the order given (so numbered in that order): its
    outcome, or why it was refused (anything else is raised). ``digests``: the default batch ids (each file's
    SHA-256) being computed, of the files submitted without ``--batch-id``."""
    from .. import client

    async def submission(file: Path, turn: client.Turn) -> client.Submission:
        try:
            batch_id = await asyncio.wrap_future(digests[file]) if file in digests else options["batch_id"]
            return await client.submit(settings, file, turn=turn, **{**options, "batch_id": batch_id})
        finally:
            turn.done.set()

    turns = client.Turn.chain(len(files))
    outcomes = await asyncio.gather(*map(submission, files, turns), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, BillingError):
            raise outcome
    return cast("list[client.Submission | BillingError]", outcomes)


@click.command()
@click.argument("batch_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(batch_id: str | None, as_json: bool) -> None:
    """Show one batch's state, or every batch, the files in the inbox that no batch accounts for (with their
    age), the running roles (dequeue tasks, storage requests, failover state per destination) and, with a
    secondary account, its backlog."""
    from shared.messaging.processes import role_states
    from shared.settings import Settings

    from .. import unbilled

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


@click.command("generate")
@click.option("--rows", type=int, required=True)
@click.option("--seed", type=int, default=0)
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl", "parquet"]), default="csv")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
def generate_command(rows: int, seed: int, fmt: str, out: Path) -> None:
    """Generate a sample batch file."""
    from ..sample import generate

    generate(rows, out, seed=seed, fmt=fmt)
    click.echo(f"wrote {rows} rows to {out}")


@click.command("resubmit")
@click.argument("batch_id")
def resubmit_command(batch_id: str) -> None:
    """Send again the request of a batch whose file sits in the inbox and that no batch accounts for (`billing
    status` lists them). A batch already accounted for, or without a file in the inbox, is refused."""
    from .. import unbilled

    unbilled.resubmit(batch_id)


COMMANDS: tuple[click.Command, ...] = (submit, status, resubmit_command, generate_command)
