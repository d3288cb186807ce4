"""Send availability end to end: the whole pipeline (real role processes) on a primary Azurite that
is stopped mid-run and restarted, with the session Azurite as the secondary account; sends go
through the backlog queues meanwhile, the syphon drains them, and the batch completes exactly."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from billing.sample import generate
from shared.localstack import AzuriteStack
from shared.messaging.storage import Storage
from shared.settings import Settings
from store import BatchStatus, Store
from support.azurite import running_azurite
from support.backlog import backlog
from support.exact import expected, read_raw, report, sorted_records
from support.queues import input_depth
from support.references import sample_flags
from support.roles import Roles
from support.waiting import wait_until


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[AzuriteStack]:
    with running_azurite(tmp_path / "primary", persist=True) as stack:
        yield stack


def _complete(settings: Settings, batch_id: str) -> BatchStatus | None:
    """The batch's status once complete, else None."""
    with Store(settings.sql_url_value) as store:
        status = store.batch(batch_id)
    return status if status is not None and status.state == "complete" else None


@pytest.mark.slow
def test_primary_outage_mid_run_completes_exactly_through_the_backlog(
    settings_env: Settings, primary: AzuriteStack, roles: Roles, tmp_path: Path
) -> None:
    rows = 40_000
    settings = settings_env.model_copy(
        update={
            "storage_connection_string": SecretStr(primary.connection_string() or ""),
            "secondary_storage_connection_string": settings_env.storage_connection_string,
            # 400 work items carrying their rows (claim-checked into whichever account takes the send), two
            # sent at a time: the initiator is still sending when the primary goes away.
            "work_item_size": 100,
            "work_item_rows": "message",
            "max_concurrent_sends": 2,
            "failover_interval": 1.0,
            "failover_probe_interval": 1.0,
            "syphon_idle_interval": 1.0,
            "visibility_timeout": 10,
            "retry_total": 1,
            "retry_backoff": 0.2,
            "request_timeout": 3.0,
            "trigger_backend": "none",
        }
    )
    batch = tmp_path / "batch.csv"
    generate(rows, batch, seed=11, reject_rate=0.01)
    env = {**os.environ, **settings.as_env()}
    with roles.running(settings):
        submit = subprocess.run(
            [
                sys.executable,
                "-m",
                "billing",
                "submit",
                str(batch),
                "--batch-id",
                "outage",
                *sample_flags(tmp_path / "ref"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert submit.returncode == 0, submit.stderr
        # The initiator is enqueueing: now the primary goes away.
        wait_until(lambda: asyncio.run(input_depth(settings)) >= 20, 60, interval=0.1)
        primary.restart(down_for=8)
        status = wait_until(lambda: _complete(settings, "outage"), 300, interval=1)

        def settled() -> dict[str, Any] | None:
            """``billing status --json`` once the backlog is empty and every route healthy again."""
            shown = subprocess.run(
                [sys.executable, "-m", "billing", "status", "--json"], env=env, capture_output=True, text=True
            )
            live: dict[str, Any] = json.loads(shown.stdout)
            routes = [route for role in live["roles"] for route in role["failover"].values()]
            drained = live["backlog"] == {queue: 0 for queue in settings.backlog_queues}
            return live if drained and routes and all(r["health"] == "healthy" for r in routes) else None

        # The batch can complete before the backlog is empty: a copy left there (of a send retried after a
        # timeout, say) whose forward failed while the primary was down stays invisible for its visibility
        # timeout, then the syphon forwards it and the repeat is absorbed. The roles' state files lag too.
        live = wait_until(settled, 6 * settings.visibility_timeout, interval=1)
    assert live is not None, "the backlog drained and every route is healthy again"
    routes = {dest: route for role in live["roles"] for dest, route in role["failover"].items()}
    assert sum(route["failovers"] for route in routes.values()) > 0
    assert roles.returncodes == [0, 0, 0]
    assert status is not None and status.state == "complete", status

    states = [json.loads(p.read_text()) for p in (settings.home / "state").glob("*.json")]
    via_backlog = sum(route["backlog_sent"] for state in states for route in state["failover"].values())
    assert via_backlog > 0, "some sends went through the backlog"

    async def leftover() -> list[tuple[str, str]]:
        async with Storage(settings) as storage:
            return await backlog(storage)

    assert asyncio.run(leftover()) == [], "the syphon drained the backlog"

    aggregates, invoices, rejects = expected(read_raw(batch))
    assert (status.accepted, status.rejected) == (sum(a["transactions"] for a in aggregates), len(rejects))
    assert status.transactions_recorded == status.accepted and status.completed_items == status.work_items
    got = report("aggregates", "outage")
    for record in got:
        record["quantity"] = Decimal(record["quantity"])
    assert sorted_records(got) == aggregates
    assert sorted_records(report("invoices", "outage")) == invoices
