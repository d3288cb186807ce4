"""``billing bench``: one large batch through the local pipeline, measured.

Measures end-to-end throughput (accepted → complete), storage requests per 1,000 transactions
as counted by every process's own request counter (all roles plus the submitting client), and
each role's peak resident memory. Every run uses a fresh Azurite and SQLite under a scratch home.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import SecretStr
from rich.console import Console
from rich.table import Table

from controller.store import Store
from shared.sample import generate, write_price_book, write_tax_table
from shared.settings import Settings

from . import client, progress
from .demo import role_processes
from .stack import AzuriteStack


@dataclass(frozen=True)
class PipelineRun:
    rows: int
    accepted: int
    work_items: int
    latency_seconds: float
    transactions_per_second: float
    storage_requests: int
    requests_per_1000: float
    requests_by_kind: dict[str, int]
    peak_rss_mib: dict[str, float]


def run_pipeline(rows: int, *, data_dir: Path, console: Console, partitions: int = 4) -> PipelineRun:
    """Generate (or reuse) a ``rows``-row CSV and time it through a fresh local pipeline."""
    data_dir.mkdir(parents=True, exist_ok=True)
    batch = data_dir / f"bench-{rows}.csv"
    if not batch.exists():
        with console.status(f"generating {rows:,} rows"):
            generate(rows, batch, seed=42)
    pricebook, taxes = data_dir / "pricebook.csv", data_dir / "taxes.csv"
    write_price_book(pricebook)
    write_tax_table(taxes)
    with tempfile.TemporaryDirectory(prefix="billing-bench-") as scratch:
        home = Path(scratch)
        stack = AzuriteStack(home=home, persist=False)
        settings = Settings(
            home=home,
            storage_connection_string=SecretStr(stack.start()),
            partitions=partitions,
        )
        try:
            with role_processes(settings, home / "logs"):
                submission = asyncio.run(client.submit(settings, batch, pricebook=pricebook, taxes=taxes))
                with Store(settings.sql_url_value) as store:
                    status = progress.wait_with_progress(store, submission.batch_id, console=console)
            states = [json.loads(p.read_text()) for p in sorted((home / "state").glob("*.json"))]
        finally:
            stack.stop()
    by_kind: dict[str, int] = dict(submission.requests)
    rss: dict[str, float] = {}
    for state in states:
        for kind, count in state["requests"].items():
            by_kind[kind] = by_kind.get(kind, 0) + count
        rss[state["role"]] = max(state["peak_rss_mib"], rss.get(state["role"], 0.0))
        if state["peak_child_rss_mib"]:
            rss[f"{state['role']} worker"] = state["peak_child_rss_mib"]
    total = by_kind.pop("total")
    latency = float(status.latency_seconds or 0.0)
    return PipelineRun(
        rows=rows,
        accepted=status.accepted,
        work_items=status.work_items or 0,
        latency_seconds=round(latency, 2),
        transactions_per_second=round(status.accepted / latency) if latency else 0.0,
        storage_requests=total,
        requests_per_1000=round(1000 * total / max(1, status.accepted), 3),
        requests_by_kind=by_kind,
        peak_rss_mib=rss,
    )


def run(*, rows: list[int], data_dir: Path, output: Path | None, console: Console) -> list[PipelineRun]:
    """Run the pipeline benchmark for each size and print one table."""
    results = []
    for size in rows:
        started = time.monotonic()
        results.append(run_pipeline(size, data_dir=data_dir, console=console))
        console.print(f"{size:,} rows measured in {time.monotonic() - started:.0f} s")
    table = Table(title="Pipeline benchmark (local Azurite + SQLite)")
    for column in ("rows", "tx/s (accepted→complete)", "latency s", "requests", "req / 1,000 tx", "peak RSS MiB"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            f"{r.rows:,}", f"{r.transactions_per_second:,.0f}", f"{r.latency_seconds:.1f}", f"{r.storage_requests:,}",
            f"{r.requests_per_1000:.2f}", ", ".join(f"{k} {v:.0f}" for k, v in r.peak_rss_mib.items()),
        )
    console.print(table)
    if output is not None:
        output.write_text(json.dumps([asdict(r) for r in results], indent=2))
        console.print(f"wrote {output}")
    return results
