"""The cores a process may use, from its cgroup's CPU quota (files laid out as the kernel shows them)."""

from __future__ import annotations

import os
from pathlib import Path

from shared.cpus import available_cpus, cpu_quota


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_takes_the_tightest_quota_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    membership = tmp_path / "cgroup"
    membership.write_text("0::/pods/pod-a/processor\n")
    _write(tmp_path / "pods" / "cpu.max", "max 100000\n")
    _write(tmp_path / "pods" / "pod-a" / "cpu.max", "50000 100000\n")
    _write(tmp_path / "pods" / "pod-a" / "processor" / "cpu.max", "150000 100000\n")
    assert cpu_quota(root=tmp_path, membership=membership) == 0.5
    assert available_cpus(root=tmp_path, membership=membership) == 1


def test_cgroup_v1_reads_the_cfs_quota_of_the_cpu_controller(tmp_path: Path) -> None:
    membership = tmp_path / "cgroup"
    membership.write_text("5:memory:/job\n4:cpu,cpuacct:/job\n0::/\n")
    _write(tmp_path / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    _write(tmp_path / "cpu,cpuacct" / "job" / "cpu.cfs_quota_us", "15000\n")
    _write(tmp_path / "cpu,cpuacct" / "job" / "cpu.cfs_period_us", "100000\n")
    assert cpu_quota(root=tmp_path, membership=membership) == 0.15
    assert available_cpus(root=tmp_path, membership=membership) == 1


def test_no_quota_leaves_the_cpus_the_process_may_run_on(tmp_path: Path) -> None:
    membership = tmp_path / "cgroup"
    membership.write_text("0::/free\n")
    _write(tmp_path / "free" / "cpu.max", "max 100000\n")
    assert cpu_quota(root=tmp_path, membership=membership) is None
    assert available_cpus(root=tmp_path, membership=membership) == len(os.sched_getaffinity(0))
    assert available_cpus(root=tmp_path, membership=tmp_path / "missing") == len(os.sched_getaffinity(0))


def test_a_quota_above_the_cpus_is_capped_by_them(tmp_path: Path) -> None:
    membership = tmp_path / "cgroup"
    membership.write_text("0::/\n")
    cpus = len(os.sched_getaffinity(0))
    _write(tmp_path / "cpu.max", f"{(cpus + 3) * 100000} 100000\n")
    assert cpu_quota(root=tmp_path, membership=membership) == cpus + 3
    assert available_cpus(root=tmp_path, membership=membership) == cpus
