"""Each transaction id billed once across batches, through the real roles and the ``billing`` CLI: a batch that
re-exports part of an earlier one has those rows rejected as duplicates, a void releases the ids, batches
submitted side by side and roles killed mid-way stay exact, a manifest delayed through the backlog keeps its
batch's place; every batch equal to the reference model, which takes the batches in their sequence order."""

from __future__ import annotations

import asyncio
import csv
import hashlib
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from benchmarks import reference_model as model
from benchmarks.fault_proxy import FaultProxy
from billing.sample import generate, sample_price_book_bytes, sample_tax_table_bytes
from shared.messaging.envelope import peek_headers
from shared.messaging.storage import Storage
from shared.settings import Settings
from store import BatchState, BatchStatus, Store
from store.ledger.numbers import merges_numbered, unnumbered_batches
from support.azurite import running_azurite
from support.backlog import backlog
from support.exact import assert_batch_exact, billing, billing_process, read_raw, report, status
from support.roles import Roles
from support.waiting import wait_until


def _ledger() -> model.Ledger:
    return model.Ledger(
        model.read_prices(sample_price_book_bytes().decode()), model.read_rates(sample_tax_table_bytes().decode())
    )


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as sink:
        writer = csv.DictWriter(sink, list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _check_in_seq_order(ledger: model.Ledger, files: dict[str, Path]) -> None:
    """Every batch exact against the model, taken in sequence order, duplicates on the same rows."""
    for batch_id in sorted(files, key=lambda b: int(status(b)["seq"])):
        taken = ledger.counted_ids()
        fates = ledger.batch(batch_id, read_raw(files[batch_id]))
        assert_batch_exact(batch_id, files[batch_id], taken)
        duplicates = [r["row"] for r in report("rejects", batch_id) if r["reason"] == "duplicate_transaction_id"]
        assert sorted(duplicates) == [n for n, f in enumerate(fates, 1) if f == "duplicate_transaction_id"]


def _run_roles(roles: Roles) -> None:
    for role in ("initiator", "processor", "controller"):
        roles.burst(role)


def test_a_re_export_is_rejected_as_duplicates_and_a_void_releases_its_ids(
    settings_env: Settings, roles: Roles, tmp_path: Path
) -> None:
    generate(600, tmp_path / "first.csv", seed=61, reject_rate=0.05)
    first = read_raw(tmp_path / "first.csv")
    generate(200, tmp_path / "fresh.csv", seed=62, reject_rate=0.05)
    files = {
        "first": tmp_path / "first.csv",
        "second": _write(tmp_path / "second.csv", first[300:] + read_raw(tmp_path / "fresh.csv")),
    }
    billing("reference", "set", "--sample")
    ledger = _ledger()
    for batch_id in files:
        billing("submit", str(files[batch_id]), "--batch-id", batch_id)
        _run_roles(roles)
    _check_in_seq_order(ledger, files)
    assert status("second")["rejected"] >= 290

    billing("void", "first")
    ledger.void("first")
    third = {"third": _write(tmp_path / "third.csv", first[:400] + first[450:500])}
    billing("submit", str(third["third"]), "--batch-id", "third")
    _run_roles(roles)
    _check_in_seq_order(ledger, third)
    assert status("third")["accepted"] >= 300


def test_batches_side_by_side_and_roles_killed_mid_way_stay_exact(
    settings_env: Settings, roles: Roles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BILLING_IDS_PART_ROWS", "4000")  # each batch's ids in parts, recorded before its manifest
    generate(30_000, tmp_path / "a.csv", seed=71, reject_rate=0.01)
    rows = read_raw(tmp_path / "a.csv")
    generate(10_000, tmp_path / "new.csv", seed=72, reject_rate=0.01)
    paths = [
        tmp_path / "a.csv",
        _write(tmp_path / "b.csv", rows[10_000:] + read_raw(tmp_path / "new.csv")),
        _write(tmp_path / "c.csv", rows[25_000:] + rows[:5_000]),
    ]
    files = {hashlib.sha256(path.read_bytes()).hexdigest(): path for path in paths}  # ids of files submitted together
    billing("reference", "set", "--sample")
    # What the killed roles held is seen again 10 s on, not a minute (the default visibility timeout).
    settings = settings_env.model_copy(update={"visibility_timeout": 10})
    # Progress is polled in the store, not by a `billing status` process per look (the CLI reads the same
    # rows: support.exact.status); the roles keep both cores.
    with roles.running(settings), Store(settings.sql_url_value) as store:

        def states() -> list[BatchStatus | None]:
            return [store.batch(batch_id) for batch_id in files]

        assert roles.wait_up()
        billing("submit", *(str(path) for path in paths))
        assert wait_until(lambda: any(s and s.completed_items for s in states()), 120, interval=0.2)
        roles.kill_and_restart("initiator")
        roles.kill_and_restart("controller")
        assert wait_until(lambda: all(s and s.state == "complete" for s in states()), 300, interval=0.5)
    _check_in_seq_order(_ledger(), files)


@pytest.mark.parametrize("sql_url", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
def test_a_manifest_delayed_through_the_backlog_keeps_its_batchs_place(
    settings_env: Settings, sql_url: str, roles: Roles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch ``a``'s manifest goes to the backlog (the primary fails its sends to the results queue) and reaches the
    controller only after that of ``b``, merged after it and repeating half of its ids: ``b`` waits, unnumbered,
    until ``a``'s comes, then both are numbered in merge order and exact, ``b``'s repeats rejected as duplicates of
    ``a``'s. Numbered as their manifests came, ``b`` would have counted those ids and ``a`` been refused for
    sharing them with a batch debatched at the same time. Batch ``zero`` is numbered first: a store waits only for
    merges after one it has numbered (the first it sees starts its count)."""
    with running_azurite(tmp_path / "secondary") as secondary:
        monkeypatch.setenv("BILLING_SQL_URL", sql_url)
        monkeypatch.setenv("BILLING_SECONDARY_STORAGE_CONNECTION_STRING", secondary.connection_string() or "")
        monkeypatch.setenv("BILLING_ENABLE_SYPHON", "false")  # the backlog moves when the test runs the syphon
        settings = Settings()
        generate(300, tmp_path / "zero.csv", seed=81, reject_rate=0.05)
        generate(2_000, tmp_path / "a.csv", seed=82, reject_rate=0.05)
        generate(1_000, tmp_path / "new.csv", seed=83, reject_rate=0.05)
        files = {
            "zero": tmp_path / "zero.csv",
            "a": tmp_path / "a.csv",
            "b": _write(tmp_path / "b.csv", read_raw(tmp_path / "a.csv")[1_000:] + read_raw(tmp_path / "new.csv")),
        }
        billing("reference", "set", "--sample")
        billing("submit", str(files["zero"]), "--batch-id", "zero")
        roles.burst("initiator")
        roles.burst("controller")  # zero's manifest: its items are rated with the others' below
        assert status("zero")["seq"] == 1

        with FaultProxy(settings.storage_connection_string.get_secret_value()) as proxy:  # type: ignore[union-attr]
            proxy.outage(3600, kind="500", services=("queue",), path=f"/{settings.results_queue}/messages")
            primary = SecretStr(proxy.connection_string)
            failing = settings.model_copy(
                update={"storage_connection_string": primary, "failover_interval": 0, "retry_total": 0}
            )
            billing("submit", str(files["a"]), "--batch-id", "a")
            roles.burst("initiator", failing)  # a's items go out, its manifest into the backlog
        billing("submit", str(files["b"]), "--batch-id", "b")
        _run_roles(roles)

        async def waiting() -> list[tuple[str, tuple[str, dict[str, Any]] | None]]:
            """(destination, kind and headers) of each message in the backlog."""
            async with Storage(settings) as storage:
                return [(to, peek_headers(text)) for to, text in await backlog(storage)]

        [(to, peeked)] = asyncio.run(waiting())
        assert to == settings.results_queue and peeked is not None
        assert (peeked[0], peeked[1]["batch_id"], peeked[1]["id_serial"]) == ("manifest", "a", 2)
        with Store(settings.sql_url_value) as store, store.engine.connect() as conn:
            assert (unnumbered_batches(conn), merges_numbered(conn)) == (["b"], 1), "b waits for merge 2, a's"
            b = store.batch("b")
        assert b is not None and (b.state, b.seq, b.completed_items) == (BatchState.processing, None, b.work_items)

        billing_process("syphon", "--burst")
        assert asyncio.run(waiting()) == []
        roles.burst("controller")
    _check_in_seq_order(_ledger(), files)
    assert [status(batch_id)["seq"] for batch_id in files] == [1, 2, 3]
    duplicates = [r for r in report("rejects", "b") if r["reason"] == "duplicate_transaction_id"]
    assert len(duplicates) > 900, "b repeats a's counted ids"
