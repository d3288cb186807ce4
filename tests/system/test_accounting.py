"""Request accounting reconciles: what the program counts (every role's request counter plus the
submitting client's) equals, kind by kind, what Azurite itself logged receiving (its ``--debug`` log)."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from datetime import datetime
from pathlib import Path

from pydantic import SecretStr

from billing import client, progress
from billing.sample import generate
from shared.messaging.storage import request_kind
from shared.settings import Settings
from store import Store
from support.azurite import running_azurite
from support.exact import billing
from support.references import sample_options
from support.roles import Roles
from support.waiting import wait_until

# One line per request Azurite received: which service middleware, the method and the URL.
REQUEST = re.compile(r"(Queue|Blob)StorageContextMiddleware: RequestMethod=(\w+) RequestURL=(\S+)")


def azurite_saw(debug_log: Path) -> Counter[str]:
    """Requests by kind, as Azurite logged them."""
    seen: Counter[str] = Counter()
    for service, method, url in REQUEST.findall(debug_log.read_text(errors="replace")):
        seen[request_kind(service.lower(), method, url)] += 1
    return seen


def test_counted_requests_equal_what_azurite_received(settings_env: Settings, roles: Roles, tmp_path: Path) -> None:
    debug_log = tmp_path / "azurite-debug.log"
    batch = tmp_path / "batch.csv"
    generate(5_000, batch, seed=3)
    with running_azurite(tmp_path / "azurite", persist=False, debug_log=debug_log) as stack:
        settings = settings_env.model_copy(
            update={"storage_connection_string": SecretStr(stack.connection_string() or "")}
        )
        with roles.running(settings):
            submission = asyncio.run(
                client.submit(settings, batch, batch_id="counted", **sample_options(tmp_path / "ref"))
            )
            with Store(settings.sql_url_value) as store:
                status = progress.wait_for(store, "counted", timeout=120)
            assert status is not None and status.completed_at is not None

            def refreshed_since_complete() -> bool:  # every role's state written after its last request
                states = [roles.state(index) for index in range(len(roles.processes))]
                return all(
                    s is not None and datetime.fromisoformat(s["updated_at"]) > status.completed_at for s in states
                )

            assert wait_until(refreshed_since_complete, 30, interval=0.2)
            live = json.loads(billing("status", "--json").stdout)
        assert status is not None and status.state == "complete"
        assert roles.returncodes == [0, 0, 0]
        seen = azurite_saw(debug_log)

    counted: Counter[str] = Counter(submission.requests)
    states = [json.loads(path.read_text()) for path in (settings.home / "state").glob("*.json")]
    assert sorted(state["role"] for state in states) == ["controller", "initiator", "processor"]
    assert [b["batch_id"] for b in live["batches"]] == ["counted"]
    assert sorted(r["role"] for r in live["roles"]) == ["controller", "initiator", "processor"]
    for running in live["roles"]:  # `billing status` shows each live role's counts; they only grow
        final = next(state for state in states if state["pid"] == running["pid"])
        assert 0 < running["requests"]["total"] <= final["requests"]["total"]
    for state in states:
        counted.update(state["requests"])
    total = counted.pop("total")
    assert dict(counted) == dict(seen)
    assert total == seen.total() > 0
    assert counted["queue.send"] >= status.work_items, "every work item was sent, and counted"
