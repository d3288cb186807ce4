"""The billing rules as the roles split them, in one process: the initiator's cut (repeated ids marked),
each work item read, validated and rated by the processors' worker function (as ``benchmarks.store_apply``
does), the results applied to the store in any order. Aggregates, invoices and rejects must equal the
independent reference model's, to the minor unit, with repeated ids spread over work items whose first
occurrences are valid or not."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path

import pytest

from benchmarks.store_apply import BATCH, rated
from billing import reports
from billing.sample import generate, sample_price_book_bytes, sample_tax_table_bytes
from store import Store
from support.exact import expected, read_raw, sorted_records
from support.records import manifest

#: Rows whose ids repeat across the file: first occurrences rejected (bad quantity, unknown region) or
#: accepted, repeats valid or not, ids padded with whitespace, accounts apart so they land in other items.
REPEATS = [
    ("dup-a", "acct-0001", "x"),  # first occurrence rejected: the next valid one counts
    ("dup-b", "acct-0002", "1.5"),  # first occurrence accepted: every later one is a duplicate
    (" dup-a", "acct-0003", "2"),
    ("dup-b ", "acct-0004", "3"),
    ("dup-a", "acct-0005", "4"),
    ("dup-c", "acct-0006", "-1"),
    ("dup-c", "acct-0007", "y"),
    ("\tdup-c", "acct-0008", "5"),
    ("dup-c", "acct-0009", "6"),
]


def batch_file(path: Path) -> Path:
    generate(3_000, path, seed=17, reject_rate=0.05)
    lines = path.read_text().splitlines(keepends=True)
    extra = [
        f"{tx},{account},2026-03-02T09:15:00Z,compute.vcpu-hour,{quantity},\n" for tx, account, quantity in REPEATS
    ]
    for i, line in enumerate(extra):  # spread over the file
        lines.insert(1 + i * 300, line)
    path.write_text("".join(lines))
    return path


@pytest.mark.parametrize("seed", [1, 2])
def test_rules_split_over_the_roles_equal_the_model(migrated_url: str, tmp_path: Path, seed: int) -> None:
    path = batch_file(tmp_path / "batch.csv")
    price_book, tax_table = sample_price_book_bytes(), sample_tax_table_bytes()
    results = [result for message in rated(path, price_book, tax_table, work_item_size=250) for result in message]
    done = manifest(BATCH, work_items=len(results), rows=sum(result.rows for result in results))
    assert sum(r.held.num_rows for r in results) >= 6, "repeats are held across work items"
    random.Random(seed).shuffle(results)

    with Store(migrated_url) as store:
        for start in range(0, len(results), 3):
            store.apply([done] if start == 3 else [], results[start : start + 3])
        status = store.batch(BATCH)
        aggregates, invoices, rejects = expected(read_raw(path))
        assert status is not None and status.state == "complete"
        assert (status.rows, status.accepted, status.rejected) == (3_009, 3_009 - len(rejects), len(rejects))
        got = reports.aggregates(store, BATCH).to_dict("records")
        assert sorted_records({**r, "quantity": Decimal(r["quantity"])} for r in got) == aggregates
        assert sorted_records(reports.invoices(store, BATCH).to_dict("records")) == invoices
        assert reports.rejects(store, BATCH)[["row", "reason"]].to_dict("records") == rejects
    reasons = {r["row"]: r["reason"] for r in rejects}
    assert [reasons.get(1 + 300 * i) for i in range(len(REPEATS))] == [
        "invalid_quantity",
        None,
        None,  # the first valid "dup-a": its first occurrence was rejected
        "duplicate_transaction_id",
        "duplicate_transaction_id",
        "negative_quantity",
        "invalid_quantity",
        None,
        "duplicate_transaction_id",
    ]
    assert sum(reason == "duplicate_transaction_id" for reason in reasons.values()) > 10
