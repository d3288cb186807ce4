"""The ledger in the store, on SQLite and PostgreSQL: batch sequence numbers, voided batches, and a store made
before the ledger upgraded in place, then its period closed."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import sqlalchemy as sa

from billing import reports
from store import SCHEMA_REVISION, AlreadyVoided, Filters, LedgerError, Store
from store.schema import aggregates
from support.ledger import with_seller
from support.records import complete, manifest, partial, result
from support.revisions import at_revision

T0 = datetime(2026, 3, 5, 12, 0, tzinfo=UTC)


def _seqs(store: Store) -> dict[str, int | None]:
    return {status.batch_id: status.seq for status in store.batches()}


def test_accepted_batches_are_numbered_in_acceptance_order_and_refused_ones_not(store: Store) -> None:
    # Results first: a batch without its manifest is not accepted yet.
    store.apply([], [result("early-w1", batch_id="early")])
    assert _seqs(store) == {"early": None}
    store.apply(
        [
            manifest("later", accepted_at=T0 + timedelta(seconds=1)),
            manifest("refused", refused="file is not UTF-8", accepted_at=T0),
            manifest("first", accepted_at=T0),
        ],
        [],
    )
    assert _seqs(store) == {"early": None, "first": 1, "later": 2, "refused": None}
    store.apply([manifest("early", accepted_at=T0 - timedelta(hours=1))], [])
    store.apply([manifest("first", accepted_at=T0), manifest("later")], [])  # a manifest again: nothing renumbered
    assert _seqs(store) == {"early": 3, "first": 1, "later": 2, "refused": None}
    status = store.batch("early")
    assert status is not None and status.state == "complete"
    assert (status.to_json_dict()["seq"], status.to_json_dict()["voided"]) == (3, False)


def test_concurrent_controllers_take_every_number_once(sql_url: str) -> None:
    Store(sql_url).close()
    errors: list[BaseException] = []

    def controller(name: str) -> None:
        try:
            with Store(sql_url) as mine:
                for i in range(8):
                    mine.apply([manifest(f"{name}-{i}"), manifest(f"shared-{i}")], [])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=controller, args=(name,)) for name in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    with Store(sql_url) as store:
        seqs = _seqs(store)
    assert len(seqs) == 3 * 8 + 8
    assert sorted(s for s in seqs.values() if s is not None) == list(range(1, len(seqs) + 1)), "gap-free, no reuse"


def test_a_voided_batch_counts_nowhere_but_its_aggregates_stay(store: Store) -> None:
    complete(store, "kept", partial("acct-1", net=50, tax=10))
    complete(store, "wrong", partial("acct-1", net=700, tax=7), partial("acct-2", net=3, tax=0))
    before = store.invoices()
    assert [(r["account_id"], r["net"]) for r in before.rows] == [("acct-1", 750), ("acct-2", 3)]

    voided = store.void("wrong")

    assert voided.voided and voided.state == "complete" and voided.seq == 2
    status = store.batch("wrong")
    assert status is not None and status.to_json_dict()["voided"] is True and status.voided_at == voided.voided_at
    after = store.invoices()
    assert [(r["account_id"], r["net"], r["batches"]) for r in after.rows] == [("acct-1", 50, ["kept"])]
    assert [(b.batch_id, b.state) for b in after.excluded] == [("wrong", "voided")]
    named = store.invoices(Filters(batches=("wrong", "kept")))
    assert [r["batches"] for r in named.rows] == [["kept"]] and [b.batch_id for b in named.excluded] == ["wrong"]
    assert reports.aggregates(store, "wrong").empty and reports.invoices(store, "wrong").empty
    assert sum(r["transactions"] for r in store.daily().rows) == 1
    with store.engine.connect() as conn:
        stored = conn.execute(sa.select(aggregates.c.net).where(aggregates.c.batch_id == "wrong")).scalars().all()
    assert sorted(stored) == [Decimal(3), Decimal(700)], "its aggregates stay stored"


def test_void_refuses_unknown_incomplete_and_voided_batches_and_changes_nothing(store: Store) -> None:
    store.apply([manifest("running", work_items=2)], [result("running-w1", batch_id="running")])
    complete(store, "done")
    store.void("done")
    snapshot = store.batches()
    for batch_id, error, words in (
        ("nosuch", LedgerError, "unknown"),
        ("running", LedgerError, "processing, not complete"),
        ("done", AlreadyVoided, "voided before"),
    ):
        with pytest.raises(error, match=words) as refused:
            store.void(batch_id)
        assert "\n" not in str(refused.value)
    assert store.batches() == snapshot


def test_a_store_made_before_the_ledger_upgrades_in_place_and_is_used(sql_url: str) -> None:
    at_revision(sql_url, "0007")
    engine = sa.create_engine(sql_url)
    batches = sa.Table("batches", sa.MetaData(), autoload_with=engine)
    stored_aggregates = sa.Table("aggregates", sa.MetaData(), autoload_with=engine)
    assert "seq" not in batches.c and "voided_at" not in batches.c
    common = dict(source="f.csv", rows=1, accepted=1, rejected=0, work_items=1, completed_items=1)
    common |= dict(poisoned_items=0, transactions_recorded=1, requests=0, updated_at=T0)
    with engine.begin() as conn:
        for batch_id, state, accepted_at, refused in (
            ("old-b", "complete", T0 + timedelta(minutes=1), None),
            ("old-a", "complete", T0, None),
            ("old-refused", "refused", T0, "not UTF-8"),
        ):
            values = dict(batch_id=batch_id, state=state, accepted_at=accepted_at.replace(tzinfo=None))
            conn.execute(sa.insert(batches).values(**common, **values, refused_reason=refused))
        for batch_id, net in (("old-a", 11), ("old-b", 22)):
            row: dict[str, object] = {**partial("acct-1", net=net, tax=1), "billing_day": T0.date()}
            row = {k: v for k, v in row.items() if k in stored_aggregates.c}  # the columns of revision 0007
            if engine.dialect.name == "sqlite":  # money and quantity as decimal text there
                row = {k: format(v, "f") if isinstance(v, Decimal) else v for k, v in row.items()}
            conn.execute(sa.insert(stored_aggregates).values(batch_id=batch_id, **row))
    engine.dispose()

    with Store(sql_url) as store:  # upgrades in place
        assert store.revision() == SCHEMA_REVISION
        assert _seqs(store) == {"old-a": 1, "old-b": 2, "old-refused": None}
        assert [r["net"] for r in store.invoices().rows] == [33]
        complete(store, "new", partial("acct-1", net=5, tax=0), accepted_at=T0 + timedelta(days=1))
        assert _seqs(store)["new"] == 3
        store.void("old-b")
        assert [r["net"] for r in store.invoices().rows] == [16]
        (invoice,) = with_seller(store).close_period("2026-03")  # its periods close
        assert (invoice.number, invoice.kind, invoice.net) == (1, "invoice", 16)
        assert [(line.pricebook, line.batches) for line in invoice.lines] == [("", ("old-a",)), ("pb", ("new",))], (
            "a line per price book: the old batch's none recorded"
        )
        assert store.close_period("2026-03") == []
