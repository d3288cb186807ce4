"""What the store keeps of dated reference data, on SQLite and PostgreSQL (``sql_url`` from conftest): aggregates
per day and price book, and per period, price book, tax region and tax rate; the rows of the price books batches
were rated with; and a store from before (migration 0014) upgraded in place."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
import sqlalchemy as sa

from billing import reports
from shared.rules.reference import load_price_book
from store import PriceRow, Store, price_rows_of
from store.schema import aggregates, batches, partials, period_aggregates, work_items
from support.records import manifest, partial, result
from support.revisions import at_revision

BOOK = load_price_book(
    b"product,currency,unit_price,offpeak_unit_price,minimum_charge,unit\n"
    b"cpu,USD,0.50,,,vCPU-hour\ngpu,EUR,2,1.25,0.5,\n"
)


def stored(store: Store, batch_id: str) -> list[tuple[object, ...]]:
    """A batch's aggregates: (account, product, day, price book, net)."""
    columns = [aggregates.c[name] for name in ("account_id", "product", "billing_day", "pricebook", "net")]
    with store.engine.connect() as conn:
        query = sa.select(*columns).where(aggregates.c.batch_id == batch_id).order_by(*columns[:4])
        return [(*row[:2], row[2].isoformat(), row[3], int(row[4])) for row in conn.execute(query)]


def per_period(store: Store, batch_id: str) -> list[tuple[object, ...]]:
    """A batch's aggregates per period: (account, product, period, price book, region, rate, net, tax)."""
    names = ("account_id", "product", "period", "pricebook", "region", "tax_rate", "net", "tax")
    columns = [period_aggregates.c[name] for name in names]
    with store.engine.connect() as conn:
        query = sa.select(*columns).where(period_aggregates.c.batch_id == batch_id).order_by(*columns[:6])
        return [(*row[:6], int(row[6]), int(row[7])) for row in conn.execute(query)]


def test_aggregates_are_kept_per_day_and_per_period_region_and_rate(store: Store) -> None:
    rows = [
        partial("acct-1", region="*", pricebook="pb-march", tax_rate="0.2", net=100, tax=20),
        partial("acct-1", region="DE", pricebook="pb-march", tax_rate="0.19", net=200, tax=38),
        partial("acct-1", day="2026-03-03", region="DE", pricebook="pb-march", tax_rate="0.19", net=5, tax=1),
        partial("acct-1", day="2026-04-01", region="*", pricebook="pb-april", tax_rate="0.21", net=300, tax=63),
    ]
    store.apply([manifest("b1", work_items=2)], [result("w1", *rows[:3]), result("w2", rows[0], rows[3])])
    assert stored(store, "b1") == [
        ("acct-1", "CPU", "2026-03-02", "pb-march", 400),
        ("acct-1", "CPU", "2026-03-03", "pb-march", 5),
        ("acct-1", "CPU", "2026-04-01", "pb-april", 300),
    ]
    assert per_period(store, "b1") == [
        ("acct-1", "CPU", "2026-03", "pb-march", "*", "0.2", 200, 40),
        ("acct-1", "CPU", "2026-03", "pb-march", "DE", "0.19", 205, 39),
        ("acct-1", "CPU", "2026-04", "pb-april", "*", "0.21", 300, 63),
    ]
    report = reports.aggregates(store, "b1")  # the reports still sum per account, product and day
    assert sorted(zip(report["billing_day"], report["net"], strict=True)) == [
        ("2026-03-02", 400),
        ("2026-03-03", 5),
        ("2026-04-01", 300),
    ]


def test_price_book_rows_are_recorded_once_a_book(store: Store) -> None:
    store.record_price_books(price_rows_of(BOOK))
    store.record_price_books(price_rows_of(BOOK))  # again: nothing changes
    found = store.price_book_rows([BOOK.content_hash, "unknown"])
    assert found == {
        (BOOK.content_hash, "cpu"): PriceRow(BOOK.content_hash, "cpu", "USD", "vCPU-hour", "0.50", "0.50", None),
        (BOOK.content_hash, "gpu"): PriceRow(BOOK.content_hash, "gpu", "EUR", "unit", "2", "1.25", "0.5"),
    }


#: The partial aggregates' columns before 0014.
_OLD_PARTIALS = pa.schema(
    [
        ("account_id", pa.string()),
        ("product", pa.string()),
        ("billing_day", pa.string()),
        ("currency", pa.string()),
        ("transactions", pa.int64()),
        ("quantity", pa.decimal128(38, 6)),
        ("net", pa.decimal128(38, 0)),
        ("tax", pa.decimal128(38, 0)),
        ("total", pa.decimal128(38, 0)),
    ]
)


def _old_partials() -> bytes:
    table = pa.Table.from_pylist(
        [
            {
                "account_id": "acct-1",
                "product": "CPU",
                "billing_day": "2026-03-02",
                "currency": "USD",
                "transactions": 1,
                "quantity": Decimal("1.5"),
                "net": Decimal(10**30),
                "tax": Decimal(20),
                "total": Decimal(10**30 + 20),
            }
        ],
        schema=_OLD_PARTIALS,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, _OLD_PARTIALS) as stream:
        stream.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def test_migration_0014_keeps_old_aggregates_and_partials_under_their_batch_s_price_book(sql_url: str) -> None:
    at_revision(sql_url, "0013")
    now = datetime.now(UTC)
    engine = sa.create_engine(sql_url)
    common = dict(source="a.csv", poisoned_items=0, requests=0, updated_at=now, rows=2, accepted=2, rejected=0)
    with engine.begin() as conn:
        for batch_id, state, book in (("done", "complete", "pb-done"), ("running", "processing", "pb-running")):
            done = 2 if state == "complete" else 1
            conn.execute(
                sa.insert(batches).values(
                    batch_id=batch_id,
                    state=state,
                    work_items=2,
                    completed_items=done,
                    transactions_recorded=done,
                    pricebook_hash=book,
                    taxes_hash="tx",
                    **common,
                )
            )
        conn.execute(
            sa.insert(work_items).values(work_item_id="w1", batch_id="running", transactions=1, recorded_at=now)
        )
        conn.execute(
            sa.text(
                "INSERT INTO aggregates (batch_id, account_id, product, billing_day, currency, transactions, quantity, "
                "net, tax, total) VALUES ('done', 'acct-1', 'CPU', :day, 'USD', 2, 3, :net, 40, 240)"
            ),
            [  # SQLite keeps dates as ISO text (its default date adapter is deprecated)
                {"day": day.isoformat() if conn.dialect.name == "sqlite" else day, "net": net}
                for day, net in ((date(2026, 3, 2), "200"), (date(2026, 3, 31), str(10**37)), (date(2026, 4, 1), "7"))
            ],
        )
        conn.execute(
            sa.text("INSERT INTO partials (work_item_id, batch_id, aggregates) VALUES ('w1', 'running', :data)"),
            {"data": _old_partials()},
        )
    engine.dispose()

    with Store(sql_url) as store:  # upgrades in place
        assert stored(store, "done") == [
            ("acct-1", "CPU", "2026-03-02", "pb-done", 200),
            ("acct-1", "CPU", "2026-03-31", "pb-done", 10**37),
            ("acct-1", "CPU", "2026-04-01", "pb-done", 7),
        ]
        assert per_period(store, "done") == [
            ("acct-1", "CPU", "2026-03", "pb-done", "", "", 10**37 + 200, 80),
            ("acct-1", "CPU", "2026-04", "pb-done", "", "", 7, 40),
        ]
        with store.engine.connect() as conn:
            assert conn.scalar(sa.select(sa.func.count()).select_from(partials)) == 1
        store.apply([], [result("w2", partial(net=1, tax=2, pricebook="pb-running"), batch_id="running")])
        status = store.batch("running")
        assert status is not None and (status.state, status.transactions_recorded) == ("complete", 2)
        assert stored(store, "running") == [("acct-1", "CPU", "2026-03-02", "pb-running", 10**30 + 1)]
        assert per_period(store, "running") == [
            ("acct-1", "CPU", "2026-03", "pb-running", "", "", 10**30, 20),
            ("acct-1", "CPU", "2026-03", "pb-running", "*", "0.2", 1, 2),
        ]
        assert store.price_book_rows(["pb-done"]) == {}
