"""The README's quick start: ``make demo`` installs the package and runs ``billing demo``
(``tests/unit/test_docs.py`` holds the Makefile to that). Here the demo runs as a newcomer's shell
runs it, on a fresh ``BILLING_HOME``: its own Azurite and SQLite, the three roles as processes, a
small batch that reconciles; run again on the same home, its ids are billed already, and it says how to get new
ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_runs_a_batch_that_reconciles(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("BILLING_")}
    env["BILLING_HOME"] = str(tmp_path / "home")

    def billing(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "billing", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )

    try:
        done = billing("demo", "--rows", "5000", timeout=300)
        again = billing("demo", "--rows", "5000", timeout=300)
    finally:
        billing("down", timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "rows = accepted + rejected" in output and "OK" in output and "MISMATCH" not in output, output[-4000:]
    assert "already billed" not in output, output[-4000:]
    repeated = again.stdout + again.stderr
    assert again.returncode == 0 and "MISMATCH" not in repeated, repeated[-4000:]
    assert "of the 5,000 rows repeat transaction ids already billed" in repeated, repeated[-4000:]
    assert "billing demo --seed 2" in repeated, repeated[-4000:]
