"""The cores this process may use: the CPUs it may run on, capped by its cgroup's CPU quota.

``os.cpu_count()`` tells the host's cores. A container or pod with a CPU limit (cgroup v2
``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``) gets only its quota's worth of time,
however many cores it can see: pools sized from the host would hold work they cannot run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF = Path("/proc/self/cgroup")


def available_cpus(*, root: Path = CGROUP_ROOT, membership: Path = SELF) -> int:
    """Whole cores available: the CPUs this process may run on, no more than its CPU quota rounded up."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota(root=root, membership=membership)
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else max(1, cpus)


def cpu_quota(*, root: Path = CGROUP_ROOT, membership: Path = SELF) -> float | None:
    """The tightest CPU quota, in cores, of this process's cgroup and its ancestors (None: no quota)."""
    quotas = [quota for directory in _cgroup_dirs(root, membership) if (quota := _quota(directory)) is not None]
    return min(quotas, default=None)


def _cgroup_dirs(root: Path, membership: Path) -> Iterator[Path]:
    """The directories of this process's CPU cgroup and of its ancestors, v2 and v1 alike."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            mount: Path | None = root  # cgroup v2: one hierarchy
        elif "cpu" in controllers.split(","):
            mount = next((root / name for name in (controllers, "cpu", "cpu,cpuacct") if (root / name).is_dir()), None)
        else:
            mount = None
        if mount is None:
            continue
        relative = Path(path.lstrip("/"))
        for level in [relative, *relative.parents]:
            if (mount / level).is_dir():
                yield mount / level


def _quota(directory: Path) -> float | None:
    """One cgroup's quota in cores, from ``cpu.max`` (v2) or ``cpu.cfs_quota_us`` (v1); None if unlimited."""
    try:
        if (directory / "cpu.max").exists():
            quota, period = (directory / "cpu.max").read_text().split()[:2]
        else:
            quota = (directory / "cpu.cfs_quota_us").read_text().strip()
            period = (directory / "cpu.cfs_period_us").read_text().strip()
    except (OSError, ValueError):
        return None
    if quota == "max" or int(quota) <= 0:
        return None
    return int(quota) / int(period)
