"""Closing periods into documents, in the store, on SQLite and PostgreSQL: numbering, kinds, signed notes,
issued documents never changing, refusals, and closes at once serialised."""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from store import Document, Filters, LedgerError, Store
from support.ledger import with_seller
from support.records import complete, manifest, partial, result

NOW = datetime(2026, 5, 10, 9, 0, tzinfo=UTC)
BIG = 9 * 10**18  # three of these pass 2^63


def _lines(docs: list[Document]) -> dict[tuple[str, str, str], list[int]]:
    """(account, currency, product) -> the sums of the documents' lines (transactions, net, tax, total)."""
    found: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for doc in docs:
        for line in doc.lines:
            sums = found[doc.account_id, doc.currency, line.product]
            for i, value in enumerate((line.sums.transactions, line.sums.net, line.sums.tax, line.sums.total)):
                sums[i] += value
    return {key: sums for key, sums in found.items() if any(sums)}


def _as_issued(doc: Document) -> dict[str, object]:
    """What issuing fixed of a document: all but ``corrected_by`` (later notes add to it)."""
    return {k: v for k, v in doc.to_json_dict().items() if k != "corrected_by"}


def _fresh(store: Store, period: str) -> dict[tuple[str, str, str], list[int]]:
    """The period's counted rows summed per account, currency and product, computed afresh."""
    rows = store.totals(("account_id", "product"), Filters(period=period)).rows
    return {
        (r["account_id"], r["currency"], r["product"]): [r[m] for m in ("transactions", "net", "tax", "total")]
        for r in rows
    }


def test_a_first_close_issues_an_invoice_per_account_and_currency_in_code_point_order(store: Store) -> None:
    with_seller(store)
    complete(
        store,
        "b1",
        partial("acct-b", product="CPU", net=BIG, tax=1),
        partial("acct-b", product="CPU", net=BIG, tax=1, day="2026-03-31"),
        partial("acct-b", product="GPU", net=BIG, tax=1, quantity="0.000001"),
        partial("acct-B", currency="EUR", net=7, tax=1),
        partial("Zed", net=1, tax=0),
        partial("acct-a", net=5, tax=1, day="2026-04-01"),  # another period
    )
    issued = store.close_period("2026-03", now=NOW)
    assert [(d.number, d.kind, d.account_id, d.currency) for d in issued] == [
        (1, "invoice", "Zed", "USD"),
        (2, "invoice", "acct-B", "EUR"),
        (3, "invoice", "acct-b", "USD"),
    ]
    third = issued[2].to_json_dict()
    assert (third["net"], third["tax"], third["total"]) == (3 * BIG, 3, 3 * BIG + 3), "exact past 2^63"
    assert [
        (line["product"], line["transactions"], line["quantity"], line["net"], line["batches"])
        for line in third["lines"]
    ] == [
        ("CPU", 2, "3", 2 * BIG, ["b1"]),
        ("GPU", 1, "0.000001", BIG, ["b1"]),
    ]
    assert third["period"] == "2026-03" and third["pricebooks"] == ["pb"] and third["tax_tables"] == ["tx"]
    assert [d.to_json_dict() for d in store.documents()] == [d.to_json_dict() for d in issued]
    assert _lines(issued) == _fresh(store, "2026-03")
    april = store.close_period("2026-04", now=NOW)
    assert [(d.number, d.kind, d.account_id, d.net) for d in april] == [(4, "invoice", "acct-a", 5)]


def test_closing_again_issues_only_what_changed_as_signed_notes_and_never_changes_a_document(
    store: Store,
) -> None:
    with_seller(store)
    complete(store, "b1", partial("acct-1", net=100, tax=10), partial("acct-2", net=40, tax=4))
    store.apply(
        [manifest("running", work_items=2)], [result("running-w1", partial("acct-1", net=1, tax=0), batch_id="running")]
    )
    first = store.close_period("2026-03", now=NOW)
    assert [(d.number, d.account_id, d.net) for d in first] == [(1, "acct-1", 100), (2, "acct-2", 40)], "running: later"
    snapshot = [_as_issued(d) for d in store.documents()]

    assert store.close_period("2026-03", now=NOW) == [], "nothing changed: nothing issued"

    store.apply([], [result("running-w2", partial("acct-1", product="GPU", net=3, tax=0), batch_id="running")])
    complete(store, "b2", partial("acct-3", net=9, tax=0))
    store.void("b1")
    second = store.close_period("2026-03", now=NOW)
    assert [(d.number, d.kind, d.account_id, d.net, d.tax, d.total) for d in second] == [
        (3, "credit_note", "acct-1", -96, -10, -106),  # b1's 110 gone, the running batch's 4 in
        (4, "credit_note", "acct-2", -40, -4, -44),
        (5, "invoice", "acct-3", 9, 0, 9),
    ]
    assert [(line.product, line.sums.net, line.batches) for line in second[0].lines] == [
        ("CPU", -99, ("b1", "running")),
        ("GPU", 3, ("running",)),
    ]
    assert [_as_issued(d) for d in store.documents()][:2] == snapshot, "issued documents never change"
    assert _lines(first + second) == _fresh(store, "2026-03")
    assert [d.number for d in store.documents(kind="credit_note")] == [3, 4]
    assert [(d.corrects, d.corrected_by) for d in store.documents(account="acct-1")] == [((), (3,)), ((1,), ())]
    assert [d.number for d in store.documents(account="acct-1", period="2026-03")] == [1, 3]
    shown = store.document(3)
    assert shown is not None and shown.to_json_dict() == second[0].to_json_dict()
    assert store.document(99) is None


@pytest.mark.parametrize("period", ["2026-13", "2026-3", "26-03", "2026-03-01", "", "0000-01", "2026-05", "2026-06"])
def test_a_malformed_or_future_period_is_refused_and_nothing_is_issued(store: Store, period: str) -> None:
    with_seller(store)
    complete(store, "b1", partial("acct-1"))
    with pytest.raises(LedgerError, match=r"YYYY-MM|future|not ended") as refused:
        store.close_period(period, now=NOW)
    assert "\n" not in str(refused.value)
    assert store.documents() == []
    assert [d.number for d in store.close_period("2026-03", now=NOW)] == [1], "no number was taken"


def test_closes_at_once_are_serialised_and_numbers_stay_gap_free(migrated_url: str) -> None:
    with with_seller(Store(migrated_url)) as store:
        complete(store, "b1", *(partial(f"acct-{i:02d}", net=i + 1, tax=0) for i in range(12)))
        complete(store, "b2", *(partial(f"acct-{i:02d}", net=i + 1, tax=0, day="2026-02-03") for i in range(12)))
    issued: list[list[Document]] = []
    errors: list[BaseException] = []

    def closer(period: str) -> None:
        try:
            with Store(migrated_url) as mine:
                issued.append(mine.close_period(period, now=NOW))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=closer, args=(p,)) for p in ("2026-03", "2026-02") * 3]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(len(docs) for docs in issued) == [0, 0, 0, 0, 12, 12], "each period closed once"
    with Store(migrated_url) as store:
        found = store.documents()
    assert [d.number for d in found] == list(range(1, 25)), "gap-free, each number once"
    for docs in issued:
        assert [d.number for d in docs] == list(range(docs[0].number, docs[0].number + 12)) if docs else True
        assert [d.account_id for d in docs] == sorted(d.account_id for d in docs)
    assert sum(d.net for d in found) == 2 * sum(range(1, 13)) and all(d.kind == "invoice" for d in found)
    assert {d.period for d in found} == {"2026-02", "2026-03"}
    assert all(isinstance(line.sums.quantity, Decimal) for d in found for line in d.lines)
