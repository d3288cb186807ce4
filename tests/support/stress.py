"""``make test-stress``: pytest with busy loops beside it, the CPU contention of a loaded CI runner.

``python tests/support/stress.py [--loops N] [PYTEST ARGS...]`` starts ``N`` (default 2) processes that
spin on a core each, runs ``python -m pytest`` with the remaining arguments, and stops the loops
however pytest ends (exit, Ctrl-C, SIGTERM); each loop also dies with this script, should it be
killed outright. The exit status is pytest's."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from types import FrameType

BUSY = "while True: pass"
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def _die_with_parent() -> None:
    """Run in each loop before it starts: SIGKILL it when this script goes, however that happens."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    loops = 2
    if argv[:1] == ["--loops"]:
        loops, argv = int(argv[1]), argv[2:]
    signal.signal(signal.SIGTERM, _terminated)
    busy: list[subprocess.Popen[bytes]] = []
    tests: subprocess.Popen[bytes] | None = None
    try:
        for _ in range(loops):
            busy.append(subprocess.Popen([sys.executable, "-c", BUSY], preexec_fn=_die_with_parent))
        print(f"stress: {loops} busy loops (pids {', '.join(str(p.pid) for p in busy)}) beside pytest", flush=True)
        tests = subprocess.Popen([sys.executable, "-m", "pytest", *argv])
        return tests.wait()
    finally:
        if tests is not None and tests.poll() is None:  # stopped from outside: as on Ctrl-C, pytest tears down
            tests.send_signal(signal.SIGINT)
            tests.wait()
        for process in busy:
            process.kill()
            process.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
