"""The CSV reader's pyarrow path gives exactly what Python's csv module alone gives (``csv_fast=False``):
the same chunks (every column, row numbers, ``raw``) and the same refusals, over generated CSV text; read for the
ids alone (``ids_only``), the same ids and row numbers, and the same refusals."""

from __future__ import annotations

import csv
import io
from typing import Any

import pyarrow.csv as pacsv
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shared.errors import FileRefused
from shared.rules.batchfile import REQUIRED_COLUMNS, csv_reader, read_chunks
from support.batchfiles import RAW_SCHEMA, with_raw

PLAIN = st.text(st.sampled_from("ab19 .:-\t\xe9\ufeff"), max_size=6)
SPECIAL = st.text(st.sampled_from('ab ,;"\n\r\\\t\x00\x1f\x7f\xe9\u20ac\U0001f600\ufeff\u2028\x85'), max_size=6)
LONG = st.integers(10, 60).map(lambda n: "\xe9" * (n // 4) + "x" * n)  # about the row limits drawn below
BAD_BYTES = st.sampled_from([b"\xff", b"\xe9", b"\xc3", b"\xed\xa0\x80", b"\xf0\x9f"])
PERCENT = st.sampled_from([0, 0, 3, 15, 50])  # how often a file has a kind of line or cell


@st.composite
def cells(draw: st.DrawFn, quoted: int, raw: int, long: int) -> str:
    """One cell as written: plain text, else (by the percentages drawn for the file) quoted text
    with quotes, commas, newlines..., the same unquoted, or a long value."""
    if draw(st.integers(0, 99)) < quoted:
        return '"' + draw(SPECIAL).replace('"', '""') + '"'
    if draw(st.integers(0, 99)) < raw:
        return draw(SPECIAL)
    return draw(LONG if draw(st.integers(0, 99)) < long else PLAIN)


@st.composite
def header(draw: st.DrawFn) -> list[str]:
    """The required columns in any order, maybe region, extra columns (one maybe twice), names padded."""
    names = list(REQUIRED_COLUMNS) + draw(st.sampled_from([[], ["region"]]))
    names += draw(st.lists(st.sampled_from(["note", "", "Region"]), max_size=3))
    if draw(st.integers(0, 20)) == 0:
        names.append(draw(st.sampled_from(REQUIRED_COLUMNS)))  # refused: a required column twice
    names = draw(st.permutations(names))
    return [draw(st.sampled_from(["", " ", "\t"])) + name + draw(st.sampled_from(["", " "])) for name in names]


@st.composite
def csv_files(draw: st.DrawFn) -> bytes:
    """A CSV file: header, rows as wide as it, shorter or longer, empty and blank lines, any line ends;
    maybe a BOM, maybe an invalid UTF-8 sequence anywhere."""
    names = draw(header())
    quoted, raw, long, ragged, blank, other_eol = (draw(PERCENT) for _ in range(6))
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    lines = [",".join(names)]
    for _ in range(draw(st.integers(0, 40))):
        if draw(st.integers(0, 99)) < blank:
            lines.append(draw(st.sampled_from(["", " ", "\t"])))
            continue
        width = len(names)
        if draw(st.integers(0, 99)) < ragged:
            width = draw(st.integers(0, width + 2))
        lines.append(",".join(draw(st.lists(cells(quoted, raw, long), min_size=width, max_size=width))))
    ends = [draw(st.sampled_from(["\n", "\r\n", "\r"])) if draw(st.integers(0, 99)) < other_eol else eol for _ in lines]
    text = "".join(line + end for line, end in zip(lines, ends, strict=True))
    if draw(st.booleans()):
        text = text.removesuffix("\n").removesuffix("\r")
    data = draw(st.sampled_from([b"", b"\xef\xbb\xbf"])) + text.encode()
    if draw(st.integers(0, 9)) == 9:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(BAD_BYTES) + data[at:]
    return data


def outcome(data: bytes, **options: Any) -> tuple[list[list[dict[str, Any]]], str | None]:
    """The chunks read (as rows) up to the refusal, if any, and its message."""
    chunks: list[list[dict[str, Any]]] = []
    try:
        for chunk in read_chunks(io.BytesIO(data), "csv", **options):
            table = with_raw(chunk)
            assert table.schema == RAW_SCHEMA
            chunks.append(table.to_pylist())
    except FileRefused as exc:
        return chunks, str(exc)
    return chunks, None


def ids_outcome(data: bytes, **options: Any) -> tuple[list[list[dict[str, Any]]], str | None]:
    """The ids and row numbers of the chunks read up to the refusal, if any, and its message."""
    chunks: list[list[dict[str, Any]]] = []
    try:
        for chunk in read_chunks(io.BytesIO(data), "csv", **options):
            chunks.append(chunk.select(["transaction_id", "row"]).to_pylist())
    except FileRefused as exc:
        return chunks, str(exc)
    return chunks, None


HEADER = ",".join(REQUIRED_COLUMNS) + "\n"


@settings(max_examples=200, deadline=None)
@example(  # csv's own refusal of a long field, after pyarrow gave up on the run: the same line
    data=(HEADER + "t,a,ts,p,1\n\nt,a,ts,p," + "x" * 40 + "\n").encode(),
    chunk_rows=1,
    block_bytes=1 << 20,
    max_row_bytes=16,
    field_limit=True,
)
@example(  # a cell starting with U+FEFF at the start of a run (pyarrow drops a BOM)
    data=(HEADER + 't,"a",ts,p,1\n\ufefft,a,ts,p,1\n').encode(),
    chunk_rows=2,
    block_bytes=1,
    max_row_bytes=99,
    field_limit=False,
)
@example(  # a quoted newline across blocks, then plain lines
    data=(HEADER + 't,"a\n\n,b",ts,p,1\r\n' + "t,a,ts,p,1\n" * 3).encode(),
    chunk_rows=2,
    block_bytes=8,
    max_row_bytes=99,
    field_limit=False,
)
@given(
    data=csv_files(),
    chunk_rows=st.integers(1, 6),
    block_bytes=st.one_of(st.integers(1, 90), st.just(1 << 20)),
    max_row_bytes=st.integers(16, 200),
    field_limit=st.booleans(),
)
def test_fast_path_reads_as_csv_alone(
    data: bytes, chunk_rows: int, block_bytes: int, max_row_bytes: int, field_limit: bool
) -> None:
    options = {"chunk_rows": chunk_rows, "max_row_bytes": max_row_bytes, "csv_block_bytes": block_bytes}
    before = csv.field_size_limit()
    if field_limit:  # at the row limit, a field over it is csv's own refusal
        csv.field_size_limit(max_row_bytes)
    try:
        assert outcome(data, **options) == outcome(data, csv_fast=False, **options)
        assert ids_outcome(data, ids_only=True, **options) == ids_outcome(data, **options)
    finally:
        csv.field_size_limit(before)


@pytest.mark.parametrize(("block_bytes", "by_pyarrow"), [(1, 299), (64, 300), (1 << 20, 300)])
def test_quoted_records_go_to_pyarrow(monkeypatch: pytest.MonkeyPatch, block_bytes: int, by_pyarrow: int) -> None:
    """The test above would pass were pyarrow never used: here a spy on the real ``pyarrow.csv.read_csv``
    counts the rows it parses. Quoted fields, escaped quotes, a quoted line break and CRLF line ends are all
    pyarrow's; csv reads only a record that goes on past the block it starts in (the quoted line break, where
    a block ends inside it)."""
    parsed: list[int] = []
    real = pacsv.read_csv

    def read_csv(*args: Any, **kwargs: Any) -> Any:
        table = real(*args, **kwargs)
        parsed.append(table.num_rows)
        return table

    monkeypatch.setattr(csv_reader.pacsv, "read_csv", read_csv)
    rows = [f'"t{i}","a ""{i}""",2026-03-02T09:15:00Z,p,{i},DE\r\n' for i in range(1, 301)]
    rows[100] = 't101,"a,\n1",2026-03-02T09:15:00Z,p,101,DE\n'
    data = ",".join(("transaction_id", *REQUIRED_COLUMNS[1:], "region")) + "\n" + "".join(rows)
    chunks, error = outcome(data.encode(), chunk_rows=64, csv_block_bytes=block_bytes)
    assert error is None
    assert [row["row"] for chunk in chunks for row in chunk] == list(range(1, 301))
    assert chunks[1][36]["account_id"] == "a,\n1"
    assert chunks[0][9]["account_id"] == 'a "10"'
    assert sum(parsed) == by_pyarrow


def test_a_closing_quote_csv_refuses_is_read_by_csv() -> None:
    """Pyarrow reads on after a closing quote followed by other text; csv in strict mode refuses it, so that
    record is csv's, and the file is refused naming its line."""
    data = (HEADER + 't1,"a",ts,p,1\nt2,"a"b,ts,p,1\n').encode()
    assert outcome(data) == outcome(data, csv_fast=False)
    assert outcome(data)[1] == "malformed CSV at line 3: ',' expected after '\"'"
