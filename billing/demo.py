"""``billing demo``: the whole pipeline on the local stack, each role its own process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar, overload

import pandas as pd
from rich.console import Console
from rich.table import Table

from billing.sample import generate, write_price_book, write_tax_table
from shared.localstack import resolve
from shared.rules.reference import money
from shared.settings import Settings
from store import Store

from . import client, progress, reports


class RoleProcess(Protocol):
    """What :func:`role_processes` needs of a started role (:class:`subprocess.Popen` has it)."""

    def send_signal(self, signum: int, /) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


P = TypeVar("P", bound=RoleProcess)


def start_role(role: str, env: Mapping[str, str], log: Path, *, cgroup: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``python -m <role>`` with ``env``, its output appended to ``log``. With ``cgroup`` (a
    cgroup's directory) the process joins that group before Python starts, so the role reads the
    group's limits as its own and every process it starts stays inside them."""
    command = [sys.executable, "-m", role]
    if cgroup is not None:  # a shell joins the group, then becomes the role (same pid)
        command = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *command]
    with log.open("ab") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=out)


@overload
def role_processes(
    settings: Settings, log_dir: Path, *, processors: int = 1, processor_cgroups: Sequence[Path] = ()
) -> AbstractContextManager[list[subprocess.Popen[bytes]]]: ...
@overload
def role_processes(
    settings: Settings,
    log_dir: Path,
    *,
    processors: int = 1,
    processor_cgroups: Sequence[Path] = (),
    start: Callable[..., P],
) -> AbstractContextManager[list[P]]: ...
@contextmanager
def role_processes(
    settings: Settings,
    log_dir: Path,
    *,
    processors: int = 1,
    processor_cgroups: Sequence[Path] = (),
    start: Callable[..., RoleProcess] = start_role,
) -> Iterator[list[Any]]:  # typed by the overloads
    """Start initiator, ``processors`` processors and controller as separate processes with
    ``settings``, each logging to ``log_dir/<role>-<number>.log`` (started by ``start``, a function
    like :func:`start_role`); stop them gracefully (those in the yielded list when the block ends: a
    caller may replace one it restarted). Given ``processor_cgroups`` (one per processor), each
    processor runs in its own (:func:`start_role`)."""
    if processor_cgroups and len(processor_cgroups) != processors:
        raise ValueError(f"{len(processor_cgroups)} cgroups for {processors} processors")
    env = {**os.environ, **settings.as_env()}
    log_dir.mkdir(parents=True, exist_ok=True)
    groups = iter(processor_cgroups)
    processes: list[Any] = []
    try:
        for number, role in enumerate(["initiator", *["processor"] * processors, "controller"]):
            cgroup = next(groups, None) if role == "processor" else None
            processes.append(start(role, env, log_dir / f"{role}-{number}.log", cgroup=cgroup))
        yield processes
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


def run(*, rows: int, seed: int, console: Console) -> None:
    """Generate a sample batch, run it through the pipeline and print what came out."""
    settings = resolve()
    work = settings.home / "demo"
    work.mkdir(parents=True, exist_ok=True)
    batch, pricebook, taxes = work / f"transactions-{rows}-{seed}.csv", work / "pricebook.csv", work / "taxes.csv"
    with console.status(f"generating {rows:,} sample transactions"):
        if not batch.exists():
            generate(rows, batch, seed=seed, fmt="csv")
        write_price_book(pricebook)
        write_tax_table(taxes)
    console.print(f"sample batch: {batch}  (price book {pricebook}, tax table {taxes})")
    with role_processes(settings, settings.home / "logs"):
        started = time.monotonic()
        submission = asyncio.run(
            client.submit(
                settings, batch, pricebook=pricebook, taxes=taxes, batch_id=f"demo-{rows}-{seed}-{int(time.time())}"
            )
        )
        console.print(f"submitted batch [bold]{submission.batch_id}[/bold]; roles log to {settings.home / 'logs'}")
        with Store(settings.sql_url_value) as store:
            (status,) = progress.wait_with_progress(store, [submission.batch_id], console=console)
            invoices = reports.invoices(store, submission.batch_id)
            aggregates = reports.aggregates(store, submission.batch_id)
            repeated = store.rejects_by_reason(submission.batch_id).get("duplicate_transaction_id", 0)
        elapsed = time.monotonic() - started
    _print_results(console, status.to_json_dict(), invoices, aggregates, elapsed)
    if repeated * 2 > status.rows:  # the sample of an earlier run again: its ids are billed already
        console.print(
            f"{repeated:,} of the {status.rows:,} rows repeat transaction ids already billed"
            f" (duplicate_transaction_id): the ledger bills each id once. `billing demo --seed {seed + 1}` makes a"
            " batch of new ids.",
            soft_wrap=True,
        )


def _print_results(
    console: Console, status: Mapping[str, Any], invoices: pd.DataFrame, aggregates: pd.DataFrame, elapsed: float
) -> None:
    summary = Table(title="Batch summary", show_header=False)
    for key, value in status.items():
        summary.add_row(key, str(value))
    console.print(summary)

    shown = reports.in_units(invoices.head(15))
    table = Table(title=f"Invoices (first {len(shown)} of {len(invoices)}; money in each currency's units)")
    for column in shown.columns:
        table.add_column(column, justify="right" if column in ("net", "tax", "total") else "left")
    for row in shown.itertuples(index=False):
        table.add_row(*(str(v) for v in row))
    console.print(table)

    rows, accepted, rejected = status["rows"], status["accepted"], status["rejected"]
    recon = Table(title="Reconciliation")
    recon.add_column("check")
    recon.add_column("value")
    recon.add_row(
        "rows = accepted + rejected",
        f"{rows} = {accepted} + {rejected}: {'OK' if rows == accepted + rejected else 'MISMATCH'}",
    )
    recorded = int(aggregates["transactions"].sum()) if len(aggregates) else 0
    recon.add_row(
        "accepted = transactions in aggregates",
        f"{accepted} = {recorded}: {'OK' if accepted == recorded else 'MISMATCH'}",
    )
    for currency, group in invoices.groupby("currency"):
        net, tax, total = (money(sum(group[m]), str(currency)) for m in ("net", "tax", "total"))
        recon.add_row(f"total {currency}", f"net {net} + tax {tax} = {total}")
    recon.add_row("wall time", f"{elapsed:.1f} s")
    console.print(recon)
