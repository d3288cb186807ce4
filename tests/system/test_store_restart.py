"""A user's `billing submit --wait` while PostgreSQL restarts under it: it says on stderr that it waits for the
store, rides the restart out and prints the batch's summary, and the batch is exact; past its patience it fails
in one line that names the batch and how to follow it, while the batch goes on."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest

from benchmarks.postgres import PostgresServer
from billing.sample import generate
from shared.settings import Settings
from store import Store
from support.exact import expected, read_raw, report, sorted_records
from support.references import sample_flags
from support.roles import Roles
from support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.parametrize("sql_url", ["postgresql"], indirect=True)]

ROWS = 60_000
#: Seconds a message the controller received while the store was down stays out of sight: short, so that what it
#: held is seen again soon after the restart (the default is a minute).
VISIBILITY = "10"


def _submit(batch: Path, batch_id: str, **env: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "billing", "submit", str(batch), "--batch-id", batch_id, "--wait"]
    command += sample_flags(batch.parent / "ref")
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}
    )


def _known(settings: Settings, batch_id: str) -> bool:
    """Whether the store knows the batch yet (its first results or manifest recorded)."""
    with Store(settings.sql_url_value) as store:
        return store.batch(batch_id) is not None


def test_a_waiting_submit_rides_out_a_postgresql_restart(
    settings_env: Settings,
    roles: Roles,
    monkeypatch: pytest.MonkeyPatch,
    postgres_server: PostgresServer,
    sql_url: str,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("BILLING_SQL_URL", sql_url)
    monkeypatch.setenv("BILLING_WORK_ITEM_SIZE", "2000")
    monkeypatch.setenv("BILLING_VISIBILITY_TIMEOUT", VISIBILITY)
    settings = Settings()
    batch = tmp_path / "batch.csv"
    generate(ROWS, batch, seed=11, reject_rate=0.01)
    aggregates, invoices, rejects = expected(read_raw(batch))
    with roles.running(settings):
        submit = _submit(batch, "restarted")
        assert wait_until(lambda: _known(settings, "restarted"), 120), "the batch never reached the store"
        postgres_server.stop()
        time.sleep(5)
        postgres_server.start()
        out, err = submit.communicate(timeout=300)
    assert submit.returncode == 0, err
    assert "waiting: the SQL store does not answer" in err
    assert "state: complete" in out and "batch restarted submitted" in out
    got = report("aggregates", "restarted")
    for record in got:
        record["quantity"] = Decimal(record["quantity"])
    assert sorted_records(got) == aggregates
    assert sorted_records(report("invoices", "restarted")) == invoices
    assert len(report("rejects", "restarted")) == len(rejects)


def test_a_submit_that_waits_past_its_patience_names_the_batch_to_follow(
    settings_env: Settings,
    roles: Roles,
    monkeypatch: pytest.MonkeyPatch,
    postgres_server: PostgresServer,
    sql_url: str,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("BILLING_SQL_URL", sql_url)
    monkeypatch.setenv("BILLING_VISIBILITY_TIMEOUT", VISIBILITY)
    settings = Settings()
    batch = tmp_path / "batch.csv"
    generate(20_000, batch, seed=12)
    with roles.running(settings):
        assert wait_until(lambda: roles.is_up("controller"), 60)
        postgres_server.stop()
        try:
            submit = _submit(batch, "impatient", BILLING_STORE_PATIENCE="3")
            out, err = submit.communicate(timeout=120)
        finally:
            postgres_server.start()
        assert submit.returncode == 1, (out, err)
        assert "batch impatient submitted" in out
        assert "the SQL store did not answer for 3 s" in err and "`billing status impatient`" in err
        assert wait_until(lambda: _known(settings, "impatient"), 120), "the batch goes on once the store is back"


def test_billing_status_waits_for_a_store_that_comes_back(
    settings_env: Settings, monkeypatch: pytest.MonkeyPatch, postgres_server: PostgresServer, sql_url: str
) -> None:
    monkeypatch.setenv("BILLING_SQL_URL", sql_url)
    Store(sql_url).close()  # migrated
    postgres_server.stop()
    try:
        status = subprocess.Popen(
            [sys.executable, "-m", "billing", "status", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert status.stderr is not None
        said = status.stderr.readline()  # the store is started again once the command says it waits for it
    finally:
        postgres_server.start()
    out, err = status.communicate(timeout=120)
    err = said + err
    assert status.returncode == 0, err
    assert err.count("waiting: the SQL store does not answer") == 1 and '"batches": []' in out
