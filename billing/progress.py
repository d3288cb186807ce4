"""Waiting for a batch with a live progress display, and printing its summary."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from store import FINAL_STATES, BatchStatus, Store


def wait_with_progress(
    store: Store,
    batch_ids: Sequence[str],
    *,
    console: Console,
    timeout: float | None = None,
    watch: Callable[[Mapping[str, BatchStatus | None]], None] | None = None,
) -> list[BatchStatus]:
    """Wait for batches with a progress bar each, of recorded work items; ``watch`` is shown their statuses
    at each look too (it may print above the bars on ``console``)."""
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    # Off a terminal nothing would show the bars (they are transient), but drawing them would still cost CPU.
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        tasks = {batch_id: bar.add_task(f"batch {batch_id[:16]}: waiting", total=None) for batch_id in batch_ids}

        def show(statuses: Mapping[str, BatchStatus | None]) -> None:
            for batch_id, status in statuses.items():
                if status is not None:
                    bar.update(
                        tasks[batch_id],
                        description=f"batch {batch_id[:16]}: {status.state}",
                        total=status.work_items,
                        completed=status.completed_items,
                    )
            if watch is not None:
                watch(statuses)

        statuses = wait_for_all(store, batch_ids, timeout=timeout, on_progress=show)
    unknown = [batch_id for batch_id, status in statuses.items() if status is None]
    if unknown:
        raise click.ClickException(f"batch {', '.join(unknown)} is unknown")
    return [status for status in statuses.values() if status is not None]


def wait_for(store: Store, batch_id: str, *, timeout: float | None = None) -> BatchStatus | None:
    """Poll the store until the batch reaches a final state (or ``timeout`` passes)."""
    return wait_for_all(store, [batch_id], timeout=timeout)[batch_id]


def wait_for_all(
    store: Store,
    batch_ids: Sequence[str],
    *,
    timeout: float | None = None,
    on_progress: Callable[[Mapping[str, BatchStatus | None]], None] | None = None,
) -> dict[str, BatchStatus | None]:
    """Poll the store until every batch reaches a final state (or ``timeout`` passes): each one's
    status, None for one the store does not know."""
    deadline = None if timeout is None else time.monotonic() + timeout
    statuses: dict[str, BatchStatus | None] = dict.fromkeys(batch_ids)
    while True:
        for batch_id, status in statuses.items():
            if status is None or status.state not in FINAL_STATES:
                statuses[batch_id] = store.patiently(functools.partial(store.batch, batch_id))
        if on_progress is not None:
            on_progress(statuses)
        settled = all(status is not None and status.state in FINAL_STATES for status in statuses.values())
        if settled or (deadline is not None and time.monotonic() > deadline):
            return statuses
        time.sleep(0.1)


def print_summary(status: BatchStatus) -> None:
    for key, value in status.to_json_dict().items():
        click.echo(f"{key:>22}: {value}")
