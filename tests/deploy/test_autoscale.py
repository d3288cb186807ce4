"""``billing autoscale`` with the local overlay's ScaledObjects (rendered by ``kubectl kustomize``, their
queues renamed to the test's prefix). A batch debatched while nothing runs leaves a backlog of work
items; the scaler's first look at it takes the processors 0 -> N as KEDA's rule says (N = the
largest ceil(depth / queueLength), at most maxReplicaCount), a second batch's request starts the
initiator 0 -> 1, results start the controller, and after the cooldown every role is back at 0.
Both batches are exact. Polling and cooldown are shortened with the command's flags; the numbers
that decide how many processes run (queueLength, maxReplicaCount) are the manifests' own. Beside it,
the rule itself on small hand-written ScaledObjects, and the processor's rule in the base and each
overlay as rendered: one 1,000,000-row batch asks for a processor per input queue or more, its
queueLength is what one replica holds of a queue, and ``billing autoscale`` decides as KEDA would.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from billing.autoscale import QueueTrigger, ScaleRule, check_queues, read_manifests, scale_rules
from billing.sample import generate
from shared.errors import ConfigurationError
from shared.settings import Settings
from support.exact import assert_batch_exact, billing
from support.references import sample_flags
from support.roles import Roles
from support.tools import KUBERNETES, OVERLAYS, render, require
from support.waiting import wait_until

ROWS = 3_000
#: 300 work items, 75 a queue: far more than maxReplicaCount processors' worth at the local queueLength (4 x 2);
#: carrying their rows in the message (an inbox frame holds some 200 rows, too many for so small an item).
WORK_ITEM_SIZE = 10
POLLING, COOLDOWN = 0.5, 3.0
#: A 1,000,000-row file's work items (whole inbox frames of at least BILLING_WORK_ITEM_SIZE rows), and the
#: fewest processor replicas the scaling rule must ask for it: one per input queue.
BIG_BATCH_ITEMS, BIG_BATCH_REPLICAS = 22, 4
#: Work items a processor holds per rating worker beyond the one it rates (BILLING_PREFETCH_PER_WORKER's default).
PREFETCH_PER_WORKER = int(Settings.model_fields["prefetch_per_worker"].default)
SOURCES = {"base": KUBERNETES / "base", **{overlay: KUBERNETES / "overlays" / overlay for overlay in OVERLAYS}}


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


@cache
def kustomized(source: str) -> tuple[dict[str, Any], ...]:
    """``kubectl kustomize`` of the base or an overlay: what a cluster (and KEDA) gets."""
    kubectl = require("kubectl", "renders the Kubernetes base and overlays; pip install -e '.[test]' brings it")
    done = subprocess.run([kubectl, "kustomize", str(SOURCES[source])], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def spread(items: int, queues: Sequence[str]) -> dict[str, int]:
    """Each queue's depth once ``items`` work items are sent round-robin over ``queues``."""
    return {queue: len(range(i, items, len(queues))) for i, queue in enumerate(queues)}


def processor_objects(docs: Sequence[Mapping[str, Any]]) -> tuple[dict[str, str], Any, Any]:
    """The processor's settings (its ConfigMap), its Deployment's container and its ScaledObject."""
    (deployment,) = [
        d
        for d in docs
        if d["kind"] == "Deployment" and d["spec"]["template"]["spec"]["containers"][0].get("args") == ["processor"]
    ]
    (scaled,) = [
        d
        for d in docs
        if d["kind"] == "ScaledObject" and d["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    ]
    (config,) = [d["data"] for d in docs if d["kind"] == "ConfigMap" and "BILLING_PARTITIONS" in d.get("data", {})]
    return config, deployment["spec"]["template"]["spec"]["containers"][0], scaled


def keda_replicas(scaled_object: Mapping[str, Any], depths: Mapping[str, int]) -> int:
    """KEDA and the HPA on an active ScaledObject, read straight from the manifest: per azure-queue trigger
    ceil(depth / queueLength) (KEDA's default 5), the largest, at least 1 and minReplicaCount (0), at most
    maxReplicaCount (100). Depths count every message, being worked on or not (queueLengthStrategy "all")."""
    spec = scaled_object["spec"]
    asked = []
    for trigger in spec["triggers"]:
        assert trigger["type"] == "azure-queue"
        metadata = trigger["metadata"]
        assert metadata.get("queueLengthStrategy", "all") == "all", "invisible messages must count"
        asked.append(math.ceil(depths[metadata["queueName"]] / int(metadata.get("queueLength", "5"))))
    return min(max(1, spec.get("minReplicaCount", 0), *asked), spec.get("maxReplicaCount", 100))


def cores(quantity: str) -> float:
    """A Kubernetes CPU quantity ("2", "500m") in cores."""
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


@pytest.mark.parametrize("source", list(SOURCES))
def test_one_big_batch_asks_for_a_processor_per_input_queue(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1,000,000-row batch, round-robin over the input queues the manifests configure, asks KEDA for
    at least BIG_BATCH_REPLICAS processors; ``billing autoscale``, reading the same kustomization,
    decides the same number."""
    docs = kustomized(source)
    config, _, scaled = processor_objects(docs)
    settings = Settings(queue_prefix=config["BILLING_QUEUE_PREFIX"], partitions=int(config["BILLING_PARTITIONS"]))
    depths = spread(BIG_BATCH_ITEMS, settings.input_queues)
    assert sum(depths.values()) == BIG_BATCH_ITEMS and max(depths.values()) - min(depths.values()) <= 1
    asked = keda_replicas(scaled, depths)
    assert asked >= BIG_BATCH_REPLICAS, (source, depths, asked)

    kubectl = require("kubectl", "billing autoscale renders kustomizations with it")
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(kubectl).parent), os.environ.get("PATH", "")]))
    (rule,) = [rule for rule in scale_rules(read_manifests(SOURCES[source])) if rule.role == "processor"]
    assert rule.active(depths) and rule.wanted(depths) == asked
    assert wanted(rule, depths) == asked  # and the rule as this module writes it out


@pytest.mark.parametrize("source", list(SOURCES))
def test_the_processor_queue_length_is_what_one_replica_holds_of_a_queue(source: str) -> None:
    """queueLength = what one replica holds at once (rating workers x (1 + prefetch)) over the input
    queues, rounded up to a whole message: KEDA asks for a replica per that many messages in the
    deepest queue. The workers are set (not left to follow the container's CPU limit) and fit within
    it."""
    config, container, scaled = processor_objects(kustomized(source))
    workers = int(config["BILLING_CPU_WORKERS"])
    assert 1 <= workers <= cores(container["resources"]["limits"]["cpu"])
    held = workers * (1 + int(config.get("BILLING_PREFETCH_PER_WORKER", PREFETCH_PER_WORKER)))
    per_queue = math.ceil(held / int(config["BILLING_PARTITIONS"]))
    lengths = {t["metadata"]["queueName"]: int(t["metadata"]["queueLength"]) for t in scaled["spec"]["triggers"]}
    assert len(lengths) == int(config["BILLING_PARTITIONS"])
    assert set(lengths.values()) == {per_queue}, (source, held, lengths)


def deployment(name: str, role: str) -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"containers": [{"args": [role]}]}}},
    }


def scaled_object(target: str, *queues: str, **spec: Any) -> dict[str, Any]:
    triggers = [{"type": "azure-queue", "metadata": {"queueName": queue}} for queue in queues]
    return {
        "kind": "ScaledObject",
        "metadata": {"name": target},
        "spec": {"scaleTargetRef": {"name": target}, "triggers": triggers, **spec},
    }


def test_keda_defaults_hold_where_a_scaled_object_is_silent() -> None:
    (rule,) = scale_rules([deployment("p", "processor"), scaled_object("p", "billing-input-0")])
    assert (rule.role, rule.polling_interval, rule.cooldown_period, rule.min_replicas, rule.max_replicas) == (
        "processor",
        30,
        300,
        0,
        100,
    )
    assert rule.scale_down_window == 300  # the HPA's own default
    assert rule.triggers == (QueueTrigger("billing-input-0", queue_length=5, activation=0, strategy="all"),)


def test_the_rule_takes_the_deepest_queue_within_bounds() -> None:
    docs = [deployment("p", "processor"), scaled_object("p", "q-0", "q-1", maxReplicaCount=8)]
    docs[1]["spec"]["triggers"][1]["metadata"] |= {"queueLength": "50", "activationQueueLength": "10"}
    (rule,) = scale_rules(docs)
    assert not rule.active({"q-0": 0, "q-1": 10}) and rule.active({"q-0": 1, "q-1": 0})
    assert rule.wanted({"q-0": 1, "q-1": 0}) == 1  # ceil(1 / 5)
    assert rule.wanted({"q-0": 0, "q-1": 101}) == 3  # ceil(101 / 50)
    assert rule.wanted({"q-0": 12, "q-1": 101}) == 3 and rule.wanted({"q-0": 16, "q-1": 0}) == 4
    assert rule.wanted({"q-0": 10_000, "q-1": 0}) == 8  # maxReplicaCount


def test_a_scaled_object_must_name_a_role_and_its_queues(settings_env: Settings) -> None:
    with pytest.raises(ConfigurationError, match="no role's Deployment"):
        scale_rules([deployment("web", "serve"), scaled_object("web", "billing-results")])
    rules = scale_rules([deployment("c", "controller"), scaled_object("c", "billing-results")])
    with pytest.raises(ConfigurationError, match="no queue of this configuration"):
        check_queues(rules, settings_env)  # the test's settings have a queue prefix of their own
    check_queues(rules, settings_env.model_copy(update={"queue_prefix": "billing"}))


@pytest.mark.slow  # about 1.5 min: two batches of a thousand tiny work items, each role's cooldown
def test_a_backlog_scales_processors_out_and_back_to_zero(
    settings_env: Settings, roles: Roles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BILLING_WORK_ITEM_SIZE", str(WORK_ITEM_SIZE))
    monkeypatch.setenv("BILLING_WORK_ITEM_ROWS", "message")
    settings = Settings()
    manifests = tmp_path / "local.yaml"
    rules = {rule.role: rule for rule in scale_rules(local_manifests(settings, manifests))}
    processor = rules["processor"]
    assert processor.max_replicas > 1 and processor.min_replicas == 0
    batches = {name: tmp_path / f"{name}.csv" for name in ("backlog", "later")}
    for seed, path in enumerate(batches.values(), start=21):
        generate(ROWS, path, seed=seed, reject_rate=0.02)
    billing("submit", str(batches["backlog"]), "--batch-id", "backlog", *sample_flags(tmp_path / "ref"))
    roles.burst("initiator", settings)  # its work items wait in the input queues; nothing rates them yet

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
        billing(
            "submit",
            str(batches["later"]),
            "--batch-id",
            "later",
            "--wait",
            "--timeout",
            "300",
            *sample_flags(tmp_path / "ref"),
        )
        billing(
            "submit",
            str(batches["backlog"]),
            "--batch-id",
            "backlog",
            "--wait",
            "--timeout",
            "300",
            *sample_flags(tmp_path / "ref"),
        )
        started = len(events())
        assert wait_until(lambda: at_rest() and len(events()) > started + 6, 120), "back to zero after the cooldown"
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=120)
    assert scaler.returncode == 0
    for name, path in batches.items():
        assert_batch_exact(name, path)

    decisions = [e for e in events() if e["role"] == "processor"]
    first = next(e for e in decisions if e["active"])
    assert wanted(processor, first["depths"]) == processor.max_replicas, "the backlog asks for every processor"
    assert (first["replicas_before"], first["replicas"]) == (0, processor.max_replicas), "0 -> N in one step"
    for event in decisions:
        if event["active"]:  # up at once to the rule's number; down no faster than the HPA's window allows
            assert wanted(processor, event["depths"]) <= event["replicas"] <= processor.max_replicas, event
    assert len({pid for e in decisions for pid in e["pids"]}) >= processor.max_replicas, "as many processes ran"

    for role in rules:
        mine = [e for e in events() if e["role"] == role]
        assert mine[0]["replicas_before"] == 0 and max(e["replicas"] for e in mine) >= 1, role
        last_active = max(e["time"] for e in mine if e["active"])
        to_zero = [e for e in mine if e["replicas_before"] > 0 and e["replicas"] == 0]
        assert to_zero and all(not e["active"] for e in to_zero), role
        assert to_zero[-1]["time"] - last_active >= COOLDOWN, role
