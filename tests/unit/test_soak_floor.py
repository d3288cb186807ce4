"""``billing soak --min-batches N``: the faults go on past the soak's minutes until N batches were submitted, and
no longer than :data:`~benchmarks.soak.OVERTIME` times the minutes. The fault injection and the sampling of the
roles are left out (no roles run here): what is tested is when the soak stops injecting."""

from __future__ import annotations

import threading
import time

import pytest
from rich.console import Console

from benchmarks.soak import OVERTIME, Soak, SoakBatch

SECONDS = 0.5


def soak(min_batches: int, monkeypatch: pytest.MonkeyPatch) -> Soak:
    made = Soak(minutes=SECONDS / 60, store="sqlite", seed=0, console=Console(quiet=True), min_batches=min_batches)
    monkeypatch.setattr(made, "_inject", list)  # no fault, nothing to undo
    monkeypatch.setattr(made, "_sample", lambda: None)
    return made


def submit_every(made: Soak, seconds: float, count: int) -> None:
    """Add ``count`` batches to the soak, one every ``seconds``, from a thread (as its submitter does)."""

    def submit() -> None:
        for number in range(count):
            time.sleep(seconds)
            made.batches.append(SoakBatch(f"b{number}", "csv", 1, "2026-01", 0.0, number, made.now()))

    threading.Thread(target=submit, daemon=True).start()


def test_the_faults_go_on_past_the_minutes_until_the_batches_were_submitted(monkeypatch: pytest.MonkeyPatch) -> None:
    made = soak(3, monkeypatch)
    submit_every(made, SECONDS * 0.4, 3)  # the third comes after the soak's minutes
    made._inject_until(SECONDS)
    assert len(made.batches) == 3
    assert SECONDS < made.now() < SECONDS * OVERTIME


def test_without_a_floor_the_faults_stop_at_the_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    made = soak(0, monkeypatch)
    made._inject_until(SECONDS)
    assert SECONDS <= made.now() < SECONDS * OVERTIME and not made.batches


def test_the_floor_waits_no_longer_than_overtime(monkeypatch: pytest.MonkeyPatch) -> None:
    made = soak(5, monkeypatch)
    submit_every(made, SECONDS * 0.4, 1)
    made._inject_until(SECONDS)
    assert len(made.batches) == 1
    assert SECONDS * OVERTIME <= made.now() < SECONDS * OVERTIME + 1
