"""The processor's rating workers never outlive it: killed with SIGKILL, its pool cannot shut down,
so each worker watches its owner and exits (real processes, the processor's own pool set-up)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from support.waiting import wait_until

OWNER = """
import multiprocessing, os, sys
from concurrent.futures import ProcessPoolExecutor
from processor.jobs import exit_with

pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("forkserver"),
                           initializer=exit_with, initargs=(os.getpid(), 0.2))
print(*sorted({pool.submit(os.getpid).result() for _ in range(20)}), flush=True)
sys.stdin.read()  # until killed
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_workers_exit_when_their_owner_is_killed() -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    workers = [int(pid) for pid in owner.stdout.readline().split()]
    assert workers and all(alive(pid) for pid in workers) and owner.pid not in workers
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert wait_until(lambda: not any(alive(pid) for pid in workers), 10, interval=0.1), "orphaned rating workers"
