"""Waiting for a batch with a live progress display, and printing its summary."""

from __future__ import annotations

import time
from collections.abc import Callable

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from controller.store import FINAL_STATES, BatchStatus, Store


def wait_with_progress(store: Store, batch_id: str, *, console: Console, timeout: float | None = None) -> BatchStatus:
    """Wait for a batch with a progress bar of recorded work items."""
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(f"batch {batch_id[:16]}: waiting", total=None)

        def show(status: BatchStatus | None) -> None:
            if status is not None:
                bar.update(
                    task,
                    description=f"batch {batch_id[:16]}: {status.state}",
                    total=status.work_items,
                    completed=status.completed_items,
                )

        status = wait_for(store, batch_id, timeout=timeout, on_progress=show)
    if status is None:
        raise click.ClickException(f"batch {batch_id} is unknown")
    return status


def wait_for(
    store: Store,
    batch_id: str,
    *,
    timeout: float | None = None,
    on_progress: Callable[[BatchStatus | None], None] | None = None,
) -> BatchStatus | None:
    """Poll the store until the batch reaches a final state (or ``timeout`` passes)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        status = store.batch(batch_id)
        if on_progress is not None:
            on_progress(status)
        if status is not None and status.state in FINAL_STATES:
            return status
        if deadline is not None and time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def print_summary(status: BatchStatus) -> None:
    for key, value in status.to_json_dict().items():
        click.echo(f"{key:>22}: {value}")
