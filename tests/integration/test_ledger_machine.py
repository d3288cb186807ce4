"""The ledger under random sequences of submit / finish / void / close / seller and customer changes, on SQLite
and PostgreSQL, against the reference model (hypothesis's ``RuleBasedStateMachine``).

Batches are small CSV files whose rows share transaction ids and fall in two periods (one by a time zone
offset); each is cut, marked with the ledger's id filter and rated the roles' way (:class:`benchmarks.ledger.
InProcess`) and recorded through the real store, its manifest and its result in any order, so a batch may still
be running during a close, or wait for an earlier batch that shares its ids, or be refused for sharing ids with a
batch marked at the same time (its manifest recorded first). The model is told of each batch that completes, in
sequence order. After
every step: issued documents unchanged, numbers gap-free, every batch's late rows as the model's, every period's
counted rows in the live totals at once, every note correcting exactly the earlier documents of its triple (and
named in their ``corrected_by``), kinds by sign, no document with every line at net 0 and tax 0, every
document's tax per rate adding up to its net and tax; after every close: its documents as the model's (lines per
product and price book with the price book's unit prices, tax per rate), their snapshots the seller and customers
in force, and for every account, currency and product the money of the period's documents' lines equal to a fresh
computation."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from benchmarks import reference_model as model
from benchmarks.ledger import Cut, InProcess
from billing.sample import sample_price_book_bytes, sample_tax_table_bytes
from shared.messages import Manifest, WorkItemResult
from shared.rules.reference import load_price_book
from store import BatchState, Customer, Document, Filters, LedgerError, Seller, Store, price_rows_of, schema
from store.engine import writing
from support.ledger import csv_of

PRICES = model.read_prices(sample_price_book_bytes().decode())
RATES = model.read_rates(sample_tax_table_bytes().decode())
#: The sample reference data as the model's version, with its price book's hash (lines name it).
SAMPLE = model.read_version(None, sample_price_book_bytes().decode(), sample_tax_table_bytes().decode())
PERIODS = ("2026-02", "2026-03")
NOW = datetime(2026, 4, 10, 9, 0, tzinfo=UTC)
ACCOUNTS = ("acct-a", "Acct-b")
SELLER = st.builds(
    Seller,
    name=st.sampled_from(["Example GmbH", "Example AG"]),
    address=st.just("Hauptstrasse 1, Berlin"),
    country=st.sampled_from(["DE", "AT"]),
    tax_id=st.sampled_from(["DE1", "ATU2"]),
    payment_terms_days=st.sampled_from([0, 14, 30]),
    prefix=st.sampled_from(["INV-", "R/"]),
)
CUSTOMER = st.builds(
    Customer,
    account_id=st.sampled_from(ACCOUNTS),
    name=st.sampled_from(["Alice Ltd", "Bob GmbH"]),
    address=st.sampled_from(["1 High St", "Weg 3"]),
    country=st.sampled_from(["GB", "DE", "JP"]),
    tax_id=st.sampled_from([None, "GB1"]),
)
FIELDS = ("transaction_id", "account_id", "timestamp", "product", "quantity", "region")

ROW = st.fixed_dictionaries(
    {
        "transaction_id": st.sampled_from([f"t{i}" for i in range(6)]),
        "account_id": st.sampled_from(ACCOUNTS),
        "timestamp": st.sampled_from(
            ["2026-02-27T10:00:00Z", "2026-03-02T09:30:00.5Z", "2026-03-01T00:30:00+02:00", "2026-03-31T23:00:00Z"]
        ),
        "product": st.sampled_from(["compute.vcpu-hour", "storage.gb-month", "transfer.jp-gb"]),  # USD, EUR, JPY
        "quantity": st.sampled_from(["1", "2.5", "0.000001", "30", "-1"]),  # the last one rejected
        "region": st.sampled_from(["", "DE", "JP"]),
    }
)


class LedgerMachine(RuleBasedStateMachine):
    """One empty ledger per example; ``url`` names the database (emptied first)."""

    url: ClassVar[str]

    def __init__(self) -> None:
        super().__init__()
        self.store = Store(self.url)
        with writing(self.store.engine) as conn:
            for table in reversed(schema.metadata.sorted_tables):
                conn.execute(table.delete())
        self.roles = InProcess(bits=1 << 12)
        self.store.record_price_books(price_rows_of(load_price_book(sample_price_book_bytes())))
        self.ledger = model.Ledger(PRICES, RATES, [SAMPLE])
        self.files: dict[str, list[dict[str, str | None]]] = {}
        self.results: dict[str, list[WorkItemResult]] = {}
        self.unapplied: dict[str, list[Manifest | WorkItemResult]] = {}  # what a running batch still waits for
        self.issued: list[dict[str, Any]] = []
        self.seller = self.store.set_seller(Seller("Example GmbH", "Hauptstrasse 1, Berlin", "DE", "DE1"))
        self.customers: dict[str, Customer] = {}

    def teardown(self) -> None:
        self.store.close()

    @rule(rows=st.lists(ROW, min_size=1, max_size=5), how=st.sampled_from(["whole", "manifest", "result"]))
    def submit(self, rows: list[dict[str, str | None]], how: str) -> None:
        """A new batch, recorded whole, or only its manifest, or only its result (the rest by ``finish``)."""
        batch_id = f"b{len(self.files) + 1}"
        cut = self.roles.cut(batch_id, csv_of(rows))
        self.files[batch_id], self.results[batch_id] = rows, cut.results
        self.unapplied[batch_id] = [cut.manifest, *cut.results]
        self._record(batch_id, {"whole": None, "manifest": 1, "result": -1}[how])

    @precondition(lambda self: self.unapplied)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """What a running batch still waits for arrives (with a redelivered copy of a result at times)."""
        batch_id = data.draw(st.sampled_from(sorted(self.unapplied)))
        self._record(batch_id, None, again=data.draw(st.booleans()))

    @precondition(lambda self: self.files)
    @rule(data=st.data())
    def void(self, data: st.DataObject) -> None:
        """Void a batch: done when it is complete and not voided, refused with nothing changed otherwise."""
        batch_id = data.draw(st.sampled_from(sorted(self.files)))
        if batch_id in self.ledger.rated and batch_id not in self.ledger.voided:
            assert self.store.void(batch_id).voided
            self.ledger.void(batch_id)
            return
        before = self.store.batches()
        with pytest.raises(LedgerError):
            self.store.void(batch_id)
        assert self.store.batches() == before

    @rule(seller=SELLER)
    def set_seller(self, seller: Seller) -> None:
        """A new seller version: the documents issued from now on name it."""
        self.seller = self.store.set_seller(seller)

    @rule(customers=st.lists(CUSTOMER, min_size=1, max_size=2, unique_by=lambda c: c.account_id))
    def import_customers(self, customers: list[Customer]) -> None:
        """Customers imported: new or changed ones get a version, the documents from now on name it."""
        self.store.import_customers(customers)
        self.customers |= {c.account_id: c for c in customers}
        assert self.store.customers() == sorted(self.customers.values(), key=lambda c: c.account_id)

    @precondition(lambda self: self.files)
    @rule(period=st.sampled_from(PERIODS))
    def close(self, period: str) -> None:
        """Close a period: the model's documents naming the parties in force, and the lines of all its documents
        add up to a fresh computation of what is counted now."""
        expected = self.ledger.close(period)
        issued = self.store.close_period(period, now=NOW)
        assert model.as_model([d.to_json_dict() for d in issued], priced=True) == expected
        for doc in issued:
            customer = self.customers.get(doc.account_id)
            assert doc.seller == self.seller.snapshot() and doc.display_number.startswith(self.seller.prefix)
            assert doc.customer == (customer.snapshot() if customer else None)
            assert doc.due_date == NOW.date() + timedelta(days=self.seller.payment_terms_days)
        event("close", ",".join(sorted({d.kind for d in issued})) or "nothing issued")
        assert _money(_line_sums(self.store.documents(period=period))) == _money(self._fresh(period))

    @invariant()
    def issued_documents_never_change_and_numbers_have_no_gap(self) -> None:
        """Snapshots included; only ``corrected_by`` grows as notes come."""
        found = [{k: v for k, v in d.to_json_dict().items() if k != "corrected_by"} for d in self.store.documents()]
        assert found[: len(self.issued)] == self.issued
        assert [d["number"] for d in found] == list(range(1, len(found) + 1))
        self.issued = found

    @invariant()
    def notes_correct_exactly_the_earlier_documents_of_their_triple(self) -> None:
        docs = self.store.documents()
        of_triple: dict[tuple[str, str, str], list[int]] = defaultdict(list)
        for doc in docs:
            earlier = of_triple[doc.period, doc.account_id, doc.currency]
            assert doc.corrects == tuple(earlier)
            assert doc.kind == ("invoice" if not earlier else "credit_note" if doc.total < 0 else "debit_note")
            assert any(line.sums.net or line.sums.tax for line in doc.lines), "no zero document"
            assert (sum(t.net for t in doc.taxes), sum(t.tax for t in doc.taxes)) == (doc.net, doc.tax)
            assert [t.rate for t in doc.taxes] == sorted({t.rate for t in doc.taxes}, key=lambda r: Decimal(r or 0))
            earlier.append(doc.number)
        for doc in docs:
            later = of_triple[doc.period, doc.account_id, doc.currency]
            assert doc.corrected_by == tuple(n for n in later if n > doc.number)

    @invariant()
    def rows_are_counted_at_once_and_late_as_the_model_says(self) -> None:
        complete = {s.batch_id: s.late for s in self.store.batches() if s.state == BatchState.complete}
        assert complete == {b: self.ledger.late[b] for b in self.ledger.rated}
        for period in PERIODS:
            rows = self.store.totals(("account_id", "product"), Filters(period=period)).rows
            live = {(r["account_id"], r["currency"], r["product"]): _measures(r) for r in rows}
            assert live == self._fresh(period)

    def _record(self, batch_id: str, count: int | None, *, again: bool = False) -> None:
        """Apply the next ``count`` (None: all, negative: all but the first ``-count``) of what the batch waits
        for, its manifest first; ``again`` adds a copy of a result applied before."""
        waiting = self.unapplied[batch_id]
        if count is not None and count < 0:
            now, later = waiting[-count:], waiting[:-count]
        else:
            now, later = waiting[:count], waiting[len(waiting) if count is None else count :]
        manifests = [m for m in now if isinstance(m, Manifest)]
        results = [r for r in now if isinstance(r, WorkItemResult)]
        applied_before = [r for r in self.results[batch_id] if all(r is not w for w in waiting)]
        if again and applied_before:
            results.append(applied_before[0])
        outcome = self.store.apply(manifests, results)
        if later:
            self.unapplied[batch_id] = later
            assert batch_id not in outcome.completed_batches
        else:
            del self.unapplied[batch_id]
        statuses = self.store.batches()
        for status in statuses:  # only the ledger refuses here: a batch sharing ids it could not check
            if status.state == BatchState.refused:
                assert "could not check" in (status.refused_reason or "") and status.batch_id not in self.ledger.rated
        seqs = {status.batch_id: status.seq or 0 for status in statuses}
        for completed in sorted(outcome.completed_batches, key=seqs.__getitem__):
            self.ledger.batch(completed, self.files[completed])
            event("batch completed", "with late rows" if self.ledger.late[completed] else "none late")

    def _fresh(self, period: str) -> dict[tuple[str, str, str], tuple[int, Decimal, int, int, int]]:
        """The period's counted rows of the complete, not voided batches, summed afresh per account, currency
        and product, from the model's rows."""
        sums: dict[tuple[str, str, str], list[Any]] = defaultdict(lambda: [0, Decimal(0), 0, 0, 0])
        for batch_id, rows in self.ledger.rated.items():
            if batch_id in self.ledger.voided:
                continue
            for row, rated_row in rows:
                if rated_row.billing_day[:7] == period:
                    key = (row.account_id, rated_row.currency, row.product)
                    for i, value in enumerate((1, row.quantity, rated_row.net, rated_row.tax, rated_row.total)):
                        sums[key][i] += value
        return {key: (int(s[0]), s[1], int(s[2]), int(s[3]), int(s[4])) for key, s in sums.items()}


def _measures(found: dict[str, Any]) -> tuple[int, Decimal, int, int, int]:
    return (
        int(found["transactions"]),
        Decimal(found["quantity"]),
        int(found["net"]),
        int(found["tax"]),
        int(found["total"]),
    )


def _money(sums: dict[tuple[str, str, str], tuple[int, Decimal, int, int, int]]) -> dict[tuple[str, str, str], Any]:
    """Net, tax and total per account, currency and product, where not all 0: a change settled without a document
    (every line of its pair at net 0 and tax 0) may leave transactions and quantity out of the documents."""
    return {key: s[2:] for key, s in sums.items() if any(s[2:])}


def _line_sums(docs: list[Document]) -> dict[tuple[str, str, str], tuple[int, Decimal, int, int, int]]:
    """The documents' lines summed per account, currency and product (those that do not sum to nothing)."""
    sums: dict[tuple[str, str, str], Any] = defaultdict(lambda: (0, Decimal(0), 0, 0, 0))
    for doc in docs:
        for line in doc.lines:
            key = (doc.account_id, doc.currency, line.product)
            sums[key] = tuple(a + b for a, b in zip(sums[key], _measures(line.sums.values()), strict=True))
    return {key: s for key, s in sums.items() if any(s)}


def test_a_manifest_that_comes_late_keeps_its_batchs_place_in_merge_order(migrated_url: str) -> None:
    """Batch two's results arrive before its manifest; batch three, merged after it, waits for it unnumbered (its
    ``t1`` held: two may hold it), and both complete once two's manifest comes, numbered in merge order: two counts
    its first ``t1``, three's is a duplicate. Numbered in arrival order, three would have counted ``t1`` and two,
    which counted its first ``t1`` unchecked (its filter did not hold three's ids), been refused."""
    roles = InProcess(bits=1 << 12)

    def cut(batch_id: str, *ids: str) -> Cut:
        values = ("acct-a", "2026-03-02T09:30:00Z", "compute.vcpu-hour", "1", "")
        return roles.cut(batch_id, csv_of([dict(zip(FIELDS, (i, *values), strict=True)) for i in ids]))

    with Store(migrated_url) as store:
        one, two = cut("one", "t0"), cut("two", "t1", "t1")
        store.apply([one.manifest], one.results)
        store.apply([], two.results)
        three = cut("three", "t1")
        assert store.apply([three.manifest], three.results).completed_batches == []
        waiting = store.batch("three")
        assert waiting is not None and (waiting.state, waiting.seq) == (BatchState.processing, None)
        assert sorted(store.apply([two.manifest], []).completed_batches) == ["three", "two"]
        batches = {b: store.batch(b) for b in ("two", "three")}
        assert [(b.state, b.seq, b.accepted, b.rejected) for b in batches.values() if b is not None] == [
            (BatchState.complete, 2, 1, 1),
            (BatchState.complete, 3, 0, 1),
        ]
        assert sum(r["transactions"] for r in store.totals(("account_id",)).rows) == 2, "t0 and t1, once"


def test_random_submits_voids_and_closes_keep_the_books_exact(migrated_url: str) -> None:
    machine = type("Ledger", (LedgerMachine,), {"url": migrated_url})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=15,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
