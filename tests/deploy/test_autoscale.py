"""``billing autoscale`` with the local overlay's ScaledObjects (rendered by ``kubectl kustomize``, their
queues renamed to the test's prefix): from nothing running, a batch's requests start the initiator,
its backlog of work items scales the processors 0 -> N as KEDA's rule says (N = the largest
ceil(depth / queueLength), at most maxReplicaCount), and after the cooldown every role is back at 0.
The batch is exact. Polling and cooldown are shortened with the command's flags; the numbers that
decide how many processors run (queueLength, maxReplicaCount) are the manifests' own.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from billing.autoscale import ScaleRule, scale_rules
from shared.rules.sample import generate
from shared.settings import Settings
from support.exact import assert_batch_exact, billing
from support.tools import render
from support.waiting import wait_until

ROWS = 20_000
WORK_ITEM_SIZE = 10  # 2,000 work items, 500 a queue: a backlog far past the local queueLength (50) at its peak
POLLING, COOLDOWN = 0.5, 3.0


def local_manifests(settings: Settings, path: Path) -> list[dict[str, Any]]:
    """The local overlay, its KEDA triggers on the test's own queues; written to ``path``."""
    docs = [doc for doc in yaml.safe_load_all(render("local")) if doc]
    for doc in docs:
        for trigger in doc["spec"].get("triggers", []) if doc["kind"] == "ScaledObject" else []:
            name = trigger["metadata"]["queueName"]
            trigger["metadata"]["queueName"] = settings.queue_prefix + name.removeprefix("billing")
    path.write_text(yaml.safe_dump_all(docs))
    return docs


def wanted(rule: ScaleRule, depths: dict[str, int]) -> int:
    """KEDA's azure-queue rule, written out again: the largest ceil(depth / queueLength), within bounds."""
    return min(max(1, *(math.ceil(depths[t.queue] / t.queue_length) for t in rule.triggers)), rule.max_replicas)


def test_a_backlog_scales_processors_out_and_back_to_zero(
    settings_env: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BILLING_WORK_ITEM_SIZE", str(WORK_ITEM_SIZE))
    settings = Settings()
    manifests = tmp_path / "local.yaml"
    rules = {rule.role: rule for rule in scale_rules(local_manifests(settings, manifests))}
    processor = rules["processor"]
    assert processor.max_replicas > 1 and processor.min_replicas == 0
    batch = tmp_path / "batch.csv"
    generate(ROWS, batch, seed=21, reject_rate=0.02)

    events_file = tmp_path / "events.jsonl"
    command = [sys.executable, "-m", "billing", "autoscale", "--manifests", str(manifests)]
    command += ["--events", str(events_file), "--polling-interval", str(POLLING), "--cooldown-period", str(COOLDOWN)]

    def events() -> list[dict[str, Any]]:
        return [json.loads(line) for line in events_file.read_text().splitlines()] if events_file.exists() else []

    def at_rest() -> bool:
        last = {e["role"]: e for e in events()}
        return len(last) == 3 and all(e["replicas"] == 0 and not e["active"] for e in last.values())

    with (tmp_path / "autoscale.log").open("wb") as log:
        scaler = subprocess.Popen(command, env=os.environ, stdout=log, stderr=log)
    try:
        assert wait_until(lambda: len(events()) >= 6, 60), "the scaler polls"
        assert at_rest(), "nothing queued: nothing runs"
        billing("submit", str(batch), "--batch-id", "scaled", "--wait", "--timeout", "300")
        started = len(events())
        assert wait_until(lambda: at_rest() and len(events()) > started + 6, 120), "back to zero after the cooldown"
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=120)
    assert scaler.returncode == 0
    assert_batch_exact("scaled", batch)

    decisions = [e for e in events() if e["role"] == "processor"]
    for event in decisions:
        if event["active"]:  # up at once to the rule's number; down no faster than the HPA's window allows
            assert wanted(processor, event["depths"]) <= event["replicas"] <= processor.max_replicas, event
    peak = max(decisions, key=lambda e: wanted(processor, e["depths"]) if e["active"] else 0)
    assert wanted(processor, peak["depths"]) == processor.max_replicas, "the backlog asked for every processor"
    assert peak["replicas"] == processor.max_replicas
    assert len({pid for e in decisions for pid in e["pids"]}) >= processor.max_replicas, "as many processes ran"

    for role in rules:
        mine = [e for e in events() if e["role"] == role]
        assert mine[0]["replicas_before"] == 0 and max(e["replicas"] for e in mine) >= 1, role
        last_active = max(e["time"] for e in mine if e["active"])
        to_zero = [e for e in mine if e["replicas_before"] > 0 and e["replicas"] == 0]
        assert to_zero and all(not e["active"] for e in to_zero), role
        assert to_zero[-1]["time"] - last_active >= COOLDOWN, role
