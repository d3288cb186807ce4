"""``tests/support/stress.py`` (``make test-stress``): its busy loops spin while pytest runs and are gone
afterwards, whether pytest ends by itself or the script is killed outright."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from support.waiting import wait_until

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "stress.py"
#: A test that stays in pytest until its file is removed: the loops can be looked at meanwhile.
HOLD = """
import pathlib, time
def test_hold():
    flag = pathlib.Path(__file__).with_name("hold")
    flag.touch()
    while flag.exists():
        time.sleep(0.05)
"""


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] not in ("Z", "X")
    except FileNotFoundError:
        return False


def start(tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    """The script with one loop on a pytest that holds (two, as ``make test-stress`` runs, would keep both of a
    2-core machine's cores from the pytest starting); the loop's pid once pytest is running."""
    (tmp_path / "test_held.py").write_text(HOLD)
    script = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--loops", "1", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert script.stdout is not None
    pids = [int(pid) for pid in re.findall(r"\d+", script.stdout.readline().split("pids", 1)[1])]
    assert wait_until(lambda: (tmp_path / "hold").exists(), 60), "pytest never reached the test"
    return script, pids


def test_the_loops_spin_while_pytest_runs_and_stop_with_it(tmp_path: Path) -> None:
    script, pids = start(tmp_path)
    with script:  # its output pipe closed as it ends
        assert len(pids) == 1 and all(running(pid) for pid in pids)
        (tmp_path / "hold").unlink()
        assert script.wait(timeout=60) == 0, "the exit status is pytest's"
        assert not any(running(pid) for pid in pids)


def test_the_loops_die_with_the_script_when_it_is_killed(tmp_path: Path) -> None:
    script, pids = start(tmp_path)
    with script:  # its output pipe closed as it ends
        os.kill(script.pid, signal.SIGKILL)
        script.wait()
        try:
            assert wait_until(lambda: not any(running(pid) for pid in pids), 10), "orphaned busy loops"
        finally:
            (tmp_path / "hold").unlink(missing_ok=True)  # the orphaned pytest ends too
