"""Waiting for a batch with a live progress display, and printing its summary."""

from __future__ import annotations

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from controller.store import BatchStatus, Store

from . import client


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

        status = client.wait_for(store, batch_id, timeout=timeout, on_progress=show)
    if status is None:
        raise click.ClickException(f"batch {batch_id} is unknown")
    return status


def print_summary(status: BatchStatus) -> None:
    for key, value in status.to_json_dict().items():
        click.echo(f"{key:>22}: {value}")
