"""Debatching real files: a text file's work items are runs of whole frames of its inbox blob that, read
alone as a processor reads them, hold every row of the file once, exactly as a read of the whole file has
it (raw text, row numbers, refusals included), each repeated transaction id marked with the row of its
first occurrence; a Parquet file's work items carry its rows."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from billing.sample import generate
from initiator.debatch import Cut, Debatch
from shared import inbox
from shared.errors import FileRefused, PoisonMessage
from shared.messages import REPEATS_SCHEMA, WorkHeader
from shared.rules.batchfile import read_chunks
from shared.rules.duplicates import id_hashes
from shared.tables import encode_table
from shared.wire import decode_work
from support.batchfiles import with_raw

HEADER = "transaction_id,account_id,timestamp,product,quantity,region\n"


def cut_blob(debatch: Debatch, content: bytes, fmt: str, *, frame: int) -> tuple[bytes, list[Cut]]:
    """``content`` as an inbox blob of frames of about ``frame`` bytes, and ``debatch``'s work items of it."""
    blob, frames = inbox.in_memory(io.BytesIO(content), frame)
    return blob, list(debatch.parts("b", fmt, frames, io.BytesIO(blob)))


def cut_text(content: bytes, fmt: str, *, frame: int, work_item_size: int) -> tuple[list[Cut], list[pa.Table]]:
    """The work items of ``content`` in frames of about ``frame`` bytes, and each read as a processor reads it."""
    debatch = Debatch(work_item_size=work_item_size)
    blob, cuts = cut_blob(debatch, content, fmt, frame=frame)
    parts = [cut.part for cut in cuts if cut.part is not None]
    read = [
        decode_work(WorkHeader(f"b:{i}", "b", "pb", "tx", cut.rows, part), cut.payload, blob[part.start : part.end])
        for i, (cut, part) in enumerate(zip(cuts, parts, strict=True))
    ]
    assert debatch.work_items == len(cuts) and debatch.rows == sum(cut.rows for cut in cuts)
    assert [(part.start, part.end) for part in parts] == list(itertools.pairwise([0, *(part.end for part in parts)])), (
        "every frame in one item, in order"
    )
    assert not parts or parts[-1].end == len(blob)
    return cuts, read


def whole(content: bytes, fmt: str) -> pa.Table:
    return pa.concat_tables(with_raw(chunk) for chunk in read_chunks(io.BytesIO(content), fmt))


def expected_repeats(table: pa.Table) -> list[int]:
    first: dict[str, int] = {}
    ids = pc.utf8_trim_whitespace(table["transaction_id"]).to_pylist()
    return [0 if not i or first.setdefault(i, row) == row else first[i] for row, i in enumerate(ids, start=1)]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_items_of_whole_frames_hold_every_row_once_as_the_file_reads(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"batch.{fmt}"
    generate(6_000, path, seed=5, fmt=fmt, reject_rate=0.05)
    content = path.read_bytes()
    cuts, read = cut_text(content, fmt, frame=20_000, work_item_size=700)

    full = [cut.rows >= 700 for cut in cuts]
    assert full == sorted(full, reverse=True) and full.count(True) > 3, "full items, then a smaller tail"
    rows = pa.concat_tables(with_raw(table).append_column("repeat_of", table["repeat_of"]) for table in read)
    file = whole(content, fmt)
    assert rows.drop_columns("repeat_of") == file, "every row once, as read, raw text included"
    assert rows["repeat_of"].to_pylist() == expected_repeats(file), "repeats name their id's first row"
    assert sum(1 for first in rows["repeat_of"].to_pylist() if first) > 10, "the generated file repeats ids"


def test_the_filter_is_given_each_first_occurrences_hash_as_the_ledger_records_it(tmp_path: Path) -> None:
    path = tmp_path / "batch.csv"
    generate(3_000, path, seed=9, reject_rate=0.05)
    content = path.read_bytes()
    debatch = Debatch(work_item_size=700)
    cut_blob(debatch, content, "csv", frame=20_000)
    ids = debatch.ids()
    firsts = [row for row, first in enumerate(expected_repeats(whole(content, "csv")), start=1) if not first]
    present = set(ids["row"].to_pylist())
    assert present <= set(firsts) and len(present) > 2_000, "first occurrences (of ids not empty)"
    assert debatch.hashes().tolist() == id_hashes(ids["transaction_id"]).view(np.uint64).tolist()


def test_a_quoted_line_break_across_frames_keeps_its_record_whole() -> None:
    rows = [
        f't{i},acct-{i % 7},2026-03-02T09:15:00Z,p,"{i}\n.5",\n' if i % 9 == 0 else f"t{i},a,x,p,{i},\n"
        for i in range(3000)
    ]
    content = ("\n" * 300 + HEADER + "".join(rows)).encode()  # empty lines before the header span frames too
    cuts, read = cut_text(content, "csv", frame=200, work_item_size=50)

    assert len(cuts) > 20
    assert pa.concat_tables(with_raw(table) for table in read) == whole(content, "csv")
    assert read[-1]["row"][-1].as_py() == 3000


@pytest.mark.parametrize(
    ("tail", "fmt"),
    [
        ('t9,a,x,p,"1\n.5\n', "csv"),  # a quote still open at the end
        ("t9,a,x,p,1,\xff\n", "csv"),
        ('{"transaction_id": "t9"\n', "jsonl"),
    ],
)
def test_a_file_unreadable_at_its_end_is_refused_as_a_whole_read_refuses_it(tail: str, fmt: str) -> None:
    if fmt == "csv":
        content = (HEADER + "".join(f"t{i},a,x,p,{i},\n" for i in range(2000)) + tail).encode("latin-1")
    else:
        content = ("".join(f'{{"transaction_id": "t{i}"}}\n' for i in range(2000)) + tail).encode("latin-1")
    with pytest.raises(FileRefused) as refused:
        whole(content, fmt)
    with pytest.raises(FileRefused) as cut:
        cut_text(content, fmt, frame=500, work_item_size=100)
    assert str(cut.value) == str(refused.value)  # the same refusal at the same line


def test_a_parquet_file_is_cut_into_items_of_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "batch.parquet"
    generate(5_000, path, seed=3, fmt="parquet", reject_rate=0.05)
    debatch = Debatch(work_item_size=700)
    with path.open("rb") as source:
        cuts = list(debatch.tables(source, "parquet"))
    read = [decode_work(WorkHeader(f"b:{i}", "b", "pb", "tx", cut.rows), cut.payload) for i, cut in enumerate(cuts)]
    assert [cut.rows for cut in cuts] == [700] * 7 + [100] and all(cut.part is None for cut in cuts)
    rows = pa.concat_tables(with_raw(table).append_column("repeat_of", table["repeat_of"]) for table in read)
    with path.open("rb") as source:
        file = pa.concat_tables(with_raw(chunk) for chunk in read_chunks(source, "parquet"))
    assert rows.drop_columns("repeat_of") == file
    assert rows["repeat_of"].to_pylist() == expected_repeats(file)


def test_a_work_item_whose_payload_names_rows_outside_its_part_is_poison() -> None:
    content = (HEADER + "".join(f"t{i},a,x,p,{i},\n" for i in range(2000))).encode()
    blob, cuts = cut_blob(Debatch(work_item_size=100), content, "csv", frame=4000)
    part = cuts[1].part
    assert part is not None
    text = blob[part.start : part.end]
    for rows in ([part.rows_before], [part.rows_before + cuts[1].rows + 1]):  # just before, just after
        payload = encode_table(pa.table({"row": rows, "repeat_of": [1]}, schema=REPEATS_SCHEMA))
        with pytest.raises(PoisonMessage, match="not its rows"):
            decode_work(WorkHeader("b:1", "b", "pb", "tx", cuts[1].rows, part), payload, text)
    with pytest.raises(PoisonMessage, match="row count"):
        decode_work(WorkHeader("b:1", "b", "pb", "tx", cuts[1].rows + 1, part), cuts[1].payload, text)
