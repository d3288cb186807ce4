"""The processor's rating workers (real processes, the processor's own pool): they never outlive it,
and one that dies (killed, out of memory) is replaced without losing or poisoning work."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from billing.sample import generate
from processor.pool import RatingPool
from shared.settings import Settings
from store import Store
from support.exact import assert_batch_exact, billing
from support.queues import input_depth
from support.references import sample_flags
from support.roles import Roles
from support.waiting import wait_until, wait_until_async

OWNER = """
import asyncio, os, sys
from processor.pool import RatingPool

async def pids(pool):
    return set(await asyncio.gather(*(pool.run(os.getpid) for _ in range(20))))

pool = RatingPool(2, owner_check=0.2)
print(*sorted(asyncio.run(pids(pool))), flush=True)
sys.stdin.read()  # until killed
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or going while read
        return False


def children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").glob("*/children") for child in task.read_text().split()]


def test_workers_exit_when_their_owner_is_killed_and_remove_its_spool(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # where its spool is left
    )
    assert owner.stdout is not None
    workers = [int(pid) for pid in owner.stdout.readline().split()]
    assert workers and all(alive(pid) for pid in workers) and owner.pid not in workers
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert wait_until(lambda: not any(alive(pid) for pid in workers), 10, interval=0.1), "orphaned rating workers"
    assert not list(tmp_path.glob("billing-rating-*")), "the killed owner's spool is left behind"


def dies_while_returning(marker: str, delay: float, size: int) -> tuple[int, bool, bytes]:
    """A job whose worker SIGKILLs itself ``delay`` seconds after the job starts, the first time it is
    tried (``marker`` then exists): the kill lands while the ``size``-byte result is being made,
    written or handed back, or while the worker is idle after it. Returns the worker's pid, whether
    this try armed the kill, and the result."""
    armed = not os.path.exists(marker)
    if armed:
        Path(marker).touch()
        threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
    return os.getpid(), armed, bytes(size)


async def test_a_worker_killed_at_any_moment_of_handing_back_a_large_result_never_hangs_the_pool(
    tmp_path: Path,
) -> None:
    size = 16 << 20  # a result that takes a few milliseconds to hand back
    pool = RatingPool(1)
    try:
        for attempt in range(25):
            marker = str(tmp_path / str(attempt))
            pid, armed, result = await asyncio.wait_for(
                pool.run(dies_while_returning, marker, attempt * 0.004, size), 60
            )
            assert len(result) == size
            if armed:
                # The result was back before the kill, which lands on the idle worker: the next run finds
                # the pool broken and pays its one replacement for it (here, before the next attempt,
                # whose own kill would otherwise be a second break in one run).
                async with asyncio.timeout(30):
                    await wait_until_async(lambda worker=pid: not alive(worker), interval=0.01)
                assert await asyncio.wait_for(pool.run(os.getpid), 60) != pid
    finally:
        pool.shutdown()


async def test_rating_workers_run_lower_in_cpu_priority_than_their_owner() -> None:
    pool = RatingPool(2, niceness=3)
    try:
        niceness = set(await asyncio.gather(*(pool.run(os.nice, 0) for _ in range(8))))
    finally:
        pool.shutdown()
    assert niceness == {min(os.nice(0) + 3, 19)}


def test_a_killed_rating_worker_is_replaced_and_the_batch_stays_exact(
    settings_env: Settings, roles: Roles, tmp_path: Path
) -> None:
    settings = settings_env.model_copy(update={"work_item_size": 500, "dequeue_batch_size": 4})
    batch = tmp_path / "batch.csv"
    generate(60_000, batch, seed=5, reject_rate=0.01)
    with roles.running(settings), Store(settings.sql_url_value) as store:
        assert roles.wait_up()
        processor = roles.processes[roles.names.index("processor")].pid
        # The processor's children: its fork server, whose children are the rating workers.
        workers = [worker for server in children(processor) for worker in children(server)]
        assert len(workers) == settings.cpu_workers, workers
        niceness = min(os.getpriority(os.PRIO_PROCESS, processor) + settings.rating_niceness, 19)
        assert {os.getpriority(os.PRIO_PROCESS, worker) for worker in workers} == {niceness}
        billing("submit", str(batch), "--batch-id", "workers", *sample_flags(tmp_path / "ref"))

        depths: list[int] = []

        def mid_batch() -> bool:
            """The processor has taken items, and enough still wait that its pool must run more after
            the kill (so the replacement is certain, whatever the load)."""
            depths.append(asyncio.run(input_depth(settings)))
            return 8 <= depths[-1] < max(depths)

        assert wait_until(mid_batch, 120, interval=0.02)
        for worker in workers:
            os.kill(worker, signal.SIGKILL)
        assert wait_until(lambda: (s := store.batch("workers")) is not None and s.state == "complete", 180)
    assert roles.returncodes == [0, 0, 0]
    assert "a rating worker died; starting" in roles.logs()["processor-1.log"]
    assert_batch_exact("workers", batch)
