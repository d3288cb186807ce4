"""A close is one transaction: ``billing close`` SIGKILLed at any moment leaves all of its documents or none,
and no gap in the numbers; the close run again issues exactly what is owed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from shared.settings import Settings
from store import Store
from support.ledger import with_seller
from support.records import manifest, partial, result

ACCOUNTS = 6_000
COMMAND = [sys.executable, "-m", "billing", "close", "--period", "2026-03"]


def test_a_close_killed_at_any_moment_leaves_all_of_its_documents_or_none(
    settings_env: Settings, sql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BILLING_SQL_URL", sql_url)
    rows = [partial(f"acct-{i:05d}", net=i + 1, tax=1) for i in range(ACCOUNTS)]
    with with_seller(Store(sql_url)) as store:
        assert store.apply([manifest("big")], [result("big-w1", *rows, batch_id="big")]).completed_batches == ["big"]
        kills, delay, left = 0, 0.3, []
        while not left:  # kill it later each time, until a close runs to its end
            with subprocess.Popen(COMMAND, env=os.environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as run:
                time.sleep(delay)
                if run.poll() is None:
                    run.send_signal(signal.SIGKILL)
                    kills += 1
                run.wait()
            left = store.documents()
            assert len(left) in (0, ACCOUNTS), f"all or nothing (killed after {delay:.2f} s)"
            delay += 0.4
    assert kills >= 2, "killed while it ran"
    assert [d.number for d in left] == list(range(1, ACCOUNTS + 1)), "no gap, whatever the kills took"
    assert sum(d.net for d in left) == ACCOUNTS * (ACCOUNTS + 1) // 2 and all(d.kind == "invoice" for d in left)
    assert "nothing to issue" in subprocess.run(COMMAND, env=os.environ, capture_output=True, text=True).stdout
