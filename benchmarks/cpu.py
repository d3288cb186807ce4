"""CPU time of running process trees, read from ``/proc`` (Linux)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every live descendant (plus what each has reaped);
    0 for a process that is gone."""
    total = 0.0
    for member in _tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[11:15] are utime, stime, cutime, cstime (fields 14-17 of proc(5), counted from the state).
        total += sum(int(value) for value in fields[11:15]) / _TICKS
    return total


def _tree(pid: int) -> list[int]:
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                pending.extend(int(child) for child in task.read_text().split())
            except OSError:
                continue
    return found


class Sampler:
    """CPU seconds of process trees (by name: trees of one name add up), read every ``interval`` on a thread of its
    own while the ``with`` block runs: :attr:`samples` of (seconds since it began, CPU seconds so far by name). A tree
    that ended keeps the CPU last read of it."""

    def __init__(self, interval: float = 0.1) -> None:
        self._interval = interval
        self._trees: dict[int, str] = {}
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self.began = 0.0  # time.monotonic() as it began
        self.samples: list[tuple[float, dict[str, float]]] = []

    def watch(self, name: str, pid: int) -> None:
        """Sample the tree of ``pid`` as (part of) ``name`` from now on."""
        self._trees[pid] = name

    def __enter__(self) -> Sampler:
        self.began = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def _sample(self) -> None:
        by_name: dict[str, float] = {}
        for pid, name in list(self._trees.items()):
            self._last[pid] = max(self._last.get(pid, 0.0), tree_cpu_seconds(pid))
            by_name[name] = by_name.get(name, 0.0) + self._last[pid]
        self.samples.append((time.monotonic() - self.began, by_name))


def busy(samples: list[tuple[float, dict[str, float]]], spans: list[tuple[str, float, float]]) -> list[dict[str, Any]]:
    """For each span (name, from, to: seconds since sampling began), the cores each sampled name kept busy in it:
    its CPU seconds there (read between the samples around the span's ends) over the span's length."""
    found = []
    for label, begin, end in spans:
        if end <= begin:
            continue
        first, last = _at(samples, begin), _at(samples, end)
        cores = {name: round((last.get(name, 0.0) - first.get(name, 0.0)) / (end - begin), 2) for name in last}
        found.append({"span": label, "from": round(begin, 2), "to": round(end, 2), "cores": cores})
    return found


def _at(samples: list[tuple[float, dict[str, float]]], moment: float) -> dict[str, float]:
    """CPU seconds so far by name at ``moment``, interpolated between the samples around it."""
    after = next((i for i, (at, _) in enumerate(samples) if at >= moment), len(samples) - 1)
    (t1, later), (t0, earlier) = samples[after], samples[max(after - 1, 0)]
    share = 0.0 if t1 <= t0 else min(max((moment - t0) / (t1 - t0), 0.0), 1.0)
    return {name: earlier.get(name, 0.0) + share * (later[name] - earlier.get(name, 0.0)) for name in later}
