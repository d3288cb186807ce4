"""The store's partial aggregates kept per work item and folded when a batch settles, refused batches and phase
timestamps, on SQLite and PostgreSQL (``sql_url`` from conftest), checked against an independent exact reference
(Python ints and ``decimal``)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from billing import reports
from billing.sample import generate
from shared.messages import PoisonNotice, WorkItemResult
from shared.wire import parse_results, results_envelope
from store import MIGRATIONS, ApplyOutcome, Store
from store import partials as store_partials
from store.schema import aggregates, batches, held, partials, work_items
from support import records
from support.benchmarks import run_benchmark
from support.records import held_row, manifest, result

ACCOUNTS = [f"acct-{i}" for i in range(5)]
CURRENCIES = {"CPU": "USD", "GPU": "JPY", "NET": "BHD"}
DAYS = ["2026-02-28", "2026-03-01", "2026-03-02"]
KEYS = [(account, product, day) for account in ACCOUNTS for product in CURRENCIES for day in DAYS]
Key = tuple[str, str, str, str]  # batch_id, account_id, product, billing_day


def partial(account: str = "acct-1", *, product: str = "CPU", **values: Any) -> dict[str, Any]:
    """:func:`support.records.partial` in the product's currency."""
    return records.partial(account, product=product, currency=CURRENCIES[product], **values)


def random_result(rng: random.Random, work_item_id: str, batch_id: str) -> WorkItemResult:
    """A work item's partials: distinct keys, money up to 10^21 minor units a row (sums pass 2^63)."""
    rows = []
    for account, product, day in rng.sample(KEYS, rng.randint(1, 25)):
        count = rng.randint(1, 1000)
        net = rng.randint(0, 10**21) if rng.random() < 0.3 else rng.randint(0, 10**6)
        quantity = Decimal(rng.randint(0, 10**15 * count)).scaleb(-6)
        rows.append(
            partial(account, product=product, day=day, transactions=count, quantity=quantity, net=net, tax=net // 7)
        )
    return result(work_item_id, *rows, batch_id=batch_id)


def reference(results: list[WorkItemResult]) -> dict[Key, list[Any]]:
    """Exact sums per key with Python ints and decimals, each work item counted once."""
    sums: dict[Key, list[Any]] = {}
    unique = {r.work_item_id: r for r in results}
    with localcontext() as context:
        context.prec = 100
        for item in unique.values():
            for row in item.partials.to_pylist():
                key = (item.batch_id, row["account_id"], row["product"], row["billing_day"])
                values = [
                    row["currency"],
                    row["transactions"],
                    row["quantity"],
                    *(int(row[c]) for c in ("net", "tax", "total")),
                ]
                current = sums.setdefault(key, [values[0], 0, Decimal(0), 0, 0, 0])
                for i in range(1, 6):
                    current[i] += values[i]
    return sums


def stored_text(store: Store) -> dict[Key, list[Any]]:
    """Every aggregate row as the database holds it (decimals as their text, dates as ISO text)."""
    query = sa.text(
        "SELECT batch_id, account_id, product, CAST(billing_day AS TEXT), currency, transactions, "
        "CAST(quantity AS TEXT), CAST(net AS TEXT), CAST(tax AS TEXT), CAST(total AS TEXT) FROM aggregates"
    )
    with store.engine.connect() as conn:
        return {tuple(row[:4]): list(row[4:]) for row in conn.execute(query)}


def canonical(sums: dict[Key, list[Any]]) -> dict[Key, list[Any]]:
    """The reference as ``stored_text`` shows it: quantity with exactly six decimals, money as integers."""
    with localcontext() as context:
        context.prec = 100
        return {
            key: [currency, count, format(quantity.quantize(Decimal("0.000001")), "f"), *map(str, money)]
            for key, (currency, count, quantity, *money) in sums.items()
        }


def edge_result(rng: random.Random, work_item_id: str, batch_id: str = "b1") -> WorkItemResult:
    """A work item's partials over a few keys (they repeat across work items), with values at the edges: zero, the
    smallest quantity, the largest a row can have, money past 2^63; and ``KEYS[7]``, once, 9 x 10^37 minor units
    (then any sum of it is added in a wider type than the stored one, and still fits that)."""
    rows = []
    for key in rng.sample(KEYS[:8], rng.randint(1, 4)):
        count = rng.randint(1, 10**6)
        quantity = rng.choice([Decimal(0), Decimal("0.000001"), Decimal("999999999.999999") * count])
        net = rng.choice([0, 1, 2**63 - 1, rng.randint(0, 10**30)]) if key != KEYS[7] else rng.randint(0, 10**6)
        rows.append((key, count, quantity, net))
    if work_item_id.endswith("-w7"):
        rows = [(KEYS[7], 1, Decimal("0.000001"), 9 * 10**37), *(row for row in rows if row[0] != KEYS[7])]
    return result(
        work_item_id,
        *(
            partial(
                account, product=product, day=day, transactions=count, quantity=quantity, net=net, tax=net // 10**10
            )
            for (account, product, day), count, quantity, net in rows
        ),
        batch_id=batch_id,
    )


@pytest.mark.parametrize("per_call", [1, 3])
def test_applies_adding_to_few_keys_again_and_again_stay_exact(store: Store, per_call: int) -> None:
    rng = random.Random(per_call)
    items = [edge_result(rng, f"b1-w{i}") for i in range(90)]
    rng.shuffle(items)
    store.apply([manifest(work_items=len(items), rows=sum(r.transactions for r in items))], [])
    for start in range(0, len(items), per_call):
        store.apply([], items[start : start + per_call] + rng.sample(items[:start], min(start, rng.randint(0, 1))))

    want = reference(items)
    assert max(values[3] for values in want.values()) > 9 * 10**37
    assert stored_text(store) == canonical(want)
    status = store.batch("b1")
    assert status is not None and (status.state, status.transactions_recorded) == (
        "complete",
        sum(r.transactions for r in items),
    )


@pytest.mark.parametrize(
    ("seed", "rows", "restarts"),
    [(1, None, False), (4, 40, False), (2, None, True), (3, 40, True)],
    ids=["summed", "summed-in-parts", "read", "read-in-parts"],
)
def test_fold_matches_the_exact_reference(
    store: Store, migrated_url: str, seed: int, rows: int | None, restarts: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every batch settles from the sums its store kept as it recorded the partials, or, with a store opened anew
    for each apply (a controller restarted), from its partials read back; with ``rows``, partials are summed that
    many or so at a time, each part added to the sums before."""
    if rows is not None:
        monkeypatch.setattr(store_partials, "_FOLD_ROWS", rows)
        monkeypatch.setattr(store_partials, "_PENDING_ROWS", rows)
    read_back = _counting_reads(monkeypatch)
    if restarts:

        def apply_anew(*args: Any) -> ApplyOutcome:
            with Store(migrated_url, migrate=False) as anew:
                return anew.apply(*args)

        monkeypatch.setattr(store, "apply", apply_anew)
    rng = random.Random(seed)
    items = [random_result(rng, f"{batch}-w{i}", batch) for batch in ("b1", "b2") for i in range(60)]
    poisoned = [items[3], items[70]]
    manifests = [
        manifest(batch, work_items=60, rows=sum(r.transactions for r in items if r.batch_id == batch))
        for batch in ("b1", "b2")
    ]
    store.apply(manifests[:1], [], [PoisonNotice(r.batch_id, r.work_item_id, "checksum_mismatch") for r in poisoned])
    pending = [r for r in items if r not in poisoned]
    rng.shuffle(pending)
    pending += poisoned  # replayed last: recovered from the poison queue
    sent: list[WorkItemResult] = []
    while pending:
        call = [pending.pop() for _ in range(min(len(pending), rng.randint(1, 12)))]
        duplicates = rng.sample(sent, min(len(sent), rng.randint(0, 4))) + call[:1]  # across and within calls
        outcome = store.apply(manifests if rng.random() < 0.2 else [], call + duplicates)
        assert (outcome.new_items, outcome.duplicate_items) == (len(call), len(duplicates))
        sent += call
    store.apply(manifests, rng.sample(sent, 10))

    want = reference(items)
    assert max(values[3] for values in want.values()) > 2**63
    assert stored_text(store) == canonical(want)
    assert (read_back.count > 0) == restarts
    for batch in ("b1", "b2"):
        status = store.batch(batch)
        assert status is not None
        assert (status.state, status.completed_items, status.poisoned_items) == ("complete", 60, 0)
        assert status.transactions_recorded == sum(r.transactions for r in items if r.batch_id == batch)
        frame = reports.aggregates(store, batch)
        assert sum(frame["total"]) == sum(v[5] for k, v in want.items() if k[0] == batch)
        assert all(type(v) is int for v in frame["net"])


class _counting_reads:
    """Counts the settles that read a batch's partials back."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        tables = store_partials._tables

        def counted(*args: Any) -> Any:
            self.count += 1
            return tables(*args)

        monkeypatch.setattr(store_partials, "_tables", counted)


def test_a_store_keeps_the_sums_of_its_latest_batches_only(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sums are kept for the few batches recorded last (memory): an older batch settles from its partials read
    back, as exactly."""
    read_back = _counting_reads(monkeypatch)
    batches = [f"b{i}" for i in range(store_partials._FOLDED_BATCHES + 1)]
    for batch in batches:
        store.apply(
            [manifest(batch, work_items=2, rows=2)], [result(f"{batch}-w1", partial(net=10**20), batch_id=batch)]
        )
    for batch in (batches[-1], batches[0]):
        store.apply([], [result(f"{batch}-w2", partial(net=7), batch_id=batch)])
        assert list(reports.aggregates(store, batch)["net"]) == [10**20 + 7]
        assert read_back.count == (batch == batches[0])


def test_sums_an_arrow_decimal_would_overflow_stay_exact(store: Store) -> None:
    huge = 9 * 10**37  # with 10 more rows, rows x largest passes 10^38: summed wider, still exact
    items = [result("w0", partial(net=huge, tax=0))] + [result(f"w{i}", partial(net=1, tax=0)) for i in range(1, 11)]
    store.apply([manifest(work_items=11, rows=11)], items)

    row = reports.aggregates(store, "b1").iloc[0]
    assert (row["net"], row["total"], row["transactions"]) == (huge + 10, huge + 10, 11)


BEYOND_THE_STORED_TYPE = [
    [partial(net=9 * 10**37, tax=0), partial(net=9 * 10**37, tax=0)],  # passes NUMERIC(38, 0)
    [partial(transactions=2**62), partial(transactions=2**62)],  # passes a 64-bit count
]


@pytest.mark.parametrize("rows", BEYOND_THE_STORED_TYPE)
@pytest.mark.parametrize("applies", [1, 2])
def test_a_batch_whose_sums_pass_the_stored_type_is_refused_and_counts_nothing(
    store: Store, rows: list[dict[str, Any]], applies: int
) -> None:
    items = [result("w1", rows[0], transactions=1), result("w2", rows[1], transactions=1)]
    store.apply([manifest(work_items=2, rows=2)], items[: 2 - applies + 1])
    if applies == 2:
        store.apply([], items[1:])

    status = store.batch("b1")
    assert status is not None and (status.state, status.completed_items, status.transactions_recorded) == (
        "refused",
        2,
        0,
    )
    assert (status.refused_reason or "").startswith("A batch's sums pass what the store's columns hold")
    assert reports.aggregates(store, "b1").empty
    with store.engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(partials)) == 0


def test_a_null_sum_records_nothing(store: Store) -> None:
    store.apply([manifest(work_items=2, rows=2)], [])
    with pytest.raises(ValueError, match="null net"):
        store.apply([], [result("w1", partial() | {"net": None})])  # found as it comes, not when the batch settles

    status = store.batch("b1")
    assert status is not None and (status.completed_items, status.transactions_recorded) == (0, 0)
    assert reports.aggregates(store, "b1").empty


def test_refusal_after_results_forgets_the_batch(store: Store) -> None:
    store.apply([manifest("other", work_items=1, rows=1)], [result("o1", batch_id="other")])
    rejected = [{"row": 3, "reason": "invalid_quantity", "raw": "{}"}]
    repeats = [held_row(4, repeat_of=3)]
    store.apply(
        [], [result("w1", partial(net=10**20), rejects=rejected, held=repeats), result("w2", partial("acct-2"))]
    )
    store.apply([], [], [PoisonNotice("b1", "w4", "checksum_mismatch")])
    assert not reports.rejects(store, "b1").empty

    outcome = store.apply(
        [manifest(work_items=0, rows=0, refused="file is not UTF-8 past row 2000")],
        [result("w3"), result("w1")],  # after the refusal in the same call: recorded, not counted
    )

    assert (outcome.new_items, outcome.duplicate_items, outcome.completed_batches) == (1, 1, [])
    status = store.batch("b1")
    assert status is not None
    assert (status.state, status.refused_reason, status.transactions_recorded, status.completed_items) == (
        "refused",
        "file is not UTF-8 past row 2000",
        0,
        3,
    )
    assert reports.aggregates(store, "b1").empty and reports.invoices(store, "b1").empty
    assert reports.rejects(store, "b1").empty and (status.accepted, status.rejected) == (0, 0)
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(held)).scalar() == 0

    late = store.apply([], [result("w5", partial(net=7)), result("w4"), result("w2"), result("w5")])
    assert (late.new_items, late.duplicate_items) == (2, 2)  # new, recovered from poison; duplicates
    again = store.apply([manifest(work_items=5, rows=5)], [result("w5")])  # a later manifest changes nothing
    assert (again.new_items, again.duplicate_items) == (0, 1)
    status = store.batch("b1")
    assert status is not None
    assert (status.state, status.transactions_recorded, status.completed_items, status.poisoned_items) == (
        "refused",
        0,
        5,
        0,
    )
    assert reports.aggregates(store, "b1").empty and reports.invoices(store, "b1").empty
    assert list(reports.aggregates(store, "other")["total"]) == [120]  # another batch keeps its counts


def test_phase_timestamps_round_trip(store: Store) -> None:
    plus_two = timezone(timedelta(hours=2))
    phases = {
        "uploaded_at": datetime(2026, 3, 2, 10, 0, 0, 123456, tzinfo=plus_two),
        "first_item_sent_at": datetime(2026, 3, 2, 8, 0, 1, tzinfo=UTC),
        "last_item_sent_at": datetime(2026, 3, 2, 8, 0, 4, 500000, tzinfo=UTC),
        "debatched_at": datetime(2026, 3, 2, 10, 0, 5, tzinfo=plus_two),
    }
    store.apply([manifest("b1", **phases), manifest("b2", uploaded_at=phases["uploaded_at"])], [])

    status = store.batch("b1")
    assert status is not None
    for name, value in phases.items():
        stored = getattr(status, name)
        assert stored == value and stored.utcoffset() == timedelta(0)
        assert status.to_json_dict()[name] == value.astimezone(UTC).isoformat()
    other = store.batch("b2")
    assert other is not None and other.uploaded_at == phases["uploaded_at"]
    assert (other.first_item_sent_at, other.last_item_sent_at, other.debatched_at) == (None, None, None)
    assert other.to_json_dict()["debatched_at"] is None


@contextmanager
def older_schema(store: Store, revision: str) -> Iterator[sa.Connection]:
    """A transaction on ``store``'s database with its schema migrated up to ``revision`` only."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
        yield conn


def test_migration_0004_adds_empty_phases_to_existing_batches(sql_url: str) -> None:
    with Store(sql_url, migrate=False) as store:
        with older_schema(store, "0003") as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO batches (batch_id, source, state, rows, accepted, rejected, completed_items, "
                    "poisoned_items, transactions_recorded, updated_at) "
                    "VALUES ('old', 'a.csv', 'processing', 0, 0, 0, 0, 0, 0, CURRENT_TIMESTAMP)"
                )
            )
        store.migrate()
        status = store.batch("old")
    assert status is not None and (status.uploaded_at, status.debatched_at) == (None, None)


def test_two_stores_adding_to_one_batch_in_turn_stay_exact(sql_url: str) -> None:
    rng = random.Random(3)
    items = [random_result(rng, f"b1-w{i}", "b1") for i in range(30)]
    items += [random_result(rng, f"b2-w{i}", "b2") for i in range(10)]
    rng.shuffle(items)
    manifests = [manifest(b, work_items=n, rows=1) for b, n in (("b1", 30), ("b2", 10))]
    with Store(sql_url) as first, Store(sql_url) as second:
        for turn, start in enumerate(range(0, len(items), 3)):
            (first, second)[turn % 2].apply(
                manifests, items[start : start + 3] + items[: start // 6]
            )  # with duplicates
        assert stored_text(first) == canonical(reference(items))
        status = second.batch("b1")
    assert status is not None
    assert status.transactions_recorded == sum(r.transactions for r in items if r.batch_id == "b1")


def test_a_batch_one_store_recorded_counts_nothing_once_another_refused_it(sql_url: str) -> None:
    with Store(sql_url) as first, Store(sql_url) as second:
        first.apply([], [result("w1", partial(net=10**20)), result("w2", partial("acct-2"))])
        first.apply([], [result("o1", batch_id="o")])
        second.apply([manifest(work_items=4, rows=4, refused="file is not UTF-8 past row 2000")], [])
        first.apply([], [result("w3", partial(net=7)), result("o2", partial(net=5), batch_id="o")])
        second.apply(
            [manifest("o", work_items=3, rows=3)],
            [result("w4", partial(net=9)), result("o3", partial(net=1), batch_id="o")],
        )

        assert reports.aggregates(first, "b1").empty and reports.aggregates(second, "b1").empty
        status = first.batch("b1")
        assert status is not None and (status.state, status.transactions_recorded) == ("refused", 0)
        assert list(reports.aggregates(second, "o")["net"]) == [106]  # another batch keeps its counts


def test_a_failed_apply_leaves_nothing_behind(store: Store) -> None:
    """After an apply that failed (the database refusing the batch's update after its partials were written: a
    real trigger), the next applies record what is stored, the failed one's work item included when it comes again."""
    huge = 9 * 10**37
    store.apply([manifest(work_items=3, rows=3)], [result("w1", partial(net=huge, tax=0))])
    with _refusing_updates(store, completed_items=2), pytest.raises(sa.exc.DBAPIError, match="injected failure"):
        store.apply([], [result("w3", partial(net=5, tax=0))])

    store.apply([], [result("w4", partial(net=1, tax=0))])
    store.apply([], [result("w3", partial(net=5, tax=0))])

    status = store.batch("b1")
    assert status is not None and (status.state, status.completed_items, status.transactions_recorded) == (
        "complete",
        3,
        3,
    )
    row = reports.aggregates(store, "b1").iloc[0]
    assert (row["net"], row["total"], row["transactions"]) == (huge + 6, huge + 6, 3)


class _refusing_updates:
    """A trigger that makes the database refuse to update a batch row reaching ``completed_items``."""

    def __init__(self, store: Store, *, completed_items: int) -> None:
        self.store = store
        self.completed_items = completed_items

    def __enter__(self) -> None:
        with self.store.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(
                    "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql "
                    "AS $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$"
                )
                conn.exec_driver_sql(
                    "CREATE TRIGGER refuse BEFORE UPDATE ON batches FOR EACH ROW "
                    f"WHEN (NEW.completed_items = {self.completed_items}) EXECUTE FUNCTION refuse()"
                )
            else:
                conn.exec_driver_sql(
                    f"CREATE TRIGGER refuse BEFORE UPDATE ON batches WHEN NEW.completed_items = {self.completed_items} "
                    "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
                )

    def __exit__(self, *_: object) -> None:
        with self.store.engine.begin() as conn:
            postgres = conn.dialect.name == "postgresql"
            conn.exec_driver_sql("DROP TRIGGER refuse" + (" ON batches" if postgres else ""))
            if postgres:
                conn.exec_driver_sql("DROP FUNCTION refuse()")


def test_migration_0013_keeps_the_aggregates_of_a_running_batch_as_its_partials(sql_url: str) -> None:
    now = datetime.now(UTC)
    with Store(sql_url, migrate=False) as store:
        with older_schema(store, "0012") as conn:
            counts = dict(rows=2, accepted=2, rejected=0, work_items=2, completed_items=1, transactions_recorded=1)
            conn.execute(
                sa.insert(batches).values(
                    batch_id="b1",
                    source="a.csv",
                    state="processing",
                    poisoned_items=0,
                    requests=0,
                    updated_at=now,
                    **counts,
                )
            )
            conn.execute(
                sa.insert(work_items).values(work_item_id="w1", batch_id="b1", transactions=1, recorded_at=now)
            )
            key = dict(batch_id="b1", account_id="acct-1", product="CPU", billing_day=date(2026, 3, 2), currency="USD")
            sums = dict(transactions=1, quantity=Decimal("1.5"), net=10**30, tax=20, total=10**30 + 20)
            at_0012 = sa.table("aggregates", *(sa.column(name, aggregates.c[name].type) for name in {**key, **sums}))
            conn.execute(sa.insert(at_0012).values(**key, **sums))
        store.migrate()
        assert store.batch("b1") is not None

        store.apply([], [result("w2", partial(net=1, tax=2))])

        status = store.batch("b1")
        row = reports.aggregates(store, "b1").iloc[0]
    assert status is not None and (status.state, status.transactions_recorded) == ("complete", 2)
    sums = (row["transactions"], row["quantity"], row["net"], row["tax"], row["total"])
    assert sums == (2, "3", 10**30 + 1, 22, 10**30 + 23)


def test_store_apply_benchmark_runs_at_a_small_size(tmp_path: Path) -> None:
    """``benchmarks.store_apply`` end to end on a generated 20,000-row file (the 1,000,000-row figures are
    measured by hand): it cuts, rates and applies the batch to completion, in two group sizes."""
    source = tmp_path / "batch.csv"
    generate(20_000, source, seed=3)
    options = ["--groups", "1,4", "--repeat", "1", "--work-item-size", "1000"]
    measured = run_benchmark("store_apply", str(source), *options, output=tmp_path / "apply.json")
    assert 19_000 < measured["transactions"] <= 20_000 and measured["partials"] > 0
    assert set(measured["groups"]) == {"1", "4"} and all(g["cpu_seconds"] > 0 for g in measured["groups"].values())


def test_a_batch_waiting_for_its_last_work_item_has_its_sums_summed_so_its_settle_sums_only_that_one(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partials kept as they came are summed once a batch waits for one work item at most: the transaction that
    settles it sums the last item's partials alone (and adds them to the sums), exactly."""
    summed: list[int] = []
    summing = store_partials._summed

    def counted(table: pa.Table) -> Any:
        summed.append(table.num_rows)
        return summing(table)

    monkeypatch.setattr(store_partials, "_summed", counted)
    rows = [[partial(f"acct-{i}", net=10**30 + i) for i in range(n)] for n in (5, 4, 3)]
    items = [result(f"b1-w{i}", *item) for i, item in enumerate(rows)]
    store.apply([manifest("b1", work_items=3, rows=12)], items[:1])
    assert summed == []  # kept as they came
    store.apply([], items[1:2])
    assert summed == [9]  # one item left: the first two summed
    store.apply([], items[2:])
    assert summed == [9, 3]
    want = reference(items)
    assert stored_text(store) == canonical(want)


def test_partials_that_came_in_a_results_message_are_kept_as_they_came_and_read_back_exactly(migrated_url: str) -> None:
    """The store keeps each work item's partials as the stream its results message carried them in, and a batch whose
    partials are read back from those streams (a store opened anew for each apply) settles exactly."""
    rng = random.Random(7)
    items = [random_result(rng, f"b1-w{i}", "b1") for i in range(6)]
    read = parse_results(results_envelope(items))
    with Store(migrated_url, migrate=False) as first:
        first.apply([manifest("b1", work_items=6, rows=sum(r.transactions for r in items))], read[:4])
        with first.engine.connect() as conn:
            kept = {
                item: bytes(data)
                for item, data in conn.execute(sa.select(partials.c.work_item_id, partials.c.aggregates))
            }
    assert kept == {r.work_item_id: r.encoded_partials for r in read[:4]}
    with Store(migrated_url, migrate=False) as anew:
        anew.apply([], read[4:])
        assert stored_text(anew) == canonical(reference(items))
