"""The billing rules as the roles split them, in one process: the initiator's cut (repeated ids marked), each
work item validated and rated by the processors' worker function, the results applied to the store in any
order. Aggregates, invoices and rejects must equal the independent reference model's, to the minor unit,
with repeated ids spread over work items whose first occurrences are valid or not."""

from __future__ import annotations

import io
import random
from decimal import Decimal
from pathlib import Path

import pytest

from controller import reports
from controller.store import Store
from initiator.debatch import Debatch
from processor.jobs import rate_work_items
from shared import inbox
from shared.protocol import Manifest, WorkHeader, WorkItemResult, parse_results
from shared.rules.reference import load_price_book, load_tax_table
from shared.rules.sample import generate, sample_price_book_bytes, sample_tax_table_bytes
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


def rated(path: Path, work_item_size: int) -> tuple[Manifest, list[WorkItemResult]]:
    price_book, tax_table = sample_price_book_bytes(), sample_tax_table_bytes()
    book, taxes = load_price_book(price_book), load_tax_table(tax_table)
    references = {book.content_hash: price_book, taxes.content_hash: tax_table}
    debatch = Debatch(work_item_size=work_item_size)
    results = []
    with path.open("rb") as source:
        blob, frames = inbox.in_memory(source, inbox.frame_bytes(path.stat().st_size))
    for index, cut in enumerate(debatch.parts("b1", "csv", frames, io.BytesIO(blob))):
        assert cut.part is not None
        header = WorkHeader(f"b1:{index}", "b1", book.content_hash, taxes.content_hash, cut.rows, cut.part)
        envelope, poisoned = rate_work_items(
            [(header, cut.payload, blob[cut.part.start : cut.part.end])], references, [{}]
        )
        assert envelope is not None and not poisoned
        (result,) = parse_results(envelope)
        assert result.rows == cut.rows
        results.append(result)
    done = manifest("b1", work_items=debatch.work_items, rows=debatch.rows)
    return done, results


@pytest.mark.parametrize("seed", [1, 2])
def test_rules_split_over_the_roles_equal_the_model(sql_url: str, tmp_path: Path, seed: int) -> None:
    path = batch_file(tmp_path / "batch.csv")
    done, results = rated(path, work_item_size=250)
    assert sum(r.held.num_rows for r in results) >= 6, "repeats are held across work items"
    random.Random(seed).shuffle(results)

    with Store(sql_url) as store:
        for start in range(0, len(results), 3):
            store.apply([done] if start == 3 else [], results[start : start + 3])
        status = store.batch("b1")
        aggregates, invoices, rejects = expected(read_raw(path))
        assert status is not None and status.state == "complete"
        assert (status.rows, status.accepted, status.rejected) == (3_009, 3_009 - len(rejects), len(rejects))
        got = reports.aggregates(store, "b1").to_dict("records")
        assert sorted_records({**r, "quantity": Decimal(r["quantity"])} for r in got) == aggregates
        assert sorted_records(reports.invoices(store, "b1").to_dict("records")) == invoices
        assert reports.rejects(store, "b1")[["row", "reason"]].to_dict("records") == rejects
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
