"""Health and metrics for orchestrators: the three roles as real processes with ``BILLING_HEALTH_PORT``
(0: each picks a free port and names it in its state file), probed and scraped over HTTP as Kubernetes
and Prometheus would, during and after a batch, and through a storage outage (the fault proxy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from benchmarks.fault_proxy import FaultProxy
from billing.sample import generate
from shared.messaging.processes import role_states
from shared.settings import Settings
from support.exact import billing
from support.probes import by_label, probe, scrape, total
from support.references import sample_flags
from support.roles import Roles
from support.waiting import wait_until

ROWS = 6_000


def endpoints(roles: Roles, settings: Settings) -> dict[str, str]:
    """Each role's health server, by role name (one process per role here), once all are up."""
    assert roles.wait_up()
    found = {state["role"]: f"http://127.0.0.1:{state['health_port']}" for state in role_states(settings)}
    assert len(found) == 3, "every role names its health port in its state file"
    return found


def requests_agree(settings: Settings, role: str, base: str) -> bool:
    """Whether the role's ``billing_storage_requests_total`` equals, kind by kind, the counts
    ``billing status --json`` shows for it (its state file, refreshed every 2 s)."""
    scraped = by_label(scrape(base).get("billing_storage_requests_total", {}), "kind")
    roles: list[dict[str, Any]] = json.loads(billing("status", "--json").stdout)["roles"]
    (state,) = [r for r in roles if r["role"] == role]
    stated = {kind: count for kind, count in state["requests"].items() if kind != "total"}
    return scraped == stated


def test_roles_serve_health_and_metrics_that_match_the_store(
    settings_env: Settings, roles: Roles, tmp_path: Path
) -> None:
    settings = settings_env.model_copy(update={"health_port": 0, "work_item_size": 500, "partitions": 2})
    path = tmp_path / "batch.csv"
    generate(ROWS, path, seed=13, reject_rate=0.02)
    with roles.running(settings):
        bases = endpoints(roles, settings)
        for base in bases.values():
            assert probe(base, "/healthz")[0] == 200
            assert probe(base, "/readyz") == (200, "ok\n")

        submit = [
            sys.executable,
            "-m",
            "billing",
            "submit",
            str(path),
            "--batch-id",
            "probed",
            *sample_flags(tmp_path / "ref"),
        ]
        submit += ["--wait", "--timeout", "300"]  # a batch that never completes fails the test
        with subprocess.Popen(submit, env={**os.environ, **settings.as_env()}) as waiting:
            scrapes = 0
            while waiting.poll() is None:  # mid-batch: every endpoint answers, the metrics parse
                for base in bases.values():
                    assert probe(base, "/healthz")[0] == 200
                    scrape(base)
                    scrapes += 1
            assert waiting.returncode == 0, roles.logs()
        assert scrapes >= 3

        status = json.loads(billing("status", "probed", "--json").stdout)
        assert status["state"] == "complete"
        processor = scrape(bases["processor"])
        assert total(processor["billing_messages_processed_total"], settings.input_queues) == status["work_items"]
        assert total(processor["billing_messages_poisoned_total"], settings.input_queues) == 0
        assert "billing_dequeue_tasks" in processor and "billing_queue_depth" in processor
        initiator = scrape(bases["initiator"])
        assert total(initiator["billing_messages_processed_total"], [settings.requests_queue]) == 1
        controller = scrape(bases["controller"])
        assert controller["billing_batch_latency_seconds_count"][()] == 1
        assert controller["billing_batch_latency_seconds_sum"][()] == pytest.approx(status["latency_seconds"])
        assert total(controller["billing_messages_processed_total"], [settings.results_queue]) >= 1
        for role, base in bases.items():  # scrapes make no request: the counts settle on what the role reports
            assert wait_until(lambda r=role, b=base: requests_agree(settings, r, b), 120, interval=1), role
    assert roles.returncodes == [0, 0, 0]


def test_readiness_follows_storage_through_an_outage(settings_env: Settings, roles: Roles) -> None:
    upstream = settings_env.storage_connection_string
    assert upstream is not None
    with FaultProxy(upstream.get_secret_value()) as proxy:
        settings = settings_env.model_copy(
            update={
                "storage_connection_string": SecretStr(proxy.connection_string),
                "health_port": 0,
                "retry_total": 1,  # an unreachable account is said so in a second, not after the SDK's retries
                "retry_backoff": 0.2,
                "trigger_backend": "none",
            }
        )
        with roles.running(settings):
            bases = endpoints(roles, settings)
            assert all(probe(base, "/readyz")[0] == 200 for base in bases.values())
            proxy.outage(15, kind="reset")
            for base in bases.values():
                status, reason = probe(base, "/readyz")
                assert status == 503 and reason.startswith("storage: "), reason
                assert probe(base, "/healthz")[0] == 200, "the role still lives: it waits the outage out"
            assert wait_until(lambda: all(probe(b, "/readyz")[0] == 200 for b in bases.values()), 120, interval=1)
        assert roles.returncodes == [0, 0, 0]
