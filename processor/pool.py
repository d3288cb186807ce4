"""The processor's rating workers: a pool of processes that survives losing one of them."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import pickle
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from shared.messaging.processes import pid_alive

log = logging.getLogger(__name__)

T = TypeVar("T")

PRELOAD = ["processor.jobs", "processor.warm"]  # what the fork server imports once, for every worker forked from it


class RatingPool:
    """``workers`` rating processes, started now (not when the first work item waits for them):
    forks of a fork server that imported :mod:`processor.jobs` once, each exiting with its owner and running
    ``niceness`` lower in CPU priority than it (:func:`os.nice`).

    A result comes back as a file in the pool's spool directory, the pool's pipe carrying only its
    path. Through the pipe itself, a worker killed while sending a large result (SIGKILL, out of
    memory) would leave half a message there, and the pool would wait for the rest forever instead of
    seeing a broken pool. A pool that lost a worker is broken for good: it is replaced, and the work
    tried once more on the new one; should that break too, :meth:`run` raises
    :class:`~concurrent.futures.process.BrokenProcessPool`."""

    def __init__(self, workers: int, *, niceness: int = 0, owner_check: float = 1.0) -> None:
        self.workers = workers
        self._niceness = niceness
        self._owner_check = owner_check
        self._spool = tempfile.mkdtemp(prefix="billing-rating-")
        self._executor = self._start()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker process; ``fn`` and its arguments must pickle."""
        loop = asyncio.get_running_loop()
        executor = self._executor
        try:
            path = await loop.run_in_executor(executor, _spooled, self._spool, fn, *args)
        except BrokenProcessPool:
            if self._executor is executor:  # the first caller to see it replaces it
                log.error("a rating worker died; starting %d new ones", self.workers)
                self._executor = self._start()
                executor.shutdown(wait=False)
            path = await loop.run_in_executor(self._executor, _spooled, self._spool, fn, *args)
        # Read on the event loop (a result is small, and in the page cache): reading on threads raises the
        # processor's peak RSS, since glibc gives threads heaps of their own.
        result: T = _unspooled(path)
        return result

    def shutdown(self) -> None:
        """Stop the workers once they are done; remove the spool, and any result a killed worker left."""
        self._executor.shutdown()
        shutil.rmtree(self._spool, ignore_errors=True)

    def _start(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        executor = ProcessPoolExecutor(
            self.workers,
            mp_context=context,
            initializer=_start_worker,
            initargs=(os.getpid(), self._owner_check, self._spool, self._niceness),
        )
        for _ in range(self.workers):
            executor.submit(_started)
        return executor


def _started() -> None:
    """A task that does nothing: submitted once per worker, it makes the pool start them all."""


def _spooled(spool: str, fn: Callable[..., object], *args: Any) -> str:
    """In a worker: ``fn(*args)``, its result pickled to a new file in ``spool``; returns the path."""
    result = fn(*args)
    with tempfile.NamedTemporaryFile(dir=spool, prefix="result-", delete=False) as file:
        pickle.dump(result, file, protocol=pickle.HIGHEST_PROTOCOL)
    return file.name


def _unspooled(path: str) -> Any:
    """The result a worker spooled to ``path``; the file is removed."""
    try:
        with open(path, "rb") as file:
            return pickle.load(file)
    finally:
        os.unlink(path)


def _start_worker(owner: int, interval: float, spool: str, niceness: int) -> None:
    """Worker initializer: run ``niceness`` lower in CPU priority; exit once the process that owns the pool is gone,
    even SIGKILLed (a killed owner cannot shut its pool down, and idle workers would otherwise wait forever), removing
    its ``spool`` and any result left there first (a killed owner cannot)."""
    os.nice(niceness)

    def watch() -> None:
        while True:
            time.sleep(interval)
            if not pid_alive(owner):
                shutil.rmtree(spool, ignore_errors=True)
                os._exit(0)

    threading.Thread(target=watch, name="owner-watch", daemon=True).start()
