"""Real role processes for a test, started the product's way.

:meth:`Roles.running` is :func:`billing.demo.role_processes` (the demo's and the benchmarks' own
start-up: initiator, N processors, controller, each logging to ``<log_dir>/<role>-<number>.log``),
each role forked from a server that imported the roles once (:mod:`support.forked`) instead of a
new ``python -m <role>``, plus what tests do to the processes meanwhile: signal them, SIGKILL and
restart one (its log appended to), wait for them, read their logs. :meth:`Roles.burst` runs one
role in the foreground until it has drained its queues. The ``roles`` fixture in ``conftest.py``
hands one to a test."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from billing.demo import role_processes
from shared.settings import Settings
from support import forked
from support.waiting import wait_until

Started = subprocess.Popen[bytes] | forked.ForkedRole
STARTUP_TIMEOUT = 60.0  # seconds for a role to reach storage and write its state file


class Roles:
    """The role processes of one test. Address one by its index in :attr:`processes` (initiator
    first, controller last) or by its role name (the first process of that role)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.start: Callable[..., Started] = forked.start_role
        """How each role starts: forked (default), or :func:`billing.demo.start_role` for a test that
        needs a new interpreter (one that reads a role's own environment or network namespace)."""
        self.processes: list[Started] = []
        self.killed: list[str] = []  # roles SIGKILLed, in order
        self._env: dict[str, str] = {}
        self._home = Path()

    @contextmanager
    def running(self, settings: Settings | None = None, *, processors: int = 1) -> Iterator[list[Started]]:
        """The roles run with ``settings`` (default: from the environment) for the block. At its end
        each one still running is given time to come up (a role still starting would die by
        SIGTERM's default action), then SIGTERMed and waited for; :attr:`returncodes` says how each
        ended. Running again (after the block) starts fresh processes appending to the same logs."""
        settings = settings or Settings()
        self._env, self._home = {**os.environ, **settings.as_env()}, settings.home
        with role_processes(settings, self.log_dir, processors=processors, start=self.start) as processes:
            self.processes = processes  # the list role_processes stops: restarts replace entries in it
            try:
                yield processes
            finally:
                self.wait_up()

    @property
    def names(self) -> list[str]:
        return [str(process.args[2]) for process in self.processes]  # type: ignore[index]

    @property
    def returncodes(self) -> list[int | None]:
        return [process.poll() for process in self.processes]

    def alive(self) -> list[bool]:
        return [code is None for code in self.returncodes]

    def is_up(self, which: int | str) -> bool:
        """Whether the role has reached storage and serves (it keeps a state file under its pid)."""
        index = self._index(which)
        process = self.processes[index]
        return (self._home / "state" / f"{self.names[index]}-{process.pid}.json").exists()

    def state(self, which: int | str) -> dict[str, Any] | None:
        """The state file the role keeps (refreshed every few seconds), or None before its first."""
        index = self._index(which)
        path = self._home / "state" / f"{self.names[index]}-{self.processes[index].pid}.json"
        with contextlib.suppress(OSError, ValueError):
            found: dict[str, Any] = json.loads(path.read_text())
            return found
        return None

    def polled_empty(self) -> bool:
        """Whether every role's state file shows that each of its listeners has found its queue empty."""
        states = [self.state(index) for index in range(len(self.processes))]
        return all(state is not None and all(t["idle_polls"] > 0 for t in state["listeners"]) for state in states)

    def wait_up(self, timeout: float = STARTUP_TIMEOUT) -> bool:
        """Wait until every role still running is up; whether they all are."""
        return bool(
            wait_until(
                lambda: all(p.poll() is not None or self.is_up(i) for i, p in enumerate(self.processes)),
                timeout,
                interval=0.2,
            )
        )

    def signal(self, signum: int = signal.SIGTERM, *, times: int = 1, between: float = 0.01) -> None:
        """Send ``signum`` to every role ``times`` times, ``between`` seconds apart."""
        for process in self.processes:
            for _ in range(times):
                process.send_signal(signum)
                time.sleep(between)

    def wait(self, timeout: float = 60) -> list[int]:
        """Wait for every role to exit; their exit codes."""
        return [process.wait(timeout=timeout) for process in self.processes]

    def kill(self, which: int | str) -> None:
        """SIGKILL one role and reap it."""
        index = self._index(which)
        self.processes[index].send_signal(signal.SIGKILL)
        self.processes[index].wait()
        self.killed.append(self.names[index])

    def restart(self, which: int | str) -> None:
        """Start one role again in its place, with the same environment and log."""
        index = self._index(which)
        role = self.names[index]
        self.processes[index] = self.start(role, self._env, self.log_dir / f"{role}-{index}.log")

    def kill_and_restart(self, which: int | str) -> None:
        self.kill(which)
        self.restart(which)

    def burst(self, role: str, settings: Settings | None = None, *, timeout: float = 300) -> None:
        """Run one role in the foreground until what is queued for it is drained (``--burst``), with
        ``settings`` (default: from the environment); fail with its output unless it exits 0."""
        env = {**os.environ, **(settings or Settings()).as_env()}
        code, output = forked.burst(role, env, timeout=timeout)
        assert code == 0, output

    def logs(self) -> dict[str, str]:
        """Every role log by file name (``<role>-<number>.log``)."""
        return {log.name: log.read_text(errors="replace") for log in sorted(self.log_dir.glob("*.log"))}

    def close(self) -> None:
        """SIGKILL whatever is still running (a test that failed mid-way)."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    def _index(self, which: int | str) -> int:
        return which if isinstance(which, int) else self.names.index(which)
