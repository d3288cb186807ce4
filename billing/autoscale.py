"""``billing autoscale``: KEDA's ``azure-queue`` rule applied to local role processes.

It reads the same ``ScaledObject`` manifests a cluster gets (deploy/kubernetes) and does what KEDA
and the Horizontal Pod Autoscaler do with them, with processes in place of pods:

- every ``pollingInterval`` it reads each trigger's queue depth (``queueLengthStrategy`` ``all``:
  the approximate count, invisible messages included; ``visibleonly``: a peek, the approximate count
  from 32 on);
- a role is *active* while any of its queues holds more than ``activationQueueLength``; an inactive
  role whose last activity is ``cooldownPeriod`` old goes to ``minReplicaCount`` (0: no process);
- an active role gets ``ceil(depth / queueLength)`` replicas for its deepest-relative queue (the HPA
  takes the largest of its metrics), at least one and at most ``maxReplicaCount``; fewer only once
  every recommendation of the last ``stabilizationWindowSeconds`` (the HPA's ``scaleDown`` window,
  300 s unless the manifest says) allows it.

A role's processes are ``python -m <role>`` (:func:`billing.demo.start_role`), the role named by its
Deployment's container ``args``; scaling in sends SIGTERM to the newest, which finishes what it holds.
What KEDA leaves to Kubernetes (the HPA's 10 % tolerance, its rate policies) is left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from shared.errors import ConfigurationError
from shared.messaging.storage import Storage
from shared.settings import Settings

from .demo import start_role

log = logging.getLogger(__name__)

ROLES = ("initiator", "processor", "controller")
HPA_SCALE_DOWN_WINDOW = 300.0  # seconds: Kubernetes' default scaleDown stabilizationWindowSeconds
PEEK_LIMIT = 32  # KEDA's visibleonly strategy peeks at most this many messages


@dataclass(frozen=True)
class QueueTrigger:
    """One ``azure-queue`` trigger of a ScaledObject."""

    queue: str
    queue_length: int = 5  # KEDA's defaults
    activation: int = 0
    strategy: Literal["all", "visibleonly"] = "all"


@dataclass(frozen=True)
class ScaleRule:
    """One ScaledObject: the role it scales and how."""

    name: str
    role: str
    triggers: tuple[QueueTrigger, ...]
    polling_interval: float = 30.0
    cooldown_period: float = 300.0
    min_replicas: int = 0
    max_replicas: int = 100
    scale_down_window: float = HPA_SCALE_DOWN_WINDOW

    def active(self, depths: Mapping[str, int]) -> bool:
        """Whether any queue holds more than its activation threshold."""
        return any(depths[t.queue] > t.activation for t in self.triggers)

    def wanted(self, depths: Mapping[str, int]) -> int:
        """The HPA's recommendation while active: the largest ``ceil(depth / queueLength)``, clamped."""
        wanted = max(math.ceil(depths[t.queue] / t.queue_length) for t in self.triggers)
        return min(max(wanted, self.min_replicas, 1), self.max_replicas)


def read_manifests(path: Path) -> list[dict[str, Any]]:
    """Every YAML document of ``path``: a rendered file, a kustomization (rendered with
    ``kubectl kustomize``) or a folder of plain manifests (every ``*.yaml`` below it)."""
    if path.is_dir() and (path / "kustomization.yaml").exists():
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise ConfigurationError(f"{path} is a kustomization: render it with `kubectl kustomize {path} > FILE`")
        text = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, check=True).stdout
        texts = [text]
    elif path.is_dir():
        texts = [p.read_text() for p in sorted(path.rglob("*.y*ml"))]
    else:
        texts = [path.read_text()]
    return [doc for text in texts for doc in yaml.safe_load_all(text) if isinstance(doc, dict)]


def scale_rules(manifests: Iterable[Mapping[str, Any]]) -> list[ScaleRule]:
    """The ScaledObjects of ``manifests`` whose target is a role's Deployment, as rules."""
    docs = list(manifests)
    roles = {
        doc["metadata"]["name"]: doc["spec"]["template"]["spec"]["containers"][0].get("args", [None])[0]
        for doc in docs
        if doc.get("kind") == "Deployment"
    }
    rules = []
    for doc in docs:
        if doc.get("kind") != "ScaledObject":
            continue
        spec = doc["spec"]
        target = spec["scaleTargetRef"]["name"]
        if roles.get(target) not in ROLES:
            raise ConfigurationError(f"ScaledObject {doc['metadata']['name']}: {target} is no role's Deployment")
        scale_down = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior", {})
        rules.append(
            ScaleRule(
                name=doc["metadata"]["name"],
                role=roles[target],
                triggers=tuple(_trigger(t["metadata"]) for t in spec["triggers"] if t["type"] == "azure-queue"),
                polling_interval=float(spec.get("pollingInterval", 30)),
                cooldown_period=float(spec.get("cooldownPeriod", 300)),
                min_replicas=int(spec.get("minReplicaCount", 0)),
                max_replicas=int(spec.get("maxReplicaCount", 100)),
                scale_down_window=float(
                    scale_down.get("scaleDown", {}).get("stabilizationWindowSeconds", HPA_SCALE_DOWN_WINDOW)
                ),
            )
        )
    return rules


def _trigger(metadata: Mapping[str, str]) -> QueueTrigger:
    return QueueTrigger(
        queue=metadata["queueName"],
        queue_length=int(metadata.get("queueLength", 5)),
        activation=int(metadata.get("activationQueueLength", 0)),
        strategy="visibleonly" if metadata.get("queueLengthStrategy") == "visibleonly" else "all",
    )


def retimed(rules: Iterable[ScaleRule], *, polling: float | None, cooldown: float | None) -> list[ScaleRule]:
    """``rules`` with another polling interval and cooldown period, where given (to watch it quicker)."""
    return [
        replace(
            rule,
            polling_interval=rule.polling_interval if polling is None else polling,
            cooldown_period=rule.cooldown_period if cooldown is None else cooldown,
        )
        for rule in rules
    ]


def check_queues(rules: Iterable[ScaleRule], settings: Settings) -> None:
    """Refuse a trigger on a queue this configuration does not use (another prefix or partitioning)."""
    known = set(settings.all_queues)
    for rule in rules:
        for trigger in rule.triggers:
            if trigger.queue not in known:
                raise ConfigurationError(
                    f"ScaledObject {rule.name} scales on {trigger.queue}, which is no queue of this configuration "
                    f"(BILLING_QUEUE_PREFIX={settings.queue_prefix}, BILLING_PARTITIONS={settings.partitions})"
                )


@dataclass
class _Scaled:
    """The processes of one rule and what the scaler remembers about them."""

    rule: ScaleRule
    running: list[subprocess.Popen[bytes]] = field(default_factory=list)
    stopping: list[subprocess.Popen[bytes]] = field(default_factory=list)
    last_active: float | None = None
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    next_poll: float = 0.0


class Autoscaler:
    """Scales the role processes of ``rules`` on ``settings``' queues until :meth:`stop`."""

    def __init__(
        self, rules: list[ScaleRule], settings: Settings, *, log_dir: Path, events: Path | None = None
    ) -> None:
        check_queues(rules, settings)
        self.settings = settings
        self.log_dir = log_dir
        self.events = events
        self._scaled = [_Scaled(rule) for rule in rules]
        self._env = {**os.environ, **settings.as_env()}
        self._started = 0
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Poll and scale until stopped; then stop every role process (SIGTERM) and wait for them."""
        log_dir = self.log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        try:
            async with Storage(self.settings) as storage:
                await storage.ensure_all()
                while not self._stop.is_set():
                    now = time.monotonic()
                    for scaled in self._scaled:
                        self._reap(scaled)
                        if now >= scaled.next_poll:
                            scaled.next_poll = now + scaled.rule.polling_interval
                            depths = await self._depths(storage, scaled.rule)
                            self._scale(scaled, depths, time.monotonic())
                    wake = min(s.next_poll for s in self._scaled) if self._scaled else now + 1
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), timeout=max(0.05, wake - time.monotonic()))
        finally:
            await asyncio.to_thread(self._stop_all)

    async def _depths(self, storage: Storage, rule: ScaleRule) -> dict[str, int]:
        depths = {}
        for trigger in rule.triggers:
            queue = storage.queue(trigger.queue)
            depth = -1
            if trigger.strategy == "visibleonly":
                depth = len(await queue.peek_messages(max_messages=PEEK_LIMIT))
            if depth == -1 or depth >= PEEK_LIMIT:
                depth = (await queue.get_queue_properties()).approximate_message_count or 0
            depths[trigger.queue] = depth
        return depths

    def _scale(self, scaled: _Scaled, depths: dict[str, int], now: float) -> None:
        rule, current = scaled.rule, len(scaled.running)
        active = rule.active(depths)
        if active:
            scaled.last_active = now
        cooled = scaled.last_active is None or now - scaled.last_active >= rule.cooldown_period
        if not active and cooled:  # KEDA's part: idle past the cooldown -> minReplicaCount
            scaled.recommendations.clear()
            desired = rule.min_replicas
        elif current == 0 and not active:  # nothing to keep: stay where KEDA left it
            desired = rule.min_replicas
        else:  # the HPA's part: scale up at once, down only as far as the window's recommendations allow
            recommendation = rule.wanted(depths) if active else max(rule.min_replicas, 1)
            scaled.recommendations.append((now, recommendation))
            while scaled.recommendations[0][0] < now - rule.scale_down_window:
                scaled.recommendations.popleft()
            desired = max(r for _, r in scaled.recommendations)
        for _ in range(desired - current):
            self._started += 1
            log_file = self.log_dir / f"{rule.role}-{self._started}.log"
            scaled.running.append(start_role(rule.role, self._env, log_file))
        for _ in range(current - desired):
            process = scaled.running.pop()
            process.send_signal(signal.SIGTERM)
            scaled.stopping.append(process)
        if desired != current:
            log.info("%s: %d -> %d replicas (depths %s)", rule.name, current, desired, depths)
        self._record(
            {
                "time": now,  # monotonic seconds: what the cooldown and windows are measured in
                "scaled_object": rule.name,
                "role": rule.role,
                "depths": depths,
                "active": active,
                "replicas_before": current,
                "replicas": desired,
                "pids": [p.pid for p in scaled.running],
            }
        )

    def _record(self, event: dict[str, Any]) -> None:
        if self.events is not None:
            with self.events.open("a") as out:
                out.write(json.dumps(event) + "\n")

    @staticmethod
    def _reap(scaled: _Scaled) -> None:
        """Forget processes that have exited: a stopped one, or one that died (started again at the next poll,
        as a Deployment replaces a failed pod)."""
        scaled.stopping = [p for p in scaled.stopping if p.poll() is None]
        for process in [p for p in scaled.running if p.poll() is not None]:
            log.warning("%s: process %d exited with %s", scaled.rule.role, process.pid, process.returncode)
            scaled.running.remove(process)

    def _stop_all(self) -> None:
        processes = [p for s in self._scaled for p in (*s.running, *s.stopping)]
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=self.settings.shutdown_deadline + 15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def run(rules: list[ScaleRule], settings: Settings, *, log_dir: Path, events: Path | None = None) -> None:
    """Run an :class:`Autoscaler` until SIGINT or SIGTERM."""
    scaler = Autoscaler(rules, settings, log_dir=log_dir, events=events)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, scaler.stop)
    await scaler.run()
