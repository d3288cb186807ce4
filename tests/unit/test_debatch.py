"""Debatching a real generated file: every accepted row goes out exactly once, in items of at most the
work item size, grouped by account and product within a window (each key's rows together, in file
order), and the counts add up."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from initiator.debatch import Debatch
from shared.protocol import decode_table
from shared.rules.batchfile import read_chunks
from shared.rules.rating import RATED_COLUMNS
from shared.rules.reference import load_price_book, load_tax_table
from shared.rules.sample import generate, sample_price_book_bytes, sample_tax_table_bytes
from shared.rules.validation import TransactionIdSet, validate


def test_items_hold_every_accepted_row_once_grouped_by_key(tmp_path: Path) -> None:
    path = tmp_path / "batch.csv"
    generate(20_000, path, seed=5, reject_rate=0.02)  # less than one window: one run per key
    price_book, tax_table = load_price_book(sample_price_book_bytes()), load_tax_table(sample_tax_table_bytes())
    debatch = Debatch(price_book, tax_table, work_item_size=700)
    with path.open("rb") as source:
        items = list(debatch.items(source, "csv"))
    with path.open("rb") as source:
        seen = TransactionIdSet()
        chunks = read_chunks(source, "csv")
        accepted = pa.concat_tables(validate(chunk, price_book, tax_table, seen)[0] for chunk in chunks)

    sent = pa.concat_tables(decode_table(encoded) for _, encoded in items)
    assert [rows for rows, _ in items] == [decode_table(encoded).num_rows for _, encoded in items]
    assert all(rows <= 700 for rows, _ in items) and len(items) == debatch.work_items == -(-accepted.num_rows // 700)
    assert (debatch.rows, debatch.accepted) == (20_000, accepted.num_rows) and debatch.rejected > 0
    assert debatch.rejected == debatch.rejects.num_rows == 20_000 - accepted.num_rows
    assert sent.column_names == list(RATED_COLUMNS)
    key = ["account_id", "product", "timestamp_us", "quantity_micro", "region"]
    assert sent.sort_by([(k, "ascending") for k in key]) == accepted.select(RATED_COLUMNS).sort_by(
        [(k, "ascending") for k in key]
    ), "every accepted row once, as validated"

    keys = list(zip(sent["account_id"].to_pylist(), sent["product"].to_pylist(), strict=True))
    runs = [k for k, _ in itertools.groupby(keys)]
    assert len(runs) == len(set(keys)), "each key's rows lie together"
    for account, product in set(keys):
        mine = pc.and_(pc.equal(sent["account_id"], account), pc.equal(sent["product"], product))
        in_file = pc.and_(pc.equal(accepted["account_id"], account), pc.equal(accepted["product"], product))
        assert sent.filter(mine)["timestamp_us"] == accepted.filter(in_file)["timestamp_us"], "in file order"
