"""``billing soak --minutes 3`` (what CI runs): two batches a minute (CSV, JSON Lines, Parquet; bad rows; repeated ids;
several billing periods) while roles are SIGKILLed, storage freezes and the fault proxy fails requests. Paced, not
back to back: batches back to back take whatever CPU the machine has free for the three minutes, which beside the
rest of the suite is CPU its other tests wait for.
The soak's own verdict must be exact and nothing lost, and its JSON must say so field by field. The soak
waits on conditions with bounds of its own; the test bounds the whole command and stops it as on Ctrl-C
(roles stopped, storage thawed) should it run past that. The checks below need at least four batches (the
fourth reuses the third's ids: ``--min-batches 4``) and ten faults of four kinds or more."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.soak import OVERTIME, SUBMIT_AGAIN

pytestmark = pytest.mark.slow

MINUTES = 3
#: Batches the checks below need: the soak goes on past its minutes until it has submitted them (beside another
#: test on a loaded machine, three minutes may not be enough).
BATCHES = 4
#: New batches a minute: six in the three minutes, at most three in flight.
PACE = 2
#: Seconds the whole command may take: the soak, then its bounded waits for the batches and the queues.
BOUND = MINUTES * 60 * OVERTIME + 720
SLOTS = ("initiator", "processor-1", "processor-2", "controller")


@pytest.mark.timeout(BOUND + 180)
def test_a_soak_under_random_faults_ends_exact_with_nothing_lost(tmp_path: Path) -> None:
    output = tmp_path / "soak.json"
    env = {name: value for name, value in os.environ.items() if not name.startswith("BILLING_")}
    command = [sys.executable, "-m", "billing", "soak", "--minutes", str(MINUTES), "--min-batches", str(BATCHES)]
    command += ["--batches-per-minute", str(PACE)]
    command += ["--output", str(output)]
    soak = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        printed, _ = soak.communicate(timeout=BOUND)
    except subprocess.TimeoutExpired:
        soak.send_signal(signal.SIGINT)
        printed, _ = soak.communicate(timeout=120)
        pytest.fail(f"billing soak ran past {BOUND} s:\n{printed[-3000:]}")
    assert output.exists(), printed[-3000:]
    report = json.loads(output.read_text())
    assert soak.returncode == 0 and report["ok"], f"{report['problems']}\n{printed[-3000:]}"
    assert report["problems"] == []
    assert (report["minutes"], report["min_batches"], report["store"]) == (MINUTES, BATCHES, "sqlite")
    assert report["batches_per_minute"] == PACE

    batches = report["batches"]
    assert len(batches) >= BATCHES, "two batches a minute, and on until four were submitted"
    new = sorted(b["submitted_seconds"] for b in batches if not b["batch_id"].endswith("-again"))
    gaps = [later - earlier for earlier, later in itertools.pairwise(new)]
    assert all(gap > 60 / PACE - 0.1 for gap in gaps), new  # the times are to 0.01 s
    # A batch refused for sharing ids with one debatched at the same time counted nothing and was submitted
    # again under a new id, which is checked with the others.
    refused = [b for b in batches if b["submitted_again_as"]]
    ids = {b["batch_id"] for b in batches}
    for batch in refused:
        assert batch["state"] == "refused" and SUBMIT_AGAIN in batch["refused_reason"], batch
        assert batch["accepted"] == batch["rejected"] == batch["transactions_recorded"] == 0, batch
        assert batch["submitted_again_as"] in ids, batch
    for batch in (b for b in batches if not b["submitted_again_as"]):
        assert batch["state"] == "complete" and batch["exact"] and batch["counted_once"], batch
        assert batch["completed_items"] == batch["work_items"] and batch["poisoned_items"] == 0, batch
        assert (batch["accepted"], batch["rejected"]) == (batch["expected_accepted"], batch["expected_rejected"])
        assert batch["accepted"] == batch["transactions_recorded"], batch
        assert batch["mismatches"] == 0 and batch["error"] == ""
    # The same seed plans the same batches: the first four are of every format, several billing periods,
    # and the fourth reuses the third's transaction ids.
    assert {b["format"] for b in batches} == {"csv", "jsonl", "parquet"}
    assert len({b["period"] for b in batches}) >= 3
    assert len({b["seed"] for b in batches}) < len(batches), "some batch repeats another's transaction ids"
    assert report["transactions"] == sum(b["accepted"] for b in batches)
    assert sum(b["rejected"] for b in batches) > 0

    faults = report["faults"]
    assert len(faults) >= 10, "a fault every few seconds"
    assert {"kill", "kill two"} <= set(report["faults_by_kind"]) and len(report["faults_by_kind"]) >= 4
    assert sum(report["faults_by_kind"].values()) <= len(faults)

    assert report["queues_left"] and not any(report["queues_left"].values())
    assert all(entry["accounted"] for entry in report["poison"])
    assert report["exits"] == dict.fromkeys(SLOTS, 0)

    for slot in SLOTS:
        role = report["roles"][slot]
        assert role["rss_mib"]["peak"] > 0 and role["fds"]["peak"] > 0, (slot, role)
        assert role["longest_life"]["rss_mib"]["peak"] > 0, (slot, role)
    sampled = {sample["slot"] for sample in report["samples"]}
    assert sampled == set(SLOTS)
    requests = report["storage_requests"]
    assert requests["roles"] > 0 and requests["per_1000"] > 0 and requests["proxy_forwarded_per_1000"] > 0
    assert output.with_suffix(".png").stat().st_size > 0
