"""How a queue listener paces and scales itself: its settings (:class:`ListenerSettings`), the back-off of its
empty polls (:func:`idle_delay`), and the scale rules that turn the queue's load into a number of dequeue tasks
(``SCALE_RULES``)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..settings import Settings


@dataclass(frozen=True, kw_only=True)
class ListenerSettings:
    """Listener knobs, named as in the whitepaper (docs/configuration.md maps them to ``host.json``)."""

    dequeue_batch_size: int = 32
    visibility_timeout: int = 60
    min_idle_interval: float = 0.0
    max_idle_interval: float = 10.0
    backoff_delta: float = 0.1
    max_dequeue_count: int = 5
    max_tasks: int = 2
    target_drain_seconds: float = 10.0
    push: bool = False
    safety_poll_interval: float = 300.0
    delete_on_receive: bool = False
    prefetch: bool = True
    rescale_interval: float = 1.0  # while full batches come, read the depth again at most this often
    recovery_poll_interval: float = 5.0  # push mode: how often to look while others hold messages

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> ListenerSettings:
        values: dict[str, Any] = {
            "dequeue_batch_size": settings.dequeue_batch_size,
            "visibility_timeout": settings.visibility_timeout,
            "min_idle_interval": settings.min_idle_interval,
            "max_idle_interval": settings.max_idle_interval,
            "backoff_delta": settings.backoff_delta,
            "max_dequeue_count": settings.max_dequeue_count,
            "max_tasks": settings.dequeue_tasks,
            "target_drain_seconds": settings.target_drain_seconds,
            "safety_poll_interval": settings.safety_poll_interval,
            "recovery_poll_interval": settings.recovery_poll_interval,
            "delete_on_receive": settings.delete_on_receive,
        }
        return cls(**{**values, **overrides})


def idle_delay(idle_count: int, settings: ListenerSettings, rng: random.Random = random._inst) -> float:
    """Sleep after the ``idle_count``-th consecutive empty poll, jittered even at the cap."""
    jitter = rng.uniform(0.8, 1.2)
    if at_idle_cap(idle_count, settings):
        return settings.max_idle_interval * jitter
    return settings.min_idle_interval + _doublings(idle_count) * jitter * settings.backoff_delta


def at_idle_cap(idle_count: int, settings: ListenerSettings) -> bool:
    """Whether the back-off has reached ``max_idle_interval`` (ignoring jitter)."""
    growth = _doublings(idle_count) * settings.backoff_delta
    return settings.min_idle_interval + growth >= settings.max_idle_interval


def _doublings(count: int) -> float:
    """``2**count - 1``, the back-off's growth after ``count`` empty polls (bounded: no overflow)."""
    return 2.0 ** min(count, 62) - 1


@dataclass(frozen=True)
class Load:
    """What a scale rule sees: the queue depth and the measured seconds per message (if any yet)."""

    depth: int
    service_time: float | None


#: A scale rule: (load, settings) → wanted number of dequeue tasks (clamped to 1..max_tasks).
ScaleRule = Callable[[Load, ListenerSettings], int]


def drain_rule(load: Load, settings: ListenerSettings) -> int:
    """Enough tasks to drain the backlog within ``target_drain_seconds`` at the measured service
    time; before any measurement, one task per full batch of backlog."""
    if load.service_time is None:
        return math.ceil(load.depth / settings.dequeue_batch_size)
    return math.ceil(load.depth * load.service_time / settings.target_drain_seconds)


def whitepaper_rule(load: Load, settings: ListenerSettings) -> int:
    """The whitepaper's fixed table: < 100 messages → 10 tasks, < 1,000 → 50, else 100."""
    if load.depth < 100:
        return 10
    return 50 if load.depth < 1000 else 100


SCALE_RULES: dict[str, ScaleRule] = {"drain": drain_rule, "whitepaper": whitepaper_rule}


def listener_settings(settings: Settings, *, push: bool, queues: int = 1, **overrides: Any) -> ListenerSettings:
    """Listener settings for one of ``queues`` listeners of an instance: in push mode they share
    the instance's one safety poll per ``safety_poll_interval``, each polling 1/``queues`` as often."""
    base = ListenerSettings.from_settings(settings, **overrides)
    return replace(base, push=push, safety_poll_interval=settings.safety_poll_interval * queues)
