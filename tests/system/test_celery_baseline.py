"""`billing bench-celery` end to end on a small messy file: Celery prefork workers on kombu's Azure Storage
Queues transport against a fresh persisted Azurite bill exactly as the reference model, and the workers are
gone afterwards, also when the run fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from celery.exceptions import TimeoutError as CeleryTimeout
from rich.console import Console

from benchmarks.celery_app import REFERENCES_ENV
from benchmarks.celery_baseline import run_celery
from benchmarks.expected import expected
from benchmarks.pipeline import _batch_file

pytestmark = pytest.mark.slow


def celery_workers(data_dir: Path) -> set[int]:
    """Live processes of a Celery worker of the baseline runs on ``data_dir`` (main process and prefork children)."""
    found = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            mine = f"{REFERENCES_ENV}={data_dir}".encode() in (proc / "environ").read_bytes().split(b"\0")
            if mine and b"benchmarks.celery_app" in (proc / "cmdline").read_bytes():
                found.add(int(proc.name))
        except OSError:
            continue
    return found


def test_celery_baseline_bills_exactly_as_the_model(tmp_path: Path) -> None:
    output = tmp_path / "celery.json"
    command = [sys.executable, "-m", "billing", "bench-celery", "--rows", "5000", "--chunk-rows", "1000"]
    command += ["--repeat", "1", "--count-requests", "--data-dir", str(tmp_path / "data"), "--output", str(output)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(output.read_text())
    assert report["exact"] and report["chunk_rows"] == 1000
    (timed,) = report["runs"]
    counted = report["counted"]
    for run in (timed, counted):
        assert run["exact"] and run["tasks"] == 5 and run["concurrency"] == os.cpu_count()
        assert run["accepted"] + run["rejected"] == 5000 and run["rejected"] > 0
        assert run["submit_to_complete_seconds"] > 0 and run["cpu_seconds"]["celery worker"] > 0
    assert timed["totals"] == counted["totals"] and sum(t["transactions"] for t in timed["totals"].values()) > 0
    requests = counted["storage_requests"]
    # kombu's transport: one message per task, received one at a time and deleted on receipt.
    assert requests["queue.send"] == 5 and requests["queue.delete"] == 5 and requests["queue.receive"] >= 5
    assert requests["total"] == sum(count for kind, count in requests.items() if kind != "total")
    assert not celery_workers(tmp_path / "data"), "a Celery worker process was left behind"


def test_celery_workers_are_stopped_when_the_run_fails(tmp_path: Path) -> None:
    data = tmp_path / "data"
    batch = _batch_file(2000, data, Console(), messy=True)
    model = expected(batch, (data / "pricebook.csv").read_text(), (data / "taxes.csv").read_text())
    with pytest.raises(CeleryTimeout):
        run_celery(batch, chunk_rows=500, data_dir=data, model=model, timeout=0.01)
    assert not celery_workers(data), "a Celery worker process was left behind"


def test_a_chunk_too_large_for_a_message_is_one_clear_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    command = [sys.executable, "-m", "billing", "bench-celery", "--rows", "3000", "--chunk-rows", "3000"]
    command += ["--repeat", "1", "--data-dir", str(data), "--output", str(tmp_path / "celery.json")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2
    assert "3,000 rows does not fit a storage queue message" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "celery.json").exists()
    assert not celery_workers(data), "a Celery worker process was left behind"
