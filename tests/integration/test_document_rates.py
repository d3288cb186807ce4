"""A document's lines per product and price book, with the price book's unit prices, and its tax per rate, in the
store, on SQLite and PostgreSQL; and a ledger with documents from before (revision 0015) upgraded in place."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from store import SCHEMA_REVISION, PriceRow, Store, Tax
from support.ledger import with_seller
from support.records import complete, partial
from support.revisions import at_revision

NOW = datetime(2026, 5, 10, 9, 0, tzinfo=UTC)
OLD = PriceRow("pb-old", "CPU", "USD", "hour", "0.05", "0.04", None)
NEW = PriceRow("pb-new", "CPU", "USD", "hour", "0.06", "0.06", "1")


def _lines(doc: dict[str, Any]) -> list[tuple[object, ...]]:
    keys = ("product", "pricebook", "unit", "unit_price", "offpeak_unit_price", "transactions", "net", "tax", "batches")
    return [tuple(line[k] for k in keys) for line in doc["lines"]]


def _taxes(doc: dict[str, Any]) -> list[tuple[object, ...]]:
    return [(t["rate"], t["regions"], t["net"], t["tax"]) for t in doc["taxes"]]


def test_a_document_has_a_line_per_product_and_price_book_and_its_tax_per_rate(store: Store) -> None:
    with_seller(store).record_price_books([OLD, NEW])
    complete(
        store,
        "b1",
        partial(product="CPU", pricebook="pb-old", region="DE", tax_rate="0.19", net=100, tax=19),
        partial(product="CPU", pricebook="pb-new", region="DE", tax_rate="0.19", net=50, tax=10, day="2026-03-20"),
        partial(product="CPU", pricebook="pb-new", region="FR", tax_rate="0.2", net=30, tax=6, day="2026-03-20"),
        partial(product="GPU", pricebook="pb-new", region="*", tax_rate="0", net=7, tax=0),  # a product not in it
        partial(product="CPU", pricebook="pb-new", region="AT", tax_rate="0.2", net=3, tax=1, day="2026-03-21"),
    )
    (pending,) = store.pending("2026-03")
    (invoice,) = store.close_period("2026-03", now=NOW)
    issued = invoice.to_json_dict()
    assert pending.to_json_dict()["lines"] == issued["lines"] and pending.to_json_dict()["taxes"] == issued["taxes"]
    assert _lines(issued) == [
        ("CPU", "pb-new", "hour", "0.06", "0.06", 3, 83, 17, ["b1"]),
        ("CPU", "pb-old", "hour", "0.05", "0.04", 1, 100, 19, ["b1"]),
        ("GPU", "pb-new", None, None, None, 1, 7, 0, ["b1"]),
    ]
    assert _taxes(issued) == [("0", ["*"], 7, 0), ("0.19", ["DE"], 150, 29), ("0.2", ["AT", "FR"], 33, 7)]
    assert (sum(t.net for t in invoice.taxes), sum(t.tax for t in invoice.taxes)) == (invoice.net, invoice.tax)
    assert issued["pricebooks"] == ["pb-new", "pb-old"]
    shown = store.document(invoice.number)
    assert shown is not None and shown.to_json_dict() == issued

    complete(store, "b2", partial(product="CPU", pricebook="pb-old", region="DE", tax_rate="0.19", net=4, tax=1))
    store.void("b1")
    (note,) = store.close_period("2026-03", now=NOW)
    assert (note.kind, note.net, note.tax) == ("credit_note", -186, -35)
    assert _lines(note.to_json_dict()) == [
        ("CPU", "pb-new", "hour", "0.06", "0.06", -3, -83, -17, ["b1"]),
        ("CPU", "pb-old", "hour", "0.05", "0.04", 0, -96, -18, ["b1", "b2"]),
        ("GPU", "pb-new", None, None, None, -1, -7, 0, ["b1"]),
    ]
    assert note.taxes == (Tax("0", ("*",), -7, 0), Tax("0.19", ("DE",), -146, -28), Tax("0.2", ("AT", "FR"), -33, -7))
    assert store.close_period("2026-03", now=NOW) == [], "what is documented meets what is billed, key by key"


def _money(engine: sa.Engine, **values: object) -> dict[str, object]:
    """Values as the store keeps them: money and quantities as decimal text on SQLite."""
    if engine.dialect.name != "sqlite":
        return values
    return {k: format(v, "f") if isinstance(v, Decimal) else v for k, v in values.items()}


def test_a_ledger_with_documents_from_before_upgrades_and_what_it_documented_still_counts(sql_url: str) -> None:
    at_revision(sql_url, "0015")
    engine = sa.create_engine(sql_url)
    tables = {name: sa.Table(name, sa.MetaData(), autoload_with=engine) for name in _OLD_ROWS}
    at = NOW.replace(tzinfo=None) if engine.dialect.name == "sqlite" else NOW
    with engine.begin() as conn:
        for name, rows in _OLD_ROWS.items():
            for row in rows:
                values = {k: at if v is _AT else v for k, v in row.items()}
                conn.execute(sa.insert(tables[name]).values(**_money(engine, **values)))
        conn.execute(sa.text("UPDATE counters SET value = 1 WHERE name = 'batch_seq'"))
    engine.dispose()

    with Store(sql_url) as store:  # upgrades in place
        assert store.revision() == SCHEMA_REVISION
        store.record_price_books([PriceRow("pb", "CPU", "USD", "hour", "0.05", "0.04", None)])
        (old,) = store.documents()
        assert _lines(old.to_json_dict()) == [("CPU", "pb", "hour", "0.05", "0.04", 1, 100, 20, ["old"])]
        assert old.taxes == (Tax(None, (), 100, 20),), "rates from before: one entry, rate not recorded"
        assert store.pending("2026-03") == [], "documented and settled before: still so"
        with_seller(store)
        complete(store, "new", partial("acct-1", region="DE", tax_rate="0.19", net=10, tax=2))
        (note,) = store.close_period("2026-03", now=NOW)
        assert (note.number, note.kind, note.corrects) == (2, "debit_note", (1,))
        assert _lines(note.to_json_dict()) == [("CPU", "pb", "hour", "0.05", "0.04", 1, 10, 2, ["new"])]
        assert note.taxes == (Tax("0.19", ("DE",), 10, 2),)


_AT = object()
_BATCH = {"source": "f.csv", "state": "complete", "rows": 2, "accepted": 2, "rejected": 0, "work_items": 1}
_MEASURES = {"transactions": 1, "quantity": Decimal("1.5"), "net": Decimal(100), "tax": Decimal(20)}
_DAY = {"account_id": "acct-1", "product": "CPU", "billing_day": datetime(2026, 3, 2).date(), "currency": "USD"}
_PERIOD = {
    "account_id": "acct-1",
    "product": "CPU",
    "period": "2026-03",
    "region": "",
    "tax_rate": "",
    "currency": "USD",
}
_ZERO = {"transactions": 1, "quantity": Decimal(0), "net": Decimal(0), "tax": Decimal(0), "total": Decimal(0)}
#: A ledger of revision 0015: a batch counted in an invoice, a money-free change of another account settled.
_OLD_ROWS: dict[str, list[dict[str, Any]]] = {
    "batches": [
        _BATCH
        | {"batch_id": "old", "completed_items": 1, "poisoned_items": 0, "transactions_recorded": 2, "seq": 1}
        | {"pricebook_hash": "pb", "taxes_hash": "tx", "accepted_at": _AT, "updated_at": _AT}
    ],
    "aggregates": [
        {"batch_id": "old", **_DAY, "pricebook": "pb", **_MEASURES, "total": Decimal(120)},
        {"batch_id": "old", **_DAY, "account_id": "acct-2", "pricebook": "pb"} | _ZERO,
    ],
    "period_aggregates": [
        {"batch_id": "old", **_PERIOD, "pricebook": "pb", **_MEASURES, "total": Decimal(120)},
        {"batch_id": "old", **_PERIOD, "account_id": "acct-2", "pricebook": "pb"} | _ZERO,
    ],
    "documents": [
        {"number": 1, "kind": "invoice", "period": "2026-03", "account_id": "acct-1", "currency": "USD"}
        | {"issued_at": _AT, "net": Decimal(100), "tax": Decimal(20), "total": Decimal(120)}
        | {"pricebooks": "pb", "tax_tables": "tx", "display_number": "INV-000001", "corrects": ""}
    ],
    "document_lines": [{"number": 1, "product": "CPU", **_MEASURES, "total": Decimal(120)}],
    "document_batches": [{"number": 1, "product": "CPU", "batch_id": "old", **_MEASURES, "total": Decimal(120)}],
    "settled_changes": [
        {"period": "2026-03", "account_id": "acct-2", "currency": "USD", "product": "CPU", "batch_id": "old"} | _ZERO
    ],
    "closed_periods": [{"period": "2026-03", "closed_at": _AT}],
    "counters": [{"name": "document_number", "value": 1}],
}
