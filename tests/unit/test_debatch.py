"""Debatching a real generated file: every row goes out exactly once, as read (raw text included), in items
of at most the work item size, grouped by account and product within a window (each key's rows together,
in file order), each repeated transaction id marked with the row of its first occurrence."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from initiator.debatch import Debatch
from shared.protocol import WorkHeader, decode_work
from shared.rules.batchfile import read_chunks
from shared.rules.sample import generate
from support.batchfiles import with_raw


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_items_hold_every_row_once_as_read_grouped_by_key(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"batch.{fmt}"
    generate(20_000, path, seed=5, fmt=fmt, reject_rate=0.05)  # less than one window: one run per key
    debatch = Debatch(work_item_size=700)
    with path.open("rb") as source:
        items = list(debatch.items(source, fmt))
    with path.open("rb") as source:
        read = pa.concat_tables(with_raw(chunk) for chunk in read_chunks(source, fmt))

    decoded = [
        decode_work(WorkHeader(str(i), "b", "pb", "tx", rows), encoded) for i, (rows, encoded) in enumerate(items)
    ]
    sent = pa.concat_tables(with_raw(item).append_column("repeat_of", item["repeat_of"]) for item in decoded)
    assert all(rows <= 700 for rows, _ in items) and len(items) == debatch.work_items == -(-20_000 // 700)
    assert debatch.rows == 20_000
    assert sent.drop_columns("repeat_of").sort_by("row") == read, "every row once, as read, raw text included"

    ids = pc.utf8_trim_whitespace(read["transaction_id"]).to_pylist()
    first_row: dict[str, int] = {}
    expected = [first_row.setdefault(i, row) if i else row for row, i in enumerate(ids, start=1)]
    expected = [0 if first == row else first for row, first in enumerate(expected, start=1)]
    assert sent.sort_by("row")["repeat_of"].to_pylist() == expected, "repeats name their id's first row"
    assert sum(1 for first in expected if first) > 100, "the generated file repeats ids"

    keys = list(zip(sent["account_id"].to_pylist(), sent["product"].to_pylist(), strict=True))
    runs = [k for k, _ in itertools.groupby(keys)]
    assert len(runs) == len(set(keys)), "each key's rows lie together"
    for account, product in set(keys):
        mine = sent.filter(pc.and_(pc.equal(sent["account_id"], account), pc.equal(sent["product"], product)))
        assert mine["row"].to_pylist() == sorted(mine["row"].to_pylist()), "in file order"
