"""A shipped benchmark run the way a reader runs it: ``python -m benchmarks.<name>``, as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_benchmark(name: str, *args: str, output: Path) -> dict[str, Any]:
    """Run ``benchmarks.<name>`` with ``args`` and ``--output output``; the figures it wrote."""
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args, "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    figures: dict[str, Any] = json.loads(output.read_text())
    return figures
