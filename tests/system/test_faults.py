"""The pipeline through faults injected at the wire (``fault_proxy``, between the SDK and Azurite):
503 Server Busy, 500, dropped connections, timeouts and lost replies at a steady rate, and a total
outage mid-run. The three roles are real processes; the totals must come out exact, nothing may be
poisoned (transient errors are never poison), and no role may crash or log in a busy loop."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest
from pydantic import SecretStr

from benchmarks.fault_proxy import KINDS, SERVICES, FaultProxy
from billing import client, progress
from billing.sample import generate
from shared.settings import Settings
from store import BatchStatus, Store
from support.exact import expected, read_raw, report, sorted_records
from support.references import sample_options
from support.roles import Roles
from support.waiting import wait_until

pytestmark = pytest.mark.slow

ROWS = 6_000
BATCH = "faulty"
OUTAGE_SECONDS = 15.0
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ \S+ \S+ (WARNING|ERROR|CRITICAL) ")


@pytest.fixture
def batch(tmp_path: Path) -> Path:
    path = tmp_path / "batch.csv"
    generate(ROWS, path, seed=5, reject_rate=0.02)
    return path


def through(proxy: FaultProxy, settings: Settings, **overrides: object) -> Settings:
    """``settings`` with storage behind ``proxy``, small work items (30 of them: many messages) and
    short timeouts, so that faults cost seconds, not minutes."""
    return settings.model_copy(
        update={
            "storage_connection_string": SecretStr(proxy.connection_string),
            "work_item_size": 200,
            "request_timeout": 2.0,  # the proxy hangs longer: a "timeout" fault is a client timeout
            "retry_backoff": 0.2,
            "visibility_timeout": 10,  # a batch whose handling failed comes back soon
            "max_idle_interval": 1.0,
            "trigger_backend": "none",  # the local bus goes through storage too; pull mode keeps this about storage
            **overrides,
        }
    )


def run_batch(
    roles: Roles,
    settings: Settings,
    batch: Path,
    during: Callable[[Store], None] = lambda _: None,
) -> tuple[list[int | None], BatchStatus | None]:
    """Submit ``batch`` with the three roles running, call ``during``, wait for the batch's end;
    return the roles' exit codes (after SIGTERM) and the batch status."""
    with roles.running(settings), Store(settings.sql_url_value) as store:
        asyncio.run(client.submit(settings, batch, batch_id=BATCH, **sample_options(batch.parent / "ref")))
        during(store)
        status = progress.wait_for(store, BATCH, timeout=180)
    return roles.returncodes, status


def assert_exact(batch: Path, status: BatchStatus | None) -> None:
    """The batch completed with nothing poisoned, and its reports equal the reference model."""
    aggregates, invoices, rejects = expected(read_raw(batch))
    assert status is not None and status.state == "complete", status
    assert status.poisoned_items == 0, "transient errors are never poison"
    assert (status.accepted, status.rejected) == (sum(a["transactions"] for a in aggregates), len(rejects))
    assert status.completed_items == status.work_items > 10
    assert status.transactions_recorded == status.accepted
    got = report("aggregates", BATCH)
    for record in got:
        record["quantity"] = Decimal(record["quantity"])
    assert sorted_records(got) == aggregates
    assert sorted_records(report("invoices", BATCH)) == invoices


def test_steady_faults_of_every_kind_leave_totals_exact(settings_env: Settings, roles: Roles, batch: Path) -> None:
    upstream = settings_env.storage_connection_string.get_secret_value()  # type: ignore[union-attr]
    with FaultProxy(upstream, rate=0.1, hang=3.0, seed=1) as proxy:
        proxy.set_rate(0.25, services=["blob"])  # blobs see far fewer requests: fault them more often
        codes, status = run_batch(roles, through(proxy, settings_env), batch)
    assert codes == [0, 0, 0], "every role exits 0 on SIGTERM"
    assert {kind for service in SERVICES for kind in proxy.injected[service]} == set(KINDS), proxy.injected
    assert all(proxy.injected[service].total() > 0 for service in SERVICES), proxy.injected
    assert proxy.total(proxy.forwarded) > 5 * proxy.total(proxy.injected) > 0
    assert_exact(batch, status)


def warnings_by_log(roles: Roles) -> dict[str, int]:
    """Log lines at WARNING or above (tracebacks not counted), per role log file."""
    return {name: sum(1 for line in text.splitlines() if LOG_LINE.match(line)) for name, text in roles.logs().items()}


def test_a_storage_outage_mid_run_is_ridden_out(settings_env: Settings, roles: Roles, batch: Path) -> None:
    upstream = settings_env.storage_connection_string.get_secret_value()  # type: ignore[union-attr]
    alive_after: list[bool] = []

    def outage(store: Store) -> None:
        # Mid-debatch: after the initiator's 10th send (of 30 work items and the manifest).
        proxy.outage(OUTAGE_SECONDS, services=SERVICES, after=10, method="POST")
        assert proxy.outage_began.wait(timeout=120), "the batch never started"
        assert (status := store.batch(BATCH)) is None or status.state != "complete", "the outage must come mid-run"
        time.sleep(OUTAGE_SECONDS + 1)
        alive_after.extend(roles.alive())

    with FaultProxy(upstream) as proxy:
        # Fewer SDK retries (about 7 s of them), so the outage outlasts them and reaches the roles.
        codes, status = run_batch(roles, through(proxy, settings_env, retry_total=3), batch, during=outage)
    assert alive_after == [True, True, True], "no role crashed during the outage"
    assert codes == [0, 0, 0], "every role exits 0 on SIGTERM"
    assert proxy.total(proxy.injected, "reset") > 20, proxy.injected
    assert_exact(batch, status)
    warnings = warnings_by_log(roles)
    assert len(warnings) == 3, warnings
    # The roles say that storage failed (one whose polls fell between the SDK's retries may not
    # need to); one that retried in a busy loop would log hundreds of lines.
    assert sum(warnings.values()) >= 1 and all(count <= 20 for count in warnings.values()), warnings


def test_roles_started_during_an_outage_wait_for_storage(settings_env: Settings, roles: Roles, batch: Path) -> None:
    upstream = settings_env.storage_connection_string.get_secret_value()  # type: ignore[union-attr]
    with FaultProxy(upstream) as proxy:
        proxy.outage(600, services=SERVICES)  # storage unreachable from before the roles start, until restored
        settings = through(proxy, settings_env, retry_total=1)
        with roles.running(settings), Store(settings.sql_url_value) as store:

            def all_waiting() -> bool:
                said = roles.logs().values()
                return len(said) == 3 and all("storage unavailable" in text for text in said)

            assert wait_until(all_waiting, 120, interval=0.5), roles.logs()
            assert roles.returncodes == [None, None, None], "no role gave up"
            proxy.restore()
            asyncio.run(client.submit(settings, batch, batch_id=BATCH, **sample_options(batch.parent / "ref")))
            status = progress.wait_for(store, BATCH, timeout=180)
    assert roles.returncodes == [0, 0, 0]
    assert_exact(batch, status)
