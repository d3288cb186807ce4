"""Transaction ids across batches, through the roles' code in this process (the initiator's cut and marking with
the id filter, the processors' rating) and the real store on SQLite and PostgreSQL: every batch's counts and
aggregates equal to the reference model's, which counts each id once across the batches in sequence order."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from benchmarks.ledger import Cut, InProcess, apply, ledger_filter, load_ledger
from benchmarks.reference_model import Ledger, Row, read_prices, read_rates
from billing import reports
from billing.sample import sample_price_book_bytes, sample_tax_table_bytes
from shared.messages import IdsPart
from shared.rules.duplicates import id_hashes
from shared.tables import decode_table
from store import MIGRATIONS, BatchState, Store
from store.engine import writing
from store.ledger import ids as ids_module
from store.ledger.ids import IDS, SEGMENT_ROWS, insert_ids
from store.ledger.numbers import take_numbers
from store.schema import batches, ledger_id_texts, ledger_ids
from support.ledger import csv_of, manifest_with, rows_of
from support.revisions import at_revision


def _model() -> Ledger:
    return Ledger(read_prices(sample_price_book_bytes().decode()), read_rates(sample_tax_table_bytes().decode()))


def _check(store: Store, batch_id: str, fates: list[Row | str], model: Ledger) -> None:
    """The stored batch counts the rows the model counts, with the same duplicates, quantity and totals."""
    status = store.batch(batch_id)
    assert status is not None and status.state == BatchState.complete
    counted = [f for f in fates if isinstance(f, Row)]
    assert counted, "the batch must count rows for the comparison to mean something"
    assert (status.accepted, status.rejected) == (len(counted), len(fates) - len(counted))
    stored = reports.rejects(store, batch_id)
    duplicates = sorted(int(r) for r in stored[stored["reason"] == "duplicate_transaction_id"]["row"])
    assert duplicates == [n for n, f in enumerate(fates, start=1) if f == "duplicate_transaction_id"]
    aggregates = reports.aggregates(store, batch_id)
    quantity = sum((Decimal(str(q)) for q in aggregates["quantity"]), Decimal(0))
    assert quantity == sum((r.quantity for r in counted), Decimal(0))
    assert sum(int(t) for t in aggregates["total"]) == sum(rated.total for _, rated in model.rated[batch_id])


def _run(store: Store, shared: InProcess, model: Ledger, batch_id: str, rows: list[dict[str, str | None]]) -> Cut:
    cut = shared.cut(batch_id, csv_of(rows))
    apply(store, cut)
    _check(store, batch_id, model.batch(batch_id, rows), model)
    return cut


@pytest.fixture(params=[None, 7], ids=["text-in-one-part", "text-in-parts-of-7"])
def text_parts(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids recorded with their text in one part per ids part, or in parts of 7 ids (an id found again is then read
    from one of many parts)."""
    if request.param is not None:
        monkeypatch.setattr(ids_module, "_INSERT_ROWS", request.param)


@pytest.mark.usefixtures("text_parts")
def test_an_overlapping_batch_counts_only_new_ids_and_a_void_releases_them(store: Store) -> None:
    shared, model = InProcess(bits=1 << 16), _model()
    first = rows_of([f"t{i}" for i in range(200)])
    first[5]["quantity"] = "1e3"  # invalid: t5 is not counted by the first batch
    first[7]["transaction_id"] = "t" * 70  # too long to be an id: rejected, and no trouble to the ledger
    _run(store, shared, model, "first", first)
    # A re-export of part of the first, new ids, a repeat inside the batch, the invalid id valid now.
    second = rows_of([f"t{i}" for i in range(150, 260)] + ["t5", "t170", "n1", "n1"], quantity="3")
    cut = _run(store, shared, model, "second", second)
    assert sum(r.held.num_rows for r in cut.results) >= 51  # every shared id held for the exact check
    store.void("first")
    model.void("first")
    third = rows_of([f"t{i}" for i in range(0, 40)] + ["t160", "n1"], quantity="5")
    _run(store, shared, model, "third", third)  # the first's ids count again; the second's do not


def test_a_batch_waits_for_an_earlier_batch_still_running_that_shares_its_ids(store: Store) -> None:
    shared, model = InProcess(bits=1 << 16), _model()
    early, late = rows_of([f"a{i}" for i in range(100)]), rows_of([f"a{i}" for i in range(50, 120)], quantity="7")
    first = shared.cut("early", csv_of(early))
    second = shared.cut("late", csv_of(late))  # marked with the first's ids merged
    store.apply([first.manifest, second.manifest], [])
    outcome = store.apply([], second.results)
    assert outcome.completed_batches == [] and store.batch("late").state == BatchState.processing  # type: ignore[union-attr]
    outcome = store.apply([], first.results)
    assert outcome.completed_batches == ["early", "late"]
    _check(store, "early", model.batch("early", early), model)
    _check(store, "late", model.batch("late", late), model)


def test_a_batch_that_shares_no_id_with_a_running_batch_does_not_wait(store: Store) -> None:
    shared = InProcess(bits=1 << 16)
    first = shared.cut("one", csv_of(rows_of([f"x{i}" for i in range(100)])))
    second = shared.cut("two", csv_of(rows_of([f"y{i}" for i in range(100)])))
    store.apply([first.manifest, second.manifest], [])
    assert store.apply([], second.results).completed_batches == ["two"]


@pytest.mark.usefixtures("text_parts")
def test_ids_the_filter_could_not_hold_refuse_the_later_batch(store: Store) -> None:
    shared, model = InProcess(bits=1 << 16), _model()
    marked = InProcess(bits=1 << 16).filter  # what both initiators read before either merged
    one, two = rows_of([f"c{i}" for i in range(60)]), rows_of([f"c{i}" for i in range(30, 90)])
    first = shared.cut("one", csv_of(one), marked_with=marked)
    second = shared.cut("two", csv_of(two), marked_with=marked)
    assert first.manifest.filter_serial == 0 and second.manifest.filter_serial == 1
    second = Cut(manifest_with(second.manifest, filter_serial=0), second.results)
    store.apply([first.manifest, second.manifest], [])
    assert store.apply([], second.results).completed_batches == []  # waits for "one", which it could not check
    store.apply([], first.results)
    status = store.batch("two")
    assert status is not None and status.state == BatchState.refused and "one" in (status.refused_reason or "")
    assert status.accepted == 0 and reports.aggregates(store, "two").empty
    _check(store, "one", model.batch("one", one), model)
    third = shared.cut("three", csv_of(two))  # submitted again: checked, its shared ids duplicates
    apply(store, third)
    _check(store, "three", model.batch("three", two), model)


@pytest.mark.usefixtures("text_parts")
def test_a_hash_shared_with_a_batch_debatched_at_the_same_time_refuses_nothing(store: Store) -> None:
    """Compared id by id with an earlier batch the filter could not hold, a batch shares only a hash with it (another
    id of the same hash): no id is shared, nothing refused."""
    shared, model = InProcess(bits=1 << 16), _model()
    marked = InProcess(bits=1 << 16).filter
    one, two = rows_of([f"d{i}" for i in range(60)]), rows_of([f"e{i}" for i in range(60)])
    first = shared.cut("one", csv_of(one), marked_with=marked)
    second = shared.cut("two", csv_of(two), marked_with=marked)
    second = Cut(manifest_with(second.manifest, filter_serial=0), second.results)
    store.apply([first.manifest, second.manifest], [])
    with writing(store.engine) as conn:
        of_one = sa.select(batches.c.id_segment, batches.c.id_key).where(batches.c.batch_id == "one")
        segment, key = conn.execute(of_one).one()
        insert_ids(conn, segment, key, id_hashes(pa.array(["e7"])), np.array([999]), pa.array(["not-e7"]))
    assert store.apply([], second.results).completed_batches == []  # waits for "one", which it could not check
    assert store.apply([], first.results).completed_batches == ["one", "two"]
    _check(store, "one", model.batch("one", one), model)
    _check(store, "two", model.batch("two", two), model)


def test_a_batch_is_compared_with_one_debatched_at_the_same_time_in_passes_however_stale_the_statistics(
    store: Store,
) -> None:
    """The PostgreSQL soak's case: statistics taken before the segment holding both batches' ids began. A join of
    the two batches' ids then ran as a scan of the segment per id (minutes at this size); each batch's ids read on
    their own stay far below the statement timeout set here."""
    earlier = pa.array([f"e{i}" for i in range(300_000)])
    per_key = len(earlier) // 20
    with writing(store.engine) as conn:
        for n, key in enumerate(range(1_000, 1_020)):  # no batch has these keys
            ids = earlier[n * per_key : (n + 1) * per_key]
            insert_ids(conn, 0, key, id_hashes(ids), np.arange(n * per_key, (n + 1) * per_key), ids)
        take_numbers(conn, IDS, SEGMENT_ROWS)  # segment 0 is full: the next batches' ids start segment 1
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE")
        if store.engine.dialect.name == "postgresql":
            conn.exec_driver_sql(f"ALTER DATABASE \"{store.engine.url.database}\" SET statement_timeout = '10s'")
    store.engine.dispose()  # every connection from here on has the timeout
    shared, model = InProcess(bits=1 << 20), _model()
    marked = InProcess(bits=1 << 20).filter
    one, two = rows_of([f"s{i}" for i in range(10_000)]), rows_of([f"s{i}" for i in range(5_000, 15_000)])
    first = shared.cut("one", csv_of(one), marked_with=marked)
    second = shared.cut("two", csv_of(two), marked_with=marked)
    store.apply([first.manifest, manifest_with(second.manifest, filter_serial=0)], first.results)
    store.apply([], second.results)
    status = store.batch("two")
    assert status is not None and status.state == BatchState.refused
    assert (status.refused_reason or "").startswith("shares 5000 transaction ids with batch one")
    _check(store, "one", model.batch("one", one), model)
    apply(store, shared.cut("three", csv_of(two)))  # submitted again: its ids looked up in the ledger by hash
    _check(store, "three", model.batch("three", two), model)


def test_held_ids_are_looked_up_in_every_segment_once_however_many_earlier_batches(store: Store) -> None:
    """The 50,000,000-id bench's case on PostgreSQL: with no statistics on the batches table, the planner took the
    earlier batches for one row, and the lookup of the held ids joined to them ran once per earlier batch (15 s
    there). At this size the planner would not choose that plan; the settings below leave it no other, and a
    statement timeout stops it. Found by hash first, then their batches by key, the lookup is one pass."""
    loaded, batch_rows = 300_000, 300  # 1,000 complete batches
    load_ledger(store, loaded, batch_rows=batch_rows)
    with writing(store.engine) as conn:
        take_numbers(conn, IDS, 60 * SEGMENT_ROWS)  # 61 segments to look in
    if store.engine.dialect.name == "postgresql":
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE ledger_ids")  # the bench's, and autovacuum's; not batches
            database = f'"{store.engine.url.database}"'
            for setting in ("enable_seqscan", "enable_bitmapscan", "enable_hashjoin", "enable_mergejoin"):
                conn.exec_driver_sql(f"ALTER DATABASE {database} SET {setting} = off")
            conn.exec_driver_sql(f"ALTER DATABASE {database} SET statement_timeout = '2s'")
        store.engine.dispose()  # every connection from here on has them
    shared, model = InProcess(bits=1 << 22), _model()
    shared.filter, shared.serial = ledger_filter(loaded, 1 << 22, batch_rows=batch_rows)
    earlier = [f"ledger-{i}" for i in range(2_000)]  # billed by the first batches loaded
    model.batch("loaded", rows_of(earlier))
    cut = _run(store, shared, model, "later", rows_of(earlier + [f"f{i}" for i in range(1_000)]))
    assert cut.held_rows >= 2_000


def test_a_batch_cut_again_is_compared_with_every_batch_its_first_cut_could_not_check(store: Store) -> None:
    """The SQLite soak's case: the initiator sent every work item of "two", marked against the filter of then, and
    died before its merge; "four" was cut and merged meanwhile; the re-cut of "two" marked against a filter holding
    "four", but its items were recorded already (the first copy of a work item counts). The ledger must compare
    "two" with "four" as of its first cut: it is refused, not billed twice."""
    shared, model = InProcess(bits=1 << 16), _model()
    two, four = rows_of([f"r{i}" for i in range(300)]), rows_of([f"r{i}" for i in range(100, 400)], quantity="3")
    first_life = InProcess(bits=1 << 16).cut("two", csv_of(two))  # marked against the empty filter (serial 0)
    assert {result.marked for result in first_life.results} == {0}  # from the header, through the processor's code
    apply(store, shared.cut("four", csv_of(four)))
    _check(store, "four", model.batch("four", four), model)
    again = shared.cut("two", csv_of(two))  # marked against a filter holding "four"
    assert again.manifest.filter_serial == 1 and sum(r.held.num_rows for r in again.results) == 200
    store.apply([], first_life.results, ids=again.ids)
    store.apply([again.manifest], again.results)
    status = store.batch("two")
    assert status is not None and status.state == BatchState.refused, status
    assert (status.refused_reason or "").startswith("shares 200 transaction ids with batch four")
    assert status.accepted == 0 and reports.aggregates(store, "two").empty
    apply(store, shared.cut("two-again", csv_of(two)))  # submitted again: checked, its shared ids duplicates
    _check(store, "two-again", model.batch("two-again", two), model)


def test_a_hash_shared_by_two_ids_never_rejects_a_row(store: Store) -> None:
    shared, model = InProcess(bits=1 << 16), _model()
    _run(store, shared, model, "first", rows_of(["k1", "k2"]))
    # Another id of the same 64-bit hash as "fresh", billed earlier: the filter holds it, the ledger has the hash.
    fresh = id_hashes(pa.array(["fresh"]))
    shared.filter.add(fresh.view(np.uint64))
    with writing(store.engine) as conn:
        insert_ids(conn, 0, 1, fresh, np.array([99]), pa.array(["not-fresh"]))
    cut = _run(store, shared, model, "second", rows_of(["fresh", "k1"]))
    assert sum(r.held.num_rows for r in cut.results) == 2


def test_ids_parts_are_recorded_before_the_manifest_and_the_batch_waits_for_every_part(store: Store) -> None:
    shared, model = InProcess(bits=1 << 16, work_item_size=200, part_rows=250), _model()
    rows = rows_of([f"p{i}" for i in range(1200)] + ["p7"])  # a frame of the inbox holds about 230 rows
    cut = shared.cut("parted", csv_of(rows))
    assert cut.manifest.id_parts == len(cut.ids) >= 3 and cut.manifest.ids is not None
    assert sum(part.ids.num_rows for part in cut.ids) + cut.manifest.ids.num_rows == 1200
    first, *others = cut.ids
    store.apply([], [], ids=[first, first])  # before its manifest, delivered twice
    store.apply([cut.manifest], cut.results, ids=others[:-1])
    status = store.batch("parted")
    assert status is not None and status.state == BatchState.processing  # one part is still on its way
    assert store.apply([], [], ids=[others[-1]]).completed_batches == ["parted"]
    _check(store, "parted", model.batch("parted", rows), model)
    with store.engine.connect() as conn:
        recorded = conn.scalar(sa.select(sa.func.count()).select_from(ledger_ids))
    assert recorded == 1200
    store.apply([], [], ids=[first])  # late again, after completion: spent
    with store.engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(ledger_ids)) == recorded
    again = rows_of([f"p{i}" for i in range(0, 1300, 10)])
    _run(store, shared, model, "again", again)  # ids from every part are known to later batches


def test_a_batch_waits_for_an_earlier_batch_whose_ids_part_is_still_on_its_way(store: Store) -> None:
    shared, model = InProcess(bits=1 << 16, work_item_size=200, part_rows=250), _model()
    early = rows_of([f"w{i}" for i in range(1200)])
    first = shared.cut("early", csv_of(early))
    *recorded, on_its_way = first.ids
    late = rows_of([*on_its_way.ids["transaction_id"].to_pylist()[:60], "fresh"], quantity="7")
    second = shared.cut("late", csv_of(late))  # marked with the first's ids merged: every shared id held
    store.apply([first.manifest, second.manifest], first.results, ids=recorded)  # numbered; one part not recorded
    outcome = store.apply([], second.results)
    status = store.batch("late")
    assert outcome.completed_batches == [] and status is not None and status.state == BatchState.processing
    assert status.waiting_for == "early"
    assert store.apply([], [], ids=[on_its_way]).completed_batches == ["early", "late"]
    _check(store, "early", model.batch("early", early), model)
    _check(store, "late", model.batch("late", late), model)  # the shared ids: duplicates of the first's


def test_a_refused_batch_releases_the_ids_its_parts_recorded(store: Store) -> None:
    shared, model = InProcess(bits=1 << 16, work_item_size=200, part_rows=250), _model()
    rows = rows_of([f"r{i}" for i in range(1200)])
    cut = shared.cut("broken", csv_of(rows))
    store.apply([], [], ids=cut.ids)
    store.apply([manifest_with(cut.manifest, refused="the file is damaged at line 97", ids=None)], cut.results)
    status = store.batch("broken")
    assert status is not None and status.state == BatchState.refused
    with store.engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(ledger_ids)) == 0
    _run(store, shared, model, "resent", rows)  # nothing of the refused batch counted: every id counts now


def test_a_store_with_ids_recorded_by_seq_upgrades_and_its_ids_still_count(sql_url: str) -> None:
    at_revision(sql_url, "0011")  # ids keyed by the batch's seq there
    shared, model = InProcess(bits=1 << 16), _model()
    old = rows_of(["m1", "m2"])
    model.batch("old", old)
    hashes = id_hashes(pa.array(["m1", "m2"]))
    engine = sa.create_engine(sql_url)
    stored = {
        name: sa.Table(name, sa.MetaData(), autoload_with=engine) for name in ("batches", "ledger_ids", "counters")
    }
    now = datetime.now(UTC).replace(tzinfo=None)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(stored["batches"]).values(
                batch_id="old", source="old.csv", state="complete", rows=2, accepted=2, rejected=0, work_items=1,
                completed_items=1, poisoned_items=0, transactions_recorded=2, requests=0, updated_at=now,
                accepted_at=now, seq=1, filter_serial=0, id_serial=1, id_segment=0,
            )
        )  # fmt: skip
        conn.execute(
            sa.insert(stored["ledger_ids"]),
            [
                {"segment": 0, "id_hash": int(h), "batch_seq": 1, "row": row, "transaction_id": text}
                for row, (h, text) in enumerate(zip(hashes, ["m1", "m2"], strict=True), start=1)
            ],
        )
        conn.execute(sa.delete(stored["counters"]))
        conn.execute(
            sa.insert(stored["counters"]), [{"name": "batch_seq", "value": 1}, {"name": "ledger_ids", "value": 2}]
        )
    engine.dispose()
    shared.filter.add(hashes.view(np.uint64))
    shared.serial = 1
    with Store(sql_url) as store:  # upgrades in place
        _run(store, shared, model, "new", rows_of(["m1", "m3", "m2", "m4"]))
        assert store.batch("new").seq == 2  # type: ignore[union-attr]
        store.void("old")  # its ids, keyed by its seq before, are released
        model.void("old")
        _run(store, shared, model, "after", rows_of(["m2", "m5"]))


def test_overlapping_batches_recorded_and_completed_in_one_apply_count_each_id_once(store: Store) -> None:
    shared, model = InProcess(bits=1 << 16), _model()
    early, late = rows_of([f"o{i}" for i in range(100)]), rows_of([f"o{i}" for i in range(40, 130)], quantity="3")
    first, second = shared.cut("early", csv_of(early)), shared.cut("late", csv_of(late))
    # A controller back after a crash: both manifests and every result in one dequeued batch.
    outcome = store.apply([second.manifest, first.manifest], second.results + first.results)
    assert sorted(outcome.completed_batches) == ["early", "late"]
    _check(store, "early", model.batch("early", early), model)
    _check(store, "late", model.batch("late", late), model)


def test_ids_recorded_twice_under_other_parts_are_recorded_once(store: Store) -> None:
    shared, model = InProcess(bits=1 << 16, work_item_size=200, part_rows=250), _model()
    rows = rows_of([f"q{i}" for i in range(1200)])
    cut = shared.cut("again", csv_of(rows))
    first, second, *_ = cut.ids
    overlapping = IdsPart("again", 99, pa.concat_tables([first.ids, second.ids]))  # a cut with other boundaries
    store.apply([], [], ids=[first, overlapping])
    store.apply([manifest_with(cut.manifest, id_parts=len(cut.ids) + 1)], cut.results, ids=[*cut.ids[1:], overlapping])
    _check(store, "again", model.batch("again", rows), model)
    with store.engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(ledger_ids)) == 1200


def test_ids_are_recorded_whole_however_many_each_statement_names(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each id's hash and row as given, under its segment and key, with more ids than one statement names and a last
    statement of fewer, and its text in parts of the batch's; given again, they are left as they are."""
    monkeypatch.setattr(ids_module, "_INSERT_ROWS", 500)  # three parts of text, the last of fewer
    ids = pa.array([f"tx-{i}-{'é' * (i % 3)}" for i in range(1_234)] + ["x" * 80])
    rows = np.arange(10, 10 + len(ids), dtype=np.int64)
    hashes = id_hashes(ids)
    expected = {(3, h, 41, r) for h, r in zip(hashes.tolist(), rows.tolist(), strict=True)}
    for _ in range(2):
        with writing(store.engine) as conn:
            insert_ids(conn, 3, 41, hashes, rows, ids)
        with store.engine.connect() as conn:
            assert {tuple(r) for r in conn.execute(sa.select(ledger_ids))} == expected
            parts = conn.execute(sa.select(ledger_id_texts)).all()
        assert [(p.batch_key, p.first_row, p.last_row) for p in parts] == [
            (41, 10, 509),
            (41, 510, 1009),
            (41, 1010, 1244),
        ]
        texts = pa.concat_tables([decode_table(p.ids) for p in parts])
        assert texts["row"].to_pylist() == rows.tolist() and texts["transaction_id"].to_pylist() == ids.to_pylist()


def test_the_ids_text_goes_back_into_the_rows_when_the_schema_goes_back(
    sql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 0017 down and up again: each id's text back beside its hash and row (revision 0016's table), then in
    parts again, every id of every part and batch found where it was."""
    monkeypatch.setattr(ids_module, "_INSERT_ROWS", 40)
    batches_ids = {7: pa.array([f"g{i}" for i in range(100)]), 8: pa.array([f"h{i}-é" for i in range(30)])}
    with Store(sql_url) as store, writing(store.engine) as conn:
        for key, ids in batches_ids.items():
            insert_ids(conn, 0, key, id_hashes(ids), np.arange(1, len(ids) + 1), ids)
    expected = {
        (key, int(h), row, text)
        for key, ids in batches_ids.items()
        for row, (h, text) in enumerate(zip(id_hashes(ids), ids.to_pylist(), strict=True), start=1)
    }
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    engine = sa.create_engine(sql_url)
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0016")
    with engine.connect() as conn:
        recorded = conn.exec_driver_sql("SELECT batch_key, id_hash, row, transaction_id FROM ledger_ids").all()
    assert {tuple(r) for r in recorded} == expected
    engine.dispose()
    with Store(sql_url) as store, store.engine.connect() as conn:  # upgrades in place
        parts = conn.execute(sa.select(ledger_id_texts)).all()
        texts = {
            (p.batch_key, row, text)
            for p in parts
            for row, text in zip(*decode_table(p.ids).to_pydict().values(), strict=True)
        }
        assert {(key, row, text) for key, _, row, text in expected} == texts
        assert {(p.batch_key, p.first_row, p.last_row) for p in parts} == {(7, 1, 100), (8, 1, 30)}
