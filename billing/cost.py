"""``billing cost``: monthly cost projected from measured request counts.

Storage transactions are billed, empty polls included, so the design is judged by requests per unit
of business work and by idle requests. The rates come from a benchmark's JSON (``billing bench`` or
``billing bench-listener``), from a window of the running system (the roles' live state files), or
are given directly; the prices from ``prices.toml`` (editable, or ``--prices``). The whitepaper's own
idle-polling example is computed by the same code.
"""

from __future__ import annotations

import json
import time
import tomllib
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console
from rich.table import Table

from shared.errors import InputError

if TYPE_CHECKING:
    from shared.settings import Settings

PRICES = Path(__file__).with_name("prices.toml")
DAYS_PER_MONTH = 30  # as the whitepaper counts
Design = Literal["optimised", "naive"]
# Where a bench report keeps each design's rates: (pipeline run, idle mode of the listener bench).
BENCH_KEYS: dict[Design, tuple[str, str]] = {
    "optimised": ("main", "push (local bus)"),
    "naive": ("naive", "naive 1 s polling"),
}


@dataclass(frozen=True)
class Prices:
    storage_per_10k: dict[str, float]  # price name → dollars per 10,000 storage operations
    servicebus_base_monthly: float
    servicebus_tiers: list[tuple[float, float]]  # (operations per month up to, dollars per million)

    @classmethod
    def load(cls, path: Path = PRICES) -> Prices:
        try:
            data = tomllib.loads(path.read_text())
            sb = data["servicebus"]
            return cls(
                storage_per_10k={name: float(price) for name, price in data["storage"].items()},
                servicebus_base_monthly=float(sb["base_hourly"]) * float(sb["hours_per_month"]),
                servicebus_tiers=[(float(limit), float(price)) for limit, price in sb["tiers"]],
            )
        except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{path}: not a prices table like {PRICES.name} ({type(exc).__name__}: {exc})") from exc

    def servicebus_monthly(self, operations: float) -> float:
        """Standard tier: the base charge plus each tier's operations at its price."""
        cost, floor = self.servicebus_base_monthly, 0.0
        for limit, per_million in self.servicebus_tiers:
            cost += max(0.0, min(operations, limit) - floor) / 1e6 * per_million
            floor = limit
        return cost


@dataclass(frozen=True)
class Workload:
    """What the system does per day: business work plus idle time."""

    requests_per_1000: float  # storage requests per 1,000 transactions
    idle_requests_per_hour: float  # storage requests per idle hour per processor
    servicebus_per_1000: float = 0.0  # Service Bus operations per 1,000 transactions
    idle_servicebus_per_hour: float = 0.0  # ... per idle hour per processor
    daily_transactions: int = 10_000_000
    idle_hours: float = 22.0
    processors: int = 1

    def monthly_storage_requests(self) -> float:
        daily = self.daily_transactions / 1000 * self.requests_per_1000
        daily += self.idle_hours * self.idle_requests_per_hour * self.processors
        return daily * DAYS_PER_MONTH

    def monthly_servicebus_operations(self) -> float:
        daily = self.daily_transactions / 1000 * self.servicebus_per_1000
        daily += self.idle_hours * self.idle_servicebus_per_hour * self.processors
        return daily * DAYS_PER_MONTH


def project(workload: Workload, prices: Prices) -> dict[str, Any]:
    """Monthly requests and cost at every storage price (plus Service Bus when it is used)."""
    storage = workload.monthly_storage_requests()
    servicebus = workload.monthly_servicebus_operations()
    return {
        "workload": asdict(workload),
        "monthly_storage_requests": round(storage),
        "monthly_storage_cost": {
            name: round(storage / 10_000 * price, 2) for name, price in prices.storage_per_10k.items()
        },
        "monthly_servicebus_operations": round(servicebus),
        "monthly_servicebus_cost": round(prices.servicebus_monthly(servicebus), 2) if servicebus else 0.0,
    }


def whitepaper_example(prices: Prices, threads: tuple[int, ...] = (1, 200)) -> list[dict[str, Any]]:
    """The whitepaper's idle cost: 22 idle hours a day polling every second, per dequeue thread.
    (It prints $2.38 and $457.20 at 2012 prices; 200 × $2.376 is $475.20, a transposed digit.)"""
    rows = []
    for count in threads:
        workload = Workload(requests_per_1000=0.0, idle_requests_per_hour=3600, daily_transactions=0, processors=count)
        rows.append({"threads": count, **project(workload, prices)})
    return rows


def from_bench(path: Path, design: Design = "optimised") -> dict[str, float]:
    """One design's rates from a benchmark report: requests per 1,000 transactions of its large batch
    (setup excluded) from ``billing bench``, and its idle requests per hour per processor from either
    ``billing bench`` or ``billing bench-listener`` (which has no transaction rate)."""
    run, mode = BENCH_KEYS[design]
    try:
        report = json.loads(path.read_text())
        listener = report.get("listener", report)
        rates = {"idle_requests_per_hour": float(listener["idle_requests_per_hour"][mode])}
        if run in report:
            rates["requests_per_1000"] = float(report[run]["work_requests_per_1000"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(
            f"{path}: not a `billing bench` or `billing bench-listener` report ({type(exc).__name__}: {exc})"
        ) from exc
    return rates


def measure_window(settings: Settings, seconds: float) -> dict[str, Any]:
    """Requests per hour made by the roles running under ``settings.home``: each role's counts
    between two of its state snapshots ``seconds`` apart, over the time between the snapshots."""
    from shared.messaging.processes import role_states

    before = {state["pid"]: state for state in role_states(settings)}
    time.sleep(seconds)
    by_kind: dict[str, float] = {}
    roles = []
    for state in role_states(settings):
        first = before.get(state["pid"])
        if first is None:
            continue  # started during the window
        elapsed = (
            datetime.fromisoformat(state["updated_at"]) - datetime.fromisoformat(first["updated_at"])
        ).total_seconds()
        if elapsed <= 0:
            continue  # no snapshot since the first: a window shorter than the state interval
        roles.append(state["role"])
        for kind, count in state["requests"].items():
            if kind != "total" and (delta := count - first["requests"].get(kind, 0)):
                by_kind[kind] = by_kind.get(kind, 0.0) + delta * 3600 / elapsed
    return {
        "roles": sorted(roles),
        "seconds": seconds,
        "storage_requests_per_hour": sum(rate for kind, rate in by_kind.items() if not kind.startswith("servicebus.")),
        "servicebus_operations_per_hour": sum(rate for kind, rate in by_kind.items() if kind.startswith("servicebus.")),
        "requests_per_hour_by_kind": dict(sorted(by_kind.items())),
    }


def window_workload(measured: dict[str, Any]) -> Workload:
    """The measured rate kept up around the clock (the window's mix of work and idling, every day)."""
    return Workload(
        requests_per_1000=0.0,
        idle_requests_per_hour=measured["storage_requests_per_hour"],
        idle_servicebus_per_hour=measured["servicebus_operations_per_hour"],
        daily_transactions=0,
        idle_hours=24.0,
    )


def print_result(result: dict[str, Any], console: Console) -> None:
    """What was measured, the projection, and the whitepaper's example, as tables."""
    if "measured" in result:
        measured = result["measured"]
        table = Table(title=f"Measured over {measured['seconds']:g} s: {', '.join(measured['roles'])}")
        table.add_column("request kind")
        table.add_column("per hour", justify="right")
        for kind, rate in measured["requests_per_hour_by_kind"].items():
            table.add_row(kind, f"{rate:,.0f}")
        console.print(table)
    if "projection" in result:
        projection = result["projection"]
        w = projection["workload"]
        title = (
            f"Monthly cost at the measured rate, {w['idle_hours']:g} h/day"
            if "measured" in result
            else f"Monthly cost: {w['daily_transactions']:,} transactions/day, {w['idle_hours']:g} idle h/day, "
            f"{w['processors']} processor(s)"
        )
        table = Table(title=title)
        table.add_column("")
        table.add_column("value", justify="right")
        table.add_row("storage requests / month", f"{projection['monthly_storage_requests']:,}")
        for name, dollars in projection["monthly_storage_cost"].items():
            table.add_row(f"storage cost, {name}", f"${dollars:,.2f}")
        if projection["monthly_servicebus_operations"]:
            table.add_row("Service Bus operations / month", f"{projection['monthly_servicebus_operations']:,}")
            table.add_row("Service Bus Standard cost", f"${projection['monthly_servicebus_cost']:,.2f}")
        console.print(table)
    example = Table(title="The whitepaper's example: 22 idle hours/day, 1 s polling, 30 days")
    for column in ("dequeue threads", "storage requests", *result["whitepaper_example"][0]["monthly_storage_cost"]):
        example.add_column(column, justify="right")
    for row in result["whitepaper_example"]:
        costs = [f"${dollars:,.2f}" for dollars in row["monthly_storage_cost"].values()]
        example.add_row(str(row["threads"]), f"{row['monthly_storage_requests']:,}", *costs)
    console.print(example)
