"""Role processes forked from a server that imported the roles once, instead of ``python -m <role>``.

A role that starts as a new interpreter imports the Azure SDK, pandas, pyarrow and SQLAlchemy before it
serves, and the system tests start many roles. Here a fork server
(:mod:`multiprocessing`'s, one per test process) imports them once and each role is a fork of it
that runs :func:`shared.roles.main` with the test's environment, working directory and log: the same
process for the role (its own pid, signals, exit status), without the imports. :class:`ForkedRole`
has the parts of :class:`subprocess.Popen` the tests use."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

PRELOAD = ["shared.roles", "initiator.service", "processor.service", "controller.service"]

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)


def _run_role(role: str, argv: list[str], env: dict[str, str], cwd: str, log: str) -> None:
    """In the fork: become ``python -m <role> <argv>`` with ``env`` in ``cwd``, output appended to ``log``."""
    from shared.roles import main

    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    sys.argv = [role, *argv]
    main(role, argv)


class ForkedRole:
    """One role forked from the server: ``python -m <role> <argv>``, as :class:`subprocess.Popen` shows it."""

    def __init__(self, role: str, env: Mapping[str, str], log: Path, argv: Sequence[str] = ()) -> None:
        self.args = [sys.executable, "-m", role, *argv]
        arguments = (role, list(argv), dict(env), os.getcwd(), str(log))
        self._process = _context.Process(target=_run_role, args=arguments, name=role)
        self._process.start()
        self.pid: int = self._process.pid  # type: ignore[assignment]

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self._process.exitcode

    def send_signal(self, signum: int) -> None:
        """As :meth:`subprocess.Popen.send_signal`: nothing once the role has exited, or is exiting."""
        if self._process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):  # reaped by the server, its status not yet read
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_role(role: str, env: Mapping[str, str], log: Path, *, cgroup: Path | None = None) -> ForkedRole:
    """:func:`billing.demo.start_role`, forked (no cgroups: the tests do not use them)."""
    if cgroup is not None:
        raise ValueError("a forked role cannot join a cgroup before it starts")
    return ForkedRole(role, env, log)


def burst(role: str, env: Mapping[str, str], *, timeout: float) -> tuple[int, str]:
    """Run ``<role> --burst`` until it has drained its queues: its exit status and output."""
    with tempfile.NamedTemporaryFile(prefix=f"{role}-burst-", suffix=".log") as log:
        process = ForkedRole(role, env, Path(log.name), ["--burst"])
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        return code, Path(log.name).read_text(errors="replace")
