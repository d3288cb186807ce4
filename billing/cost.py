"""``billing cost``: monthly cost projected from measured request counts.

Storage transactions are billed, empty polls included, so the design is judged by requests per unit
of business work and by idle requests. The counts come from a benchmark's JSON (``billing bench``)
or from a window of the running system (the roles' live state files), or are given directly; the
prices from ``prices.toml`` (editable, or ``--prices``). The whitepaper's own idle-polling example is
computed by the same code.
"""

from __future__ import annotations

import json
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from shared.settings import Settings

from .runtime import role_states

PRICES = Path(__file__).with_name("prices.toml")
DAYS_PER_MONTH = 30  # as the whitepaper counts


@dataclass(frozen=True)
class Prices:
    storage_per_10k: dict[str, float]  # price name → dollars per 10,000 storage operations
    servicebus_base_monthly: float
    servicebus_tiers: list[tuple[float, float]]  # (operations per month up to, dollars per million)

    @classmethod
    def load(cls, path: Path = PRICES) -> Prices:
        data = tomllib.loads(path.read_text())
        sb = data["servicebus"]
        return cls(
            storage_per_10k={name: float(price) for name, price in data["storage"].items()},
            servicebus_base_monthly=float(sb["base_monthly"]),
            servicebus_tiers=[(float(limit), float(price)) for limit, price in sb["tiers"]],
        )

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
        "workload": workload.__dict__,
        "monthly_storage_requests": round(storage),
        "monthly_storage_cost": {name: round(storage / 10_000 * price, 2) for name, price in prices.storage_per_10k.items()},
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


def from_bench(path: Path) -> dict[str, float]:
    """Rates measured by ``billing bench``: the large batch's requests per 1,000 transactions
    (setup excluded) and push-mode idle requests per hour per processor."""
    report = json.loads(path.read_text())
    return {
        "requests_per_1000": report["main"]["work_requests_per_1000"],
        "idle_requests_per_hour": report["listener"]["idle_requests_per_hour"]["push (local bus)"],
    }


def measure_window(settings: Settings, seconds: float) -> dict[str, float]:
    """Requests per hour of the roles running under ``settings.home``, over ``seconds``."""
    before = {state["pid"]: state for state in role_states(settings)}
    time.sleep(seconds)
    after = role_states(settings)
    storage = servicebus = 0
    for state in after:
        if state["pid"] in before:
            for kind, count in state["requests"].items():
                delta = count - before[state["pid"]]["requests"].get(kind, 0)
                if kind.startswith("servicebus."):
                    servicebus += delta
                elif kind != "total":
                    storage += delta
    return {
        "roles": len([s for s in after if s["pid"] in before]),
        "storage_requests_per_hour": storage * 3600 / seconds,
        "servicebus_operations_per_hour": servicebus * 3600 / seconds,
    }


def print_projection(result: dict[str, Any], console: Console) -> None:
    """The projection and the whitepaper's example as two tables."""
    projection = result["projection"]
    w = projection["workload"]
    table = Table(title=f"Monthly cost: {w['daily_transactions']:,} transactions/day, {w['idle_hours']:g} idle h/day, "
                        f"{w['processors']} processor(s)")  # fmt: skip
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_row("storage requests / month", f"{projection['monthly_storage_requests']:,}")
    for name, dollars in projection["monthly_storage_cost"].items():
        table.add_row(f"storage cost, {name}", f"${dollars:,.2f}")
    if projection["monthly_servicebus_operations"]:
        table.add_row("Service Bus operations / month", f"{projection['monthly_servicebus_operations']:,}")
        table.add_row("Service Bus Standard cost", f"${projection['monthly_servicebus_cost']:,.2f}")
    console.print(table)
    example = Table(title="The whitepaper's example: 22 idle hours/day, 1 s polling, per month")
    for column in ("dequeue threads", "storage requests", *next(iter(result["whitepaper_example"]))["monthly_storage_cost"]):
        example.add_column(column, justify="right")
    for row in result["whitepaper_example"]:
        costs = [f"${dollars:,.2f}" for dollars in row["monthly_storage_cost"].values()]
        example.add_row(str(row["threads"]), f"{row['monthly_storage_requests']:,}", *costs)
    console.print(example)
