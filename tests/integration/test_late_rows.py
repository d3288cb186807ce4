"""Late rows in the store, on SQLite and PostgreSQL: rows of a period closed before their batch completed are
counted at once, named late per period in the batch's status, and billed by the period's next close as a
debit note; completions racing a close are late exactly when that close left them out."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from store import SCHEMA_REVISION, Filters, Store
from support.ledger import with_seller
from support.records import complete, manifest, partial, result
from support.revisions import at_revision
from support.waiting import wait_until

NOW = datetime(2026, 4, 10, 9, 0, tzinfo=UTC)


def _late(store: Store, batch_id: str) -> dict[str, int]:
    status = store.batch(batch_id)
    assert status is not None
    return dict(status.to_json_dict()["late"])


def test_rows_of_a_closed_period_are_counted_at_once_named_late_and_billed_by_its_next_close(store: Store) -> None:
    with_seller(store)
    complete(store, "early", partial("acct-1", net=100, tax=10))
    store.apply(  # running during the close: its March rows are late too
        [manifest("running", work_items=2)],
        [result("running-w1", partial("acct-1", net=1, tax=0, transactions=2), batch_id="running")],
    )
    (invoice,) = store.close_period("2026-03", now=NOW)
    assert store.close_period("2026-02", now=NOW) == [], "nothing to bill: the period is closed all the same"
    assert _late(store, "early") == {}

    store.apply([], [result("running-w2", partial("acct-2", net=5, tax=1, day="2026-04-01"), batch_id="running")])
    complete(
        store,
        "late",
        partial("acct-1", net=7, tax=1, transactions=3),
        partial("acct-2", net=4, tax=0, day="2026-02-27"),
        partial("acct-2", net=9, tax=0, day="2026-04-02"),  # an open period: not late
    )
    assert _late(store, "running") == {"2026-03": 2}
    assert _late(store, "late") == {"2026-02": 1, "2026-03": 3}
    listed = {s.batch_id: s.late for s in store.batches()}
    assert listed == {"early": {}, "running": {"2026-03": 2}, "late": {"2026-02": 1, "2026-03": 3}}
    march = store.invoices(Filters(period="2026-03")).rows
    assert [(r["account_id"], r["net"]) for r in march] == [("acct-1", 108)], "counted at once"

    (note,) = store.close_period("2026-03", now=NOW)
    assert (note.kind, note.account_id, note.net, note.number) == ("debit_note", "acct-1", 8, 2)
    assert [(line.sums.transactions, line.batches) for line in note.lines] == [(5, ("late", "running"))]
    (february,) = store.close_period("2026-02", now=NOW)
    assert (february.kind, february.net, february.lines[0].batches) == ("invoice", 4, ("late",))
    assert [d.number for d in store.documents()] == [invoice.number, 2, 3]
    assert _late(store, "late") == {"2026-02": 1, "2026-03": 3}, "late stays late once billed"


def test_completions_racing_a_close_are_late_exactly_when_it_left_them_out(sql_url: str) -> None:
    with with_seller(Store(sql_url)) as store:
        store.apply([manifest(f"b{i:02d}") for i in range(24)], [])
    errors: list[BaseException] = []
    started = threading.Barrier(3)

    def completing(batch_ids: list[str]) -> None:
        try:
            with Store(sql_url) as mine:
                started.wait()
                for batch_id in batch_ids:
                    rows = (partial(f"acct-{batch_id}", net=3, tax=0),)
                    mine.apply([], [result(f"{batch_id}-w1", *rows, batch_id=batch_id)])
        except BaseException as exc:
            errors.append(exc)

    def closing() -> None:
        try:
            with Store(sql_url) as mine:
                started.wait()
                mine.close_period("2026-03", now=NOW)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=completing, args=([f"b{i:02d}" for i in range(k, 24, 2)],)) for k in (0, 1)]
    threads.append(threading.Thread(target=closing))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    with Store(sql_url) as store:
        first = {b for d in store.documents() for line in d.lines for b in line.batches}
        late = {s.batch_id for s in store.batches() if s.late}
        assert all(s.late in ({}, {"2026-03": 1}) for s in store.batches())
        assert late == {f"b{i:02d}" for i in range(24)} - first, "late exactly when the close left it out"
        later = store.close_period("2026-03", now=NOW)
        assert {b for d in later for line in d.lines for b in line.batches} == late


def _waiting(store: Store) -> int:
    """Sessions of the store's database waiting for a lock (PostgreSQL)."""
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    with store.engine.connect() as conn:
        return int(conn.execute(sa.text(waiting)).scalar_one())


@pytest.mark.postgres
@pytest.mark.parametrize("sql_url", ["postgresql"], indirect=True)
def test_a_completion_waits_for_a_close_under_way_and_is_late(sql_url: str) -> None:
    """PostgreSQL only (SQLite runs one writer at a time): a close held up after reading what is billed, a batch
    completing meanwhile waits for it, then sees the period closed."""
    with with_seller(Store(sql_url)) as store:
        complete(store, "feb", partial("acct-1", day="2026-02-03"))
        store.close_period("2026-02", now=NOW)  # the counter of document numbers exists
        complete(store, "early", partial("acct-1"))
        store.apply([manifest("racing")], [])
        holder = store.engine.connect()
        holder.execute(sa.text("UPDATE counters SET value = value WHERE name = 'document_number'"))
        closing = threading.Thread(target=store.close_period, args=("2026-03",), kwargs={"now": NOW})
        closing.start()
        assert wait_until(lambda: _waiting(store) == 1, 30), "the close is held up"
        completing = threading.Thread(
            target=store.apply, args=([], [result("racing-w1", partial("acct-1", net=9), batch_id="racing")])
        )
        completing.start()
        wait_until(lambda: not completing.is_alive() or _waiting(store) == 2, 30)
        holder.rollback()
        holder.close()
        closing.join()
        completing.join()
        assert [line.batches for d in store.documents(period="2026-03") for line in d.lines] == [("early",)]
        assert _late(store, "racing") == {"2026-03": 1}, "completed after the close: late"


def test_a_store_with_documents_upgraded_takes_their_periods_as_closed(sql_url: str) -> None:
    at_revision(sql_url, "0009")
    engine = sa.create_engine(sql_url)
    stored = sa.Table("documents", sa.MetaData(), autoload_with=engine)
    issued = NOW.replace(tzinfo=None) if engine.dialect.name == "sqlite" else NOW
    money = {m: 0 if engine.dialect.name == "postgresql" else "0" for m in ("net", "tax", "total")}
    head = dict(kind="invoice", account_id="acct-1", currency="USD", issued_at=issued, pricebooks="", tax_tables="")
    with engine.begin() as conn:
        conn.execute(sa.insert(stored).values(number=1, period="2026-03", **head, **money))
    engine.dispose()

    with Store(sql_url) as store:  # upgrades in place
        assert store.revision() == SCHEMA_REVISION
        complete(store, "after", partial("acct-1", day="2026-03-09"), partial("acct-1", day="2026-04-01"))
        assert _late(store, "after") == {"2026-03": 1}
