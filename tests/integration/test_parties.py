"""Part 3 in the store, on SQLite and PostgreSQL: the seller and the customers (versioned, all or nothing), what
a document keeps of them, notes by sign that cite what they correct, no zero documents, closes refused before a
period ends, without a seller or (asked) without customer records, and a ledger with documents upgraded in place."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from store import SCHEMA_REVISION, Customer, LedgerError, Seller, Store
from support.ledger import SELLER, with_seller
from support.records import complete, partial
from support.revisions import at_revision

NOW = datetime(2026, 5, 10, 9, 0, tzinfo=UTC)
ALICE = Customer("acct-1", "Alice Ltd", "1 High Street, London", "gb", tax_id="GB123456789", email="ap@alice.example")


def test_the_seller_is_versioned_and_the_newest_is_in_force(store: Store) -> None:
    assert store.seller() is None
    first = store.set_seller(SELLER, now=NOW)
    second = store.set_seller(Seller("Example Billing GmbH", "Neue Strasse 2, Berlin", "de", "DE123456789", 14, "R-"))
    assert (first.version, second.version) == (1, 2)
    found = store.seller()
    assert found is not None and found == second and (found.country, found.prefix, found.version) == ("DE", "R-", 2)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"country": "XX"}, "ISO 3166-1"),
        ({"country": "DEU"}, "ISO 3166-1"),
        ({"name": "  "}, "name is missing"),
        ({"payment_terms_days": -1}, "payment terms"),
        ({"prefix": "IN V"}, "prefix"),
    ],
)
def test_a_bad_seller_is_refused_in_one_line(changes: dict[str, object], words: str) -> None:
    values: dict[str, Any] = {"name": "S", "address": "A", "country": "DE", "tax_id": "T"} | changes
    with pytest.raises(LedgerError, match=words) as refused:
        Seller(**values)
    assert "\n" not in str(refused.value)


def test_customers_upsert_by_account_and_keep_their_earlier_versions(store: Store) -> None:
    bob = Customer("acct-2", "Bob GmbH", "Weg 3, Bonn", "DE")
    first, again = store.import_customers([ALICE, bob], now=NOW), store.import_customers([ALICE, bob])
    assert [(i.added, i.changed, i.unchanged) for i in (first, again)] == [(2, 0, 0), (0, 0, 2)], "again: unchanged"
    moved = Customer("acct-2", "Bob GmbH", "Allee 9, Köln", "DE")
    later = store.import_customers([moved, Customer("acct-3", "Carol", "Rue 1, Paris", "FR")])
    assert (later.added, later.changed, later.unchanged) == (1, 1, 0)
    assert [(c.account_id, c.version, c.country) for c in store.customers()] == [
        ("acct-1", 1, "GB"),
        ("acct-2", 2, "DE"),
        ("acct-3", 1, "FR"),
    ]
    assert store.customer("acct-2") == moved and store.customer("nobody") is None
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM customers WHERE account_id = 'acct-2'")).scalar() == 2
    with pytest.raises(LedgerError, match="twice"):
        store.import_customers([ALICE, ALICE])


def test_a_close_snapshots_the_parties_and_dates_its_documents(store: Store) -> None:
    store.set_seller(SELLER, now=NOW)
    store.import_customers([ALICE])
    complete(store, "b1", partial("acct-1", net=100, tax=20), partial("acct-2", net=5, tax=1))
    first, second = store.close_period("2026-03", now=NOW)
    shown = first.to_json_dict()
    assert (shown["display_number"], shown["due_date"], shown["service_period"]) == (
        "INV-000001",
        "2026-06-09",
        {"from": "2026-03-01", "to": "2026-03-31"},
    )
    assert shown["seller"] == {"name": SELLER.name, "address": SELLER.address, "country": "DE", "tax_id": "DE123456789"}
    assert shown["customer"] == {
        "account_id": "acct-1",
        "name": "Alice Ltd",
        "address": "1 High Street, London",
        "country": "GB",
        "tax_id": "GB123456789",
    }
    assert second.customer is None, "no record: the buyer is the account id"
    store.set_seller(Seller("Renamed AG", "Elsewhere 1", "AT", "ATU1", payment_terms_days=7, prefix="R-"))
    store.import_customers([Customer("acct-1", "Alice Renamed", "Elsewhere", "GB")])
    complete(store, "b2", partial("acct-1", net=-30, tax=-6))
    (note,) = store.close_period("2026-03", now=NOW)
    assert (note.kind, note.display_number, note.corrects, str(note.due_date)) == (
        "credit_note",
        "R-000003",
        (1,),
        "2026-05-17",
    )
    assert note.customer is not None and note.customer["name"] == "Alice Renamed"
    assert [d.to_json_dict() | {"corrected_by": []} for d in store.documents()][:2] == [
        d.to_json_dict() for d in (first, second)
    ], "snapshots never change"
    invoice = store.document(1)
    assert invoice is not None and invoice.corrected_by == (3,)


def test_a_later_document_is_a_debit_note_when_its_total_is_not_negative(store: Store) -> None:
    with_seller(store)
    complete(store, "b1", partial("acct-1", net=10, tax=1))
    store.close_period("2026-03", now=NOW)
    complete(store, "b2", partial("acct-1", net=4, tax=0))
    complete(store, "b3", partial("acct-1", net=-1, tax=-1))
    (note,) = store.close_period("2026-03", now=NOW)
    assert (note.kind, note.total, note.corrects) == ("debit_note", 2, (1,))


def test_a_pair_whose_change_is_money_free_gets_no_document_and_stays_settled(store: Store) -> None:
    with_seller(store)
    complete(store, "b1", partial("acct-0", net=0, tax=0), partial("acct-1", net=10, tax=1))
    complete(store, "b2", partial("acct-1", product="GPU", net=0, tax=0))
    assert [(d.account_id, d.kind) for d in store.pending("2026-03")] == [("acct-1", "invoice")]
    (invoice,) = store.close_period("2026-03", now=NOW)
    assert (invoice.number, invoice.account_id) == (1, "acct-1"), "acct-0's zero invoice took no number"
    assert [line.product for line in invoice.lines] == ["CPU", "GPU"], "a money-free line of a billed pair stays"
    assert store.close_period("2026-03", now=NOW) == [] and store.pending("2026-03") == []
    store.void("b1")
    (note,) = store.close_period("2026-03", now=NOW)
    assert (note.account_id, note.kind, note.corrects) == ("acct-1", "credit_note", (1,)), "acct-0 settled again"
    assert store.close_period("2026-03", now=NOW) == []
    assert all(any(line.sums.net or line.sums.tax for line in d.lines) for d in store.documents())


@pytest.mark.parametrize(
    ("period", "now"),
    [
        ("2026-05", NOW),
        ("2026-04", datetime(2026, 4, 30, 23, 59, 59, tzinfo=UTC)),
        ("2026-07", NOW),
    ],
)
def test_a_period_not_ended_is_refused_and_nothing_changes(store: Store, period: str, now: datetime) -> None:
    with_seller(store)
    complete(store, "b1", partial("acct-1", day=f"{period}-02"))
    with pytest.raises(LedgerError, match=r"not ended|future") as refused:
        store.close_period(period, now=now)
    assert "\n" not in str(refused.value)
    assert store.documents() == [] and not store.periods(period)[0].closed
    assert len(store.close_period(period, now=datetime(2026, 8, 1, tzinfo=UTC))) == 1, "once ended: closed"


def test_a_close_without_a_seller_is_refused_and_says_how_to_register_one(store: Store) -> None:
    complete(store, "b1", partial("acct-1"))
    with pytest.raises(LedgerError, match="billing seller set"):
        store.close_period("2026-03", now=NOW)
    assert store.documents() == [] and not store.periods("2026-03")[0].closed


def test_require_customers_refuses_the_close_naming_the_accounts_without_a_record(store: Store) -> None:
    with_seller(store)
    store.import_customers([ALICE])
    complete(store, "b1", *(partial(f"acct-{i}") for i in range(1, 9)))
    with pytest.raises(LedgerError, match=r"7 account\(s\) .*\(acct-2, acct-3, acct-4, acct-5, acct-6, …\)"):
        store.close_period("2026-03", now=NOW, require_customers=True)
    assert store.documents() == [] and not store.periods("2026-03")[0].closed
    store.import_customers([Customer(f"acct-{i}", f"C{i}", "Somewhere 1", "FR") for i in range(2, 9)])
    assert len(store.close_period("2026-03", now=NOW, require_customers=True)) == 8


def test_a_ledger_with_documents_upgrades_in_place_keeping_its_numbers(sql_url: str) -> None:
    at_revision(sql_url, "0013")
    engine = sa.create_engine(sql_url)
    stored = sa.Table("documents", sa.MetaData(), autoload_with=engine)
    counters = sa.Table("counters", sa.MetaData(), autoload_with=engine)
    issued = NOW.replace(tzinfo=None) if engine.dialect.name == "sqlite" else NOW
    head = dict(period="2026-03", currency="USD", issued_at=issued, pricebooks="pb", tax_tables="tx")
    old = [  # number, kind, account, total
        (1, "invoice", "acct-1", 110),
        (2, "invoice", "acct-2", 50),
        (3, "adjustment", "acct-1", -20),
        (4, "adjustment", "acct-1", 0),
        (5, "adjustment", "acct-2", 7),
    ]
    with engine.begin() as conn:
        for number, kind, account, total in old:
            money: dict[str, object] = {"net": total, "tax": 0, "total": total}
            if engine.dialect.name == "sqlite":
                money = {k: str(v) for k, v in money.items()}
            conn.execute(sa.insert(stored).values(number=number, kind=kind, account_id=account, **head, **money))
        conn.execute(sa.insert(counters).values(name="document_number", value=len(old)))
    engine.dispose()

    with Store(sql_url) as store:  # upgrades in place
        assert store.revision() == SCHEMA_REVISION
        found = store.documents()
        assert [(d.number, d.kind, d.display_number, d.corrects, d.corrected_by) for d in found] == [
            (1, "invoice", "INV-000001", (), (3, 4)),
            (2, "invoice", "INV-000002", (), (5,)),
            (3, "credit_note", "INV-000003", (1,), (4,)),
            (4, "debit_note", "INV-000004", (1, 3), ()),
            (5, "debit_note", "INV-000005", (2,), ()),
        ]
        assert all(d.seller is None and d.customer is None and d.due_date is None for d in found)
        assert found[0].to_json_dict()["service_period"] == {"from": "2026-03-01", "to": "2026-03-31"}
        assert store.documents(kind="adjustment") == []
        with_seller(store)
        complete(store, "late", partial("acct-2", net=1, tax=0))
        (note,) = store.close_period("2026-03", now=NOW)
        assert (note.number, note.kind, note.corrects) == (6, "debit_note", (2, 5)), "numbering goes on"
