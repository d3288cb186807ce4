"""The SQL store and reports, on SQLite and PostgreSQL (``sql_url`` from conftest)."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from billing import reports
from shared.errors import InfrastructureError
from shared.messages import PoisonNotice
from store import MIGRATIONS, SCHEMA_REVISION, Patience, Store
from store.engine import SQLITE_PAGE_BYTES, create_engine
from store.schema import held
from support.records import held_row, manifest, partial, result

BIG = 9 * 10**18  # three of these pass 2^63


def test_duplicate_delivery_changes_nothing(store: Store) -> None:
    first = store.apply([manifest(work_items=2, rows=2)], [result("w1")])
    assert (first.new_items, first.duplicate_items, first.completed_batches) == (1, 0, [])
    before = (store.batch("b1"), reports.aggregates(store, "b1"))

    again = store.apply([manifest(work_items=2, rows=2)], [result("w1"), result("w1")])

    assert (again.new_items, again.duplicate_items, again.completed_batches) == (0, 2, [])
    after = store.batch("b1")
    assert after is not None and before[0] is not None
    assert (after.completed_items, after.transactions_recorded, after.state) == (1, 1, "processing")
    assert reports.aggregates(store, "b1").equals(before[1])


def test_results_before_manifest_then_manifest_completes(store: Store) -> None:
    accepted_at = datetime.now(timezone(timedelta(hours=1))) - timedelta(seconds=5)  # stored as UTC
    store.apply([], [result("w1"), result("w2", partial("acct-2"))])
    waiting = store.batch("b1")
    assert waiting is not None
    assert (waiting.state, waiting.work_items, waiting.completed_items, waiting.accepted_at) == (
        "processing",
        None,
        2,
        None,
    )

    outcome = store.apply([manifest(work_items=2, rows=2, accepted_at=accepted_at)], [])

    assert outcome.completed_batches == ["b1"]
    done = store.batch("b1")
    assert done is not None and done.completed_at is not None and done.latency_seconds is not None
    assert (done.state, done.rows, done.accepted, done.work_items, done.transactions_recorded) == (
        "complete",
        2,
        2,
        2,
        2,
    )
    assert (
        done.accepted_at == accepted_at
        and done.accepted_at.utcoffset() == done.completed_at.utcoffset() == timedelta(0)
    )
    assert done.latency_seconds == pytest.approx((done.completed_at - accepted_at).total_seconds())
    assert done.latency_seconds >= 5
    as_json = json.loads(json.dumps(done.to_json_dict()))
    assert as_json["state"] == "complete" and isinstance(as_json["latency_seconds"], float)
    assert datetime.fromisoformat(as_json["completed_at"]) == done.completed_at


def test_sums_beyond_64_bits_stay_exact(store: Store) -> None:
    big = partial(net=BIG, tax=BIG, quantity="999999999.999999")
    store.apply([manifest(work_items=3, rows=3)], [result(f"w{i}", big) for i in range(3)])

    frame = reports.aggregates(store, "b1")
    row = frame.iloc[0]
    assert (row["net"], row["tax"], row["total"]) == (3 * BIG, 3 * BIG, 6 * BIG)
    assert type(row["net"]) is int and row["quantity"] == "2999999999.999997"
    invoice = reports.invoices(store, "b1").iloc[0]
    assert (invoice["net"], invoice["total"]) == (3 * BIG, 6 * BIG) and type(invoice["total"]) is int
    with store.engine.connect() as conn:  # the stored value itself is exact, not REAL
        stored = conn.execute(sa.text("SELECT CAST(total AS TEXT) FROM aggregates")).scalar_one()
    assert Decimal(stored) == 6 * BIG


def test_partial_overlap_adds_only_the_new_item(store: Store) -> None:
    store.apply([manifest(work_items=2, rows=2)], [result("a", partial(net=100, tax=10))])
    outcome = store.apply(
        [], [result("a", partial(net=100, tax=10)), result("b", partial(net=7, tax=1, quantity="0.25"))]
    )

    assert (outcome.new_items, outcome.duplicate_items, outcome.completed_batches) == (1, 1, ["b1"])
    row = reports.aggregates(store, "b1").iloc[0]
    assert (row["transactions"], row["quantity"], row["net"], row["tax"], row["total"]) == (2, "1.75", 107, 11, 118)


def test_concurrent_controllers_neither_lose_nor_double_count(sql_url: str) -> None:
    Store(sql_url).close()
    items = [result(f"w{i}", partial(f"acct-{i % 3}", net=BIG, tax=i)) for i in range(40)]
    errors: list[BaseException] = []

    def controller(offset: int) -> None:
        try:
            with Store(sql_url) as mine:
                for i in range(0, len(items), 4):  # overlapping, shifted windows: every item arrives twice
                    mine.apply([manifest(work_items=40, rows=40)], items[(i + offset) % 40 : (i + offset) % 40 + 6])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=controller, args=(offset,)) for offset in (0, 2, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors

    with Store(sql_url) as store:
        status = store.batch("b1")
        assert status is not None and (status.state, status.completed_items, status.transactions_recorded) == (
            "complete",
            40,
            40,
        )
        frame = reports.aggregates(store, "b1")
    assert sum(frame["transactions"]) == 40
    assert sum(frame["net"]) == 40 * BIG and sum(frame["tax"]) == sum(range(40))


def test_reports_shapes_and_quantity_format(store: Store) -> None:
    store.apply(
        [manifest(work_items=1, rows=3)],
        [
            result(
                "w1",
                partial("b", quantity="12.500000"),
                partial("a", quantity="3", day="2026-03-31"),
                partial("a", quantity="0", day="2026-04-01", net=0, tax=0, currency="JPY"),
            )
        ],
    )

    frame = reports.aggregates(store, "b1")
    assert list(frame.columns) == [
        "account_id",
        "product",
        "billing_day",
        "currency",
        "transactions",
        "quantity",
        "net",
        "tax",
        "total",
    ]
    assert list(frame["account_id"]) == ["a", "a", "b"] and list(frame["quantity"]) == ["3", "0", "12.5"]
    rows = json.loads(reports.write_report(frame, "json") or "")
    assert rows[2] == {
        "account_id": "b",
        "product": "CPU",
        "billing_day": "2026-03-02",
        "currency": "USD",
        "transactions": 1,
        "quantity": "12.5",
        "net": 100,
        "tax": 20,
        "total": 120,
    }

    invoices = reports.invoices(store, "b1")
    assert list(invoices.columns) == ["account_id", "billing_period", "currency", "net", "tax", "total"]
    assert json.loads(reports.write_report(invoices, "json") or "") == [
        {"account_id": "a", "billing_period": "2026-03", "currency": "USD", "net": 100, "tax": 20, "total": 120},
        {"account_id": "a", "billing_period": "2026-04", "currency": "JPY", "net": 0, "tax": 0, "total": 0},
        {"account_id": "b", "billing_period": "2026-03", "currency": "USD", "net": 100, "tax": 20, "total": 120},
    ]
    table = reports.write_report(invoices, "table") or ""
    assert "billing_period" in table and "2026-04" in table


def test_json_and_parquet_keep_huge_money_exact(store: Store, tmp_path: Path) -> None:
    store.apply([manifest(work_items=3, rows=3)], [result(f"w{i}", partial(net=BIG, tax=BIG)) for i in range(3)])
    frame = reports.invoices(store, "b1")

    text = reports.write_report(frame, "json") or ""
    assert '"total": 54000000000000000000' in text and json.loads(text)[0]["total"] == 6 * BIG

    with pytest.raises(ValueError, match="output"):
        reports.write_report(frame, "parquet", None)
    out = tmp_path / "invoices.parquet"
    assert reports.write_report(frame, "parquet", out) is None
    table = pq.read_table(out)
    assert table.schema.field("total").type == pa.decimal128(38, 0)
    assert table.column("total").to_pylist() == [Decimal(6 * BIG)]


def test_csv_escapes_formulas(store: Store, tmp_path: Path) -> None:
    raws = ['=HYPERLINK("http://x")', "+1", "-2", "@SUM(A1)", "plain"]
    rejected = [{"row": i + 1, "reason": "missing_field", "raw": raw} for i, raw in enumerate(raws)]
    store.apply([manifest(work_items=1, rows=len(raws))], [result("w1", rejects=rejected)])

    text = reports.write_report(reports.rejects(store, "b1"), "csv") or ""
    cells = [row["raw"] for row in csv.DictReader(io.StringIO(text))]
    assert cells == ['\'=HYPERLINK("http://x")', "'+1", "'-2", "'@SUM(A1)", "plain"]
    out = tmp_path / "rejects.csv"
    assert reports.write_report(reports.rejects(store, "b1"), "csv", out) is None
    assert out.read_text(encoding="utf-8") == text


def test_rejects_round_trip_and_all_rejected_batch_completes(store: Store) -> None:
    rejected = [
        {"row": row, "reason": "invalid_quantity", "raw": json.dumps({"quantity": f"x{row}"})}
        for row in range(12_000, 0, -1)
    ]
    store.apply([manifest(work_items=2, rows=12_000)], [result("w2", rejects=rejected[:5_000])])
    outcome = store.apply([], [result("w1", rejects=rejected[5_000:])])

    assert outcome.completed_batches == ["b1"]
    status = store.batch("b1")
    assert status is not None and (status.state, status.rows, status.rejected, status.accepted) == (
        "complete",
        12_000,
        12_000,
        0,
    )
    frame = reports.rejects(store, "b1")
    assert list(frame.columns) == ["row", "reason", "raw"] and len(frame) == 12_000
    assert list(frame["row"][:3]) == [1, 2, 3] and json.loads(frame["raw"][0]) == {"quantity": "x1"}

    store.apply([manifest(work_items=2, rows=12_000)], [result("w1", rejects=rejected[5_000:])])  # redelivered
    assert len(reports.rejects(store, "b1")) == 12_000
    assert store.batch("b1") == status


def test_held_repeats_are_decided_once_every_row_is_validated(store: Store) -> None:
    """``duplicate_transaction_id`` is decided last, among otherwise valid rows: a repeat of an accepted
    first occurrence is a duplicate; of a rejected one, the earliest otherwise valid repeat is counted and
    the later ones are duplicates. Nothing held counts before the batch's every work item is in."""
    # Row 1 (id A) is accepted, row 2 (id B) rejected; rows 3 and 5 repeat A, rows 4 and 6 repeat B.
    w1 = result("w1", partial(net=100, tax=10), rejects=[{"row": 2, "reason": "invalid_quantity", "raw": "{}"}])
    w2 = result("w2", held=[held_row(3, 1, net=1000), held_row(6, 2, net=3000)])
    w3 = result("w3", held=[held_row(5, 1, net=5000), held_row(4, 2, net=2000)])
    store.apply([manifest(work_items=3, rows=6)], [w2, w1])
    store.apply([], [], [PoisonNotice("b1", "w3", "checksum_mismatch")])
    status = store.batch("b1")
    assert status is not None and (status.state, status.accepted, status.rejected) == ("failed", 1, 1)
    assert list(reports.aggregates(store, "b1")["net"]) == [100], "held rows wait for every row"

    outcome = store.apply([], [w3])  # replayed from the poison queue

    assert outcome.completed_batches == ["b1"]
    status = store.batch("b1")
    assert status is not None and (status.rows, status.accepted, status.rejected) == (6, 2, 4)
    assert status.transactions_recorded == 2
    assert list(reports.aggregates(store, "b1")["net"]) == [100 + 2000]
    frame = reports.rejects(store, "b1")
    assert list(zip(frame["row"], frame["reason"], frame["raw"], strict=True)) == [
        (2, "invalid_quantity", "{}"),
        (3, "duplicate_transaction_id", '{"row": 3}'),
        (5, "duplicate_transaction_id", '{"row": 5}'),
        (6, "duplicate_transaction_id", '{"row": 6}'),
    ]
    store.apply([manifest(work_items=3, rows=6)], [w3, w2])  # redelivered: no change
    assert store.batch("b1") == status and len(reports.rejects(store, "b1")) == 4
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(held)).scalar() == 0, "decided rows go"


def test_refused_manifest(store: Store) -> None:
    outcome = store.apply([manifest(work_items=0, rows=0, refused="file is not UTF-8")], [])

    status = store.batch("b1")
    assert outcome.completed_batches == []
    assert status is not None and (status.state, status.refused_reason) == ("refused", "file is not UTF-8")
    assert [s.batch_id for s in store.batches()] == ["b1"]


def test_poisoned_item_fails_the_batch_until_a_replay_completes_it(store: Store) -> None:
    store.apply([manifest(work_items=2, rows=2)], [result("w1")])
    notice = PoisonNotice("b1", "w2", "unknown_reference_data")
    assert store.apply([], [], [notice]).failed_batches == ["b1"]
    assert store.apply([], [], [notice]).failed_batches == []  # a repeated notice changes nothing
    status = store.batch("b1")
    assert status is not None and (status.state, status.poisoned_items, status.completed_items) == ("failed", 1, 1)
    assert status.transactions_recorded == 1

    replayed = store.apply([], [result("w2")])
    assert (replayed.new_items, replayed.duplicate_items, replayed.completed_batches) == (1, 0, ["b1"])
    status = store.batch("b1")
    assert status is not None and (status.state, status.poisoned_items, status.completed_items) == ("complete", 0, 2)
    assert status.transactions_recorded == 2
    assert store.apply([], [result("w2")], [notice]).duplicate_items == 1  # late copies of either change nothing
    assert store.batch("b1") == status


def test_the_store_adds_requests_per_batch(store: Store) -> None:
    w1, w2 = result("w1", partial(transactions=3)), result("w2", rejects=[{"row": 4, "reason": "x", "raw": "{}"}])
    store.apply([manifest("b1", work_items=2, rows=4)], [w1], requests={"b1": 7})
    store.apply([], [w1, w2], requests={"b1": 5})  # a redelivery still cost requests
    status = store.batch("b1")
    assert status is not None and status.state == "complete"
    assert status.requests == 12
    assert status.to_json_dict()["requests_per_1000"] == 12 * 1000 / 3, "per accepted transaction"


def test_only_settled_batches_past_the_retention_lose_their_claim_checks(store: Store) -> None:
    store.apply([manifest("complete", work_items=1, rows=1)], [result("c1", partial(), batch_id="complete")])
    store.apply([manifest("refused", work_items=0, rows=0, refused="file is not UTF-8")], [])
    store.apply([manifest("processing", work_items=2, rows=2)], [result("p1", partial(), batch_id="processing")])
    store.apply([manifest("failed", work_items=1, rows=1)], [], [PoisonNotice("failed", "f1", "checksum_mismatch")])
    now = datetime.now(UTC)

    assert store.claims_to_delete(now - timedelta(hours=1)) == []  # settled too recently
    assert sorted(store.claims_to_delete(now + timedelta(seconds=1))) == [
        "complete",
        "refused",
    ]  # a failed batch can be replayed
    store.mark_claims_deleted("complete")
    assert store.claims_to_delete(now + timedelta(seconds=1)) == ["refused"]
    status = store.batch("complete")
    assert status is not None and status.claims_deleted_at is not None
    assert status.to_json_dict()["claims_deleted_at"] == status.claims_deleted_at.isoformat()
    store.apply([], [result("c1", partial(), batch_id="complete")])  # a late duplicate keeps the mark
    assert store.claims_to_delete(now + timedelta(hours=1)) == ["refused"]


def _at_once(action: Callable[[], object], threads: int) -> list[BaseException]:
    """Run ``action`` on ``threads`` threads at once; what they raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:
            errors.append(exc)

    started = [threading.Thread(target=run) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    return errors


def test_a_new_sqlite_database_opened_by_many_connections_at_once_ends_in_wal(tmp_path: Path) -> None:
    """SQLite refuses the switch to WAL at once ("database is locked") while another connection holds
    the new file; each connection must wait for its turn instead of failing. The new file has the store's pages."""
    for round_ in range(20):
        found = _journal_modes_at_once(sa.make_url(f"sqlite:///{tmp_path}/{round_}.db"), 8)
        assert found == [("wal", SQLITE_PAGE_BYTES)] * 8


def test_a_sqlite_database_made_before_keeps_its_page_size_and_opens(tmp_path: Path) -> None:
    made = tmp_path / "before.db"
    with closing(sqlite3.connect(made)) as conn:
        conn.execute("PRAGMA page_size = 4096")
        conn.execute("VACUUM")
    with Store(f"sqlite:///{made}") as store:
        store.apply([manifest("b1", work_items=1, rows=1)], [result("b1:0", partial())])
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA page_size").scalar_one() == 4096
        status = store.batch("b1")
        assert status is not None and status.state == "complete"


def _journal_modes_at_once(url: sa.URL, connections: int) -> list[tuple[str, int]]:
    """The journal mode and page size each of ``connections`` engines finds, all connecting to ``url`` at once."""
    barrier = threading.Barrier(connections)
    modes: list[tuple[str, int]] = []

    def connect() -> None:
        engine = create_engine(url)
        try:
            barrier.wait()
            with engine.connect() as conn:
                mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar_one()
                modes.append((mode, conn.exec_driver_sql("PRAGMA page_size").scalar_one()))
        finally:
            engine.dispose()

    assert not _at_once(connect, connections)
    return modes


def test_migrations_are_idempotent_and_safe_concurrently(sql_url: str) -> None:
    assert not _at_once(lambda: Store(sql_url).close(), 4)

    with Store(sql_url) as store:
        store.migrate()
        with store.engine.connect() as conn:
            head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all() == [head]
        assert set(sa.inspect(store.engine).get_table_names()) >= {"batches", "work_items", "aggregates", "rejects"}


def test_a_store_at_the_newest_revision_opens_without_alembic(sql_url: str) -> None:
    assert ScriptDirectory(str(MIGRATIONS)).get_current_head() == SCHEMA_REVISION
    Store(sql_url).close()  # migrated
    opened = "import sys; from store import Store; Store(sys.argv[1]).close()"
    opened += "; print('alembic' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", opened, sql_url], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.postgres
@pytest.mark.parametrize("migrated_url", ["postgresql"], indirect=True)
def test_a_patient_store_rides_out_a_connection_cut_as_it_checks_its_schema(migrated_url: str) -> None:
    """The server cuts the connection in the middle of the schema's check (as when it stops just then: here the
    first read of ``alembic_version`` terminates its own backend): a store opened with patience says it waits and
    opens; one without it fails at once."""
    with Store(migrated_url, migrate=False) as store, store.engine.begin() as conn:
        conn.exec_driver_sql("CREATE SEQUENCE reads")
        conn.exec_driver_sql(
            "CREATE FUNCTION cut_first() RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN "
            "IF nextval('reads') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF; RETURN true; END $$"
        )
        conn.exec_driver_sql("ALTER TABLE alembic_version RENAME TO alembic_version_kept")
        conn.exec_driver_sql("CREATE VIEW alembic_version AS SELECT * FROM alembic_version_kept WHERE cut_first()")
    said: list[str] = []
    with Store(migrated_url, patience=Patience(30, said.append)) as store:
        assert store.revision() == SCHEMA_REVISION
    assert len(said) == 1 and "the SQL store does not answer" in said[0]
    with Store(migrated_url, migrate=False) as store, store.engine.begin() as conn:
        conn.exec_driver_sql("SELECT setval('reads', 1, false)")  # the next read is cut again
    with pytest.raises(InfrastructureError, match="SQL store unavailable"):
        Store(migrated_url)
