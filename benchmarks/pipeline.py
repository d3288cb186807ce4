"""``billing bench``: the pipeline measured on the local stack, optimised against the naive design.

In one invocation: a large batch through the optimised pipeline (throughput, latency, memory); one
same smaller batch through the optimised pipeline and through the naive mode (one transaction per
message, one message per receive, delete on receive, fixed 1 s polling, no triggers); the listener's
idle cost and trigger wake-up latency (:mod:`billing.listenbench`); optionally the scaling curve over
partitions and processor processes. Storage requests are what every process's own request counter
(an SDK pipeline policy) saw, all roles plus the submitting client. Every run gets a fresh Azurite
and SQLite under a scratch home. Prints one table, writes it as JSON and draws a PNG chart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr
from rich.console import Console
from rich.table import Table

from billing import client, cost, progress
from billing.demo import role_processes
from billing.stack import AzuriteStack
from controller.store import Store
from shared.messaging.service import STATE_INTERVAL
from shared.rules.sample import generate, write_price_book, write_tax_table
from shared.settings import Settings

from . import listener as listenbench

Mode = Literal["optimised", "naive"]

#: What a first version would do (settings, so the same code runs both designs).
NAIVE: dict[str, Any] = {
    "work_item_size": 1,
    "dequeue_batch_size": 1,
    "dequeue_tasks": 1,
    "delete_on_receive": True,
    "min_idle_interval": 1.0,
    "max_idle_interval": 1.0,
    "trigger_backend": "none",
}
#: How long a run waits for the roles to be idle before and after its batch (pull mode never is).
SETTLE_SECONDS: dict[str, float] = {"optimised": 30.0, "naive": 3.0}
SCALING_PARTITIONS = (1, 2, 4, 8)
SCALING_PROCESSORS = (1, 2, 3)


@dataclass(frozen=True)
class PipelineRun:
    mode: Mode
    rows: int
    partitions: int
    processors: int
    accepted: int
    work_items: int
    latency_seconds: float
    transactions_per_second: float
    storage_requests: int
    requests_per_1000: float
    setup_requests: int  # before the batch: creating queues and containers, polls until the roles were idle
    work_requests_per_1000: float  # the batch's own: from submission until the roles were idle again
    attributed_requests_per_1000: float | None  # what the batch's own status counted for it (shared.tally)
    requests_by_kind: dict[str, int]
    peak_rss_mib: dict[str, float]


@dataclass(frozen=True)
class BenchReport:
    main: PipelineRun
    optimised: PipelineRun
    naive: PipelineRun
    listener: listenbench.ListenerBench
    scaling: list[PipelineRun]
    monthly_cost: dict[str, dict[str, Any]]  # design → projection at 10 M transactions/day, 22 idle hours


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
    rows: int, *, data_dir: Path, console: Console, mode: Mode = "optimised", partitions: int = 4, processors: int = 1
) -> PipelineRun:
    """Generate (or reuse) a ``rows``-row CSV and time it through a fresh local pipeline."""
    batch = _batch_file(rows, data_dir, console)
    with tempfile.TemporaryDirectory(prefix="billing-bench-") as scratch:
        home = Path(scratch)
        stack = AzuriteStack(home=home, persist=False)
        settings = Settings(
            home=home,
            storage_connection_string=SecretStr(stack.start()),
            partitions=partitions,
            **(NAIVE if mode == "naive" else {}),
        )
        try:
            settle = SETTLE_SECONDS[mode]
            with role_processes(settings, home / "logs", processors=processors):
                before = _settled(home, roles=2 + processors, timeout=settle)
                submission = asyncio.run(
                    client.submit(settings, batch, pricebook=data_dir / "pricebook.csv", taxes=data_dir / "taxes.csv")
                )
                with Store(settings.sql_url_value) as store:
                    status = progress.wait_with_progress(store, submission.batch_id, console=console)
                time.sleep(STATE_INTERVAL + 0.5)  # no stale state file shows the roles idle
                _settled(home, roles=2 + processors, timeout=settle)  # the wake-ups' trailing polls count too
            states = [json.loads(p.read_text()) for p in sorted((home / "state").glob("*.json"))]
        finally:
            stack.stop()
    by_kind: dict[str, int] = dict(submission.requests)
    rss: dict[str, float] = {}
    for state in states:
        for kind, count in state["requests"].items():
            by_kind[kind] = by_kind.get(kind, 0) + count
        rss[state["role"]] = max(state["peak_rss_mib"], rss.get(state["role"], 0.0))
        if state["role"] == "processor":  # its rating workers, reaped by the time the final state is written
            rss["rating worker"] = max(state["peak_child_rss_mib"], rss.get("rating worker", 0.0))
    total = by_kind.pop("total")
    setup = before  # creating queues and containers, and polls until every listener was idle
    latency = float(status.latency_seconds or 0.0)
    return PipelineRun(
        mode=mode,
        rows=rows,
        partitions=partitions,
        processors=processors,
        accepted=status.accepted,
        work_items=status.work_items or 0,
        latency_seconds=round(latency, 2),
        transactions_per_second=round(status.accepted / latency) if latency else 0.0,
        storage_requests=total,
        requests_per_1000=round(1000 * total / max(1, status.accepted), 3),
        setup_requests=setup,
        work_requests_per_1000=round(1000 * (total - setup) / max(1, status.accepted), 3),
        attributed_requests_per_1000=status.requests_per_1000,
        requests_by_kind=by_kind,
        peak_rss_mib=rss,
    )


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
        idle = len(states) == roles and all(not l["active_tasks"] and l["idle_polls"] for l in listeners)
        if idle or time.monotonic() >= deadline:
            return sum(int(state["requests"]["total"]) for state in states)
        time.sleep(0.5)


def _batch_file(rows: int, data_dir: Path, console: Console) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    batch = data_dir / f"bench-{rows}.csv"
    if not batch.exists():
        with console.status(f"generating {rows:,} rows"):
            generate(rows, batch, seed=42)
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
) -> BenchReport:
    """Every measurement; prints the table, writes ``output`` (JSON) and the chart next to it (PNG)."""
    started = time.monotonic()
    main = run_pipeline(rows, data_dir=data_dir, console=console)
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
    report = BenchReport(main, optimised, naive, listener, scaling, monthly_costs(main, naive, listener))
    _print(report, console)
    output.write_text(json.dumps(asdict(report), indent=2))
    chart = output.with_suffix(".png")
    _chart(report, chart)
    console.print(f"wrote {output} and {chart} in {time.monotonic() - started:.0f} s")
    return report


def _print(report: BenchReport, console: Console) -> None:
    table = Table(title="Benchmark (local Azurite + SQLite, this machine)")
    table.add_column("measure")
    for run_ in (report.main, report.optimised, report.naive):
        table.add_column(f"{run_.mode}, {run_.rows:,} tx", justify="right")
    runs = (report.main, report.optimised, report.naive)
    rows: list[tuple[str, list[str]]] = [
        ("transactions / s (accepted → complete)", [f"{r.transactions_per_second:,.0f}" for r in runs]),
        ("batch latency s", [f"{r.latency_seconds:.1f}" for r in runs]),
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
