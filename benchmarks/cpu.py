"""CPU time of running process trees, read from ``/proc`` (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

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
