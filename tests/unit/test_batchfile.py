"""Streaming batch-file readers: every CSV, JSON Lines and Parquet rule of docs/billing-rules.md."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
import tracemalloc
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from billing.sample import generate
from shared.errors import FileRefused
from shared.rules.batchfile import (
    CHUNK_SCHEMA,
    FORMATS,
    INVALID_SENTINEL,
    RAW_COLUMNS,
    REQUIRED_COLUMNS,
    detect_format,
    read_chunks,
)
from support.batchfiles import RAW_SCHEMA, with_raw

HEADER = "transaction_id,account_id,timestamp,product,quantity,region\n"


def read(path: Path, fmt: str, **options: Any) -> list[dict[str, Any]]:
    """All rows of a file with their raw text, checking each chunk's schema."""
    rows: list[dict[str, Any]] = []
    with path.open("rb") as source:
        for chunk in read_chunks(source, fmt, **options):
            table = with_raw(chunk)
            assert table.schema == RAW_SCHEMA
            rows.extend(table.to_pylist())
    return rows


def write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def fields(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[name] for name in RAW_COLUMNS)


# --- constants and detection -----------------------------------------------------------------------


def test_public_constants() -> None:
    assert FORMATS == ("csv", "jsonl", "parquet")
    assert RAW_COLUMNS == ("transaction_id", "account_id", "timestamp", "product", "quantity", "region")
    assert RAW_COLUMNS[:5] == REQUIRED_COLUMNS
    assert CHUNK_SCHEMA.names == [*RAW_COLUMNS, "row"]
    assert CHUNK_SCHEMA.field("row").type == pa.int64()


@pytest.mark.parametrize(
    ("name", "head", "expected"),
    [
        ("batch.csv", b"{", "csv"),
        ("BATCH.JSONL", b"a,b", "jsonl"),
        ("x.ndjson", b"", "jsonl"),
        ("x.parquet", b"", "parquet"),
        ("upload", b"PAR1\x15\x04", "parquet"),
        ("upload", b'\n  {"transaction_id": "t"}', "jsonl"),
        ("upload", b'\xef\xbb\xbf{"a": 1}', "jsonl"),
        ("upload.txt", HEADER.encode(), "csv"),
        ("upload", b"", "csv"),
    ],
)
def test_detect_format(name: str, head: bytes, expected: str) -> None:
    assert detect_format(name, head) == expected


def test_unknown_format_is_a_programming_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        read(write(tmp_path, "x", HEADER), "xml")


# --- CSV -------------------------------------------------------------------------------------------


def test_csv_values_are_kept_verbatim_with_raw_json(tmp_path: Path) -> None:
    path = write(tmp_path, "b.csv", HEADER + " t1 ,a1,2026-03-02T09:15:00+01:00,p, 1.50 ,DE\n")
    [row] = read(path, "csv")
    assert fields(row) == (" t1 ", "a1", "2026-03-02T09:15:00+01:00", "p", " 1.50 ", "DE")
    assert row["row"] == 1
    assert json.loads(row["raw"]) == dict(zip(RAW_COLUMNS, fields(row), strict=True))
    assert row["raw"] == json.dumps(dict(zip(RAW_COLUMNS, fields(row), strict=True)), separators=(",", ":"))


def test_csv_bom_empty_lines_and_quoted_newline(tmp_path: Path) -> None:
    data = "\ufeff\n" + HEADER + '\n\nt1,a,ts,p,1,\r\n\n"t\n2",a,ts,p,"2",GB\n\n'
    rows = read(write(tmp_path, "b.csv", data), "csv")
    assert [fields(r) for r in rows] == [("t1", "a", "ts", "p", "1", ""), ("t\n2", "a", "ts", "p", "2", "GB")]
    assert [r["row"] for r in rows] == [1, 2]
    assert json.loads(rows[1]["raw"])["transaction_id"] == "t\n2"


def test_csv_short_row_cells_are_missing_and_extra_columns_ignored(tmp_path: Path) -> None:
    data = "note,quantity,product,timestamp,account_id,transaction_id\nhello,1,p,ts,a,t1\nx,2,p\n"
    rows = read(write(tmp_path, "b.csv", data), "csv")
    assert fields(rows[0]) == ("t1", "a", "ts", "p", "1", None)
    assert fields(rows[1]) == (None, None, None, "p", "2", None)
    assert json.loads(rows[0]["raw"]) == {
        "note": "hello",
        "quantity": "1",
        "product": "p",
        "timestamp": "ts",
        "account_id": "a",
        "transaction_id": "t1",
    }
    assert json.loads(rows[1]["raw"]) == {"note": "x", "quantity": "2", "product": "p"}


def test_csv_columns_named_like_a_chunks_own_keep_their_text(tmp_path: Path) -> None:
    """Header names "row", "raw" and "raw.0" are text of the row like any other: they change neither
    the row numbers nor each other's raw text."""
    data = "raw.0,row,transaction_id,account_id,timestamp,product,quantity,raw\nA,B,t1,a,ts,p,1,C\nD,E,t2,a,ts,p,2\n"
    rows = read(write(tmp_path, "b.csv", data), "csv")
    assert [r["row"] for r in rows] == [1, 2]
    assert [json.loads(r["raw"]) for r in rows] == [
        {"raw.0": "A", "row": "B", "transaction_id": "t1", "account_id": "a", "timestamp": "ts", "product": "p"}
        | {"quantity": "1", "raw": "C"},
        {"raw.0": "D", "row": "E", "transaction_id": "t2", "account_id": "a", "timestamp": "ts", "product": "p"}
        | {"quantity": "2"},
    ]
    assert list(json.loads(rows[0]["raw"])) == ["raw.0", "row", *RAW_COLUMNS[:5], "raw"]  # header order


def test_csv_cells_beyond_the_header_are_ignored(tmp_path: Path) -> None:
    [row] = read(write(tmp_path, "b.csv", HEADER + "t,a,ts,p,1,DE,surplus,more\n"), "csv")
    assert fields(row) == ("t", "a", "ts", "p", "1", "DE")


def test_csv_escapes_in_raw(tmp_path: Path) -> None:
    data = HEADER + 't,"a""b",c\\d,p,1,\u00e4\u20ac\n'
    [row] = read(write(tmp_path, "b.csv", data), "csv")
    assert json.loads(row["raw"])["account_id"] == 'a"b'
    assert json.loads(row["raw"])["timestamp"] == "c\\d"
    assert row["region"] == "\u00e4\u20ac"


def test_csv_header_names_are_stripped_and_region_optional(tmp_path: Path) -> None:
    data = " transaction_id ,account_id,timestamp,product,quantity\nt,a,ts,p,1\n"
    [row] = read(write(tmp_path, "b.csv", data), "csv")
    assert fields(row) == ("t", "a", "ts", "p", "1", None)


def test_csv_row_numbers_are_contiguous_across_chunks(tmp_path: Path) -> None:
    lines = [f"t{i},a,ts,p,{i},\n" + ("\n" if i % 3 == 0 else "") for i in range(1, 24)]
    lines[5] = "t6,a,ts\n"  # a ragged row in one chunk
    path = write(tmp_path, "b.csv", HEADER + "".join(lines))
    with path.open("rb") as source:
        chunks = list(read_chunks(source, "csv", chunk_rows=5))
    assert [c.num_rows for c in chunks] == [5, 5, 5, 5, 3]
    rows = [r for c in chunks for r in c.to_pylist()]
    assert [r["row"] for r in rows] == list(range(1, 24))
    assert [r["transaction_id"] for r in rows] == [f"t{i}" for i in range(1, 24)]
    assert rows[5]["quantity"] is None


def test_csv_header_only_yields_nothing(tmp_path: Path) -> None:
    assert read(write(tmp_path, "b.csv", HEADER), "csv") == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "no header"),
        (b"\n\n", "no header"),
        (b"transaction_id,account_id,timestamp,quantity\n", "product"),
        (b"id,account,when\n", "transaction_id, account_id, timestamp, product, quantity"),
        (HEADER.replace("region", "quantity").encode(), "repeats column(s): quantity"),
        ((HEADER + 't1,a,ts,p,"1"x,\n').encode(), "malformed CSV at line 2"),
        ((HEADER + 't1,a,ts,p,1,\nt2,a,ts,p,"2,\n').encode(), "CSV line 3: the row starting here has a quoted"),
        ((HEADER + 't1,a,ts,p,"1').encode(), "CSV line 2: the row starting here has a quoted field that is never"),
        ((HEADER + "t1,a,ts,p,1,\nt2,\xff,ts,p,1,\n").encode("latin-1"), "not UTF-8"),
        (b"\xfftransaction_id\n", "not UTF-8"),
    ],
)
def test_csv_refusals(tmp_path: Path, data: bytes, message: str) -> None:
    with pytest.raises(FileRefused, match=re.escape(message)):
        read(write(tmp_path, "b.csv", data), "csv")


@pytest.mark.parametrize("fast", [True, False])
def test_csv_not_utf8_names_its_line(tmp_path: Path, fast: bool) -> None:
    data = (HEADER + "t1,a,ts,p,1,\n").encode() + b"t2,a,ts,p,\xe9,\n"
    with pytest.raises(FileRefused, match=r"^not UTF-8: invalid byte 0xe9 on line 3$"):
        read(write(tmp_path, "b.csv", data), "csv", csv_fast=fast)
    rows = "".join(f"t{i},a,ts,p,1,\n" for i in range(30_000))  # past the first block
    data = (HEADER + rows).encode() + b"t,\xff,ts,p,1,\n"
    with pytest.raises(FileRefused, match=r"^not UTF-8: invalid byte 0xff on line 30002$"):
        read(write(tmp_path, "far.csv", data), "csv", csv_fast=fast)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("before", [3, 28_000])
def test_csv_quote_never_closed_names_the_line_its_row_starts(tmp_path: Path, fast: bool, before: int) -> None:
    rows = "".join(f"t{i},a,ts,p,1,\n" for i in range(before))
    quoted = 'q1,a,ts,p,"1\n2",\n'  # a quoted line break: the open row starts on the line after it
    line = before + 4
    to_end = HEADER + rows + quoted + 'o,a,"ts,p,1,\n' + "t,a,ts,p,1,\n" * 5
    with pytest.raises(
        FileRefused, match=rf"^CSV line {line}: the row starting here has a quoted field that is never closed$"
    ):
        read(write(tmp_path, "end.csv", to_end), "csv", csv_fast=fast)
    past_limit = HEADER + rows + quoted + 'o,a,"ts,p,1,\n' + "t,a,ts,p,1,\n" * 20_000  # past csv's field limit too
    with pytest.raises(
        FileRefused, match=rf"^CSV line {line}: .* quoted field not closed within the limit of 65536 bytes$"
    ):
        read(write(tmp_path, "limit.csv", past_limit), "csv", csv_fast=fast)
    long_line = HEADER + rows + quoted + "o,a,ts,p,1," + "x" * 140_000 + "\n"
    with pytest.raises(FileRefused, match=rf"^CSV line {line}: a row is longer than the limit of 65536 bytes$"):
        read(write(tmp_path, "long.csv", long_line), "csv", csv_fast=fast)


def test_csv_header_quote_never_closed_names_its_line(tmp_path: Path) -> None:
    data = '\n"transaction_id,account_id\nt,a\n'
    with pytest.raises(
        FileRefused, match=r"^CSV line 2: the row starting here has a quoted field that is never closed$"
    ):
        read(write(tmp_path, "b.csv", data), "csv")


def test_csv_row_longer_than_limit_is_refused(tmp_path: Path) -> None:
    ok = HEADER + "t1,a,ts,p,1," + "x" * 50 + "\n"
    assert len(read(write(tmp_path, "ok.csv", ok), "csv", max_row_bytes=100)) == 1
    spread = HEADER + "t1,a,ts,p,1,\nt2," + ",".join(["y" * 30] * 5) + "\n"  # no field is too long
    with pytest.raises(FileRefused, match="data row 2 is longer than the limit of 100 bytes"):
        read(write(tmp_path, "spread.csv", spread), "csv", max_row_bytes=100)
    one_field = HEADER + "t1,a,ts,p,1," + "z" * 300_000 + "\n"
    with pytest.raises(FileRefused, match="longer than the limit"):
        read(write(tmp_path, "field.csv", one_field), "csv")


def test_csv_leaves_the_source_open(tmp_path: Path) -> None:
    path = write(tmp_path, "b.csv", HEADER + "t,a,ts,p,1,\n")
    with path.open("rb") as source:
        list(read_chunks(source, "csv"))
        assert not source.closed


# --- JSON Lines ------------------------------------------------------------------------------------


def test_jsonl_values(tmp_path: Path) -> None:
    lines = [
        '{"transaction_id": "t1", "account_id": "a", "timestamp": "ts", "product": "p", '
        '"quantity": 1.50, "region": "DE"}',
        "",
        "   ",
        '{"transaction_id": "t2", "account_id": null, "product": "p", "quantity": 1e3, "extra": [1]}',
        '{"transaction_id": 7, "account_id": true, "timestamp": ["x"], "product": {"a": 1}, '
        '"quantity": -0, "region": false}',
        '{"transaction_id": " t4 ", "quantity": NaN, "region": null}',
    ]
    path = write(tmp_path, "b.jsonl", "\ufeff" + "\r\n".join(lines) + "\n")
    rows = read(path, "jsonl")
    assert [r["row"] for r in rows] == [1, 2, 3, 4]
    assert fields(rows[0]) == ("t1", "a", "ts", "p", "1.50", "DE")
    assert fields(rows[1]) == ("t2", None, None, "p", "1e3", None)
    s = INVALID_SENTINEL
    assert fields(rows[2]) == ("7", s + "true", s + '["x"]', s + '{"a":"1"}', "-0", s + "false")
    assert fields(rows[3]) == (" t4 ", None, None, None, s + "NaN", None)
    assert rows[0]["raw"] == lines[0]
    assert json.loads(rows[1]["raw"])["extra"] == [1]


def test_jsonl_row_numbers_across_chunks(tmp_path: Path) -> None:
    lines = "".join(f'{{"transaction_id": "t{i}"}}\n\n' for i in range(1, 12))
    with write(tmp_path, "b.jsonl", lines).open("rb") as source:
        chunks = list(read_chunks(source, "jsonl", chunk_rows=4))
    assert [c.num_rows for c in chunks] == [4, 4, 3]
    assert [r for c in chunks for r in c.column("row").to_pylist()] == list(range(1, 12))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"transaction_id": "t"}\n[1, 2]\n', "line 2 is not a JSON object"),
        (b'{"transaction_id": "t"}\n\n"text"\n', "line 3 is not a JSON object"),
        (b'{"transaction_id": "t"\n', "line 1 is not valid JSON"),
        (b'{"transaction_id": "t"} {"b": 1}\n', "line 1 is not valid JSON"),
        (b'{"transaction_id": "\xff"}\n', "not UTF-8: invalid byte 0xff on line 1"),
        (b'{"transaction_id": "' + b"x" * 200 + b'"}\n', "line 1 is longer than the limit of 100 bytes"),
    ],
)
def test_jsonl_refusals(tmp_path: Path, data: bytes, message: str) -> None:
    with pytest.raises(FileRefused, match=message):
        read(write(tmp_path, "b.jsonl", data), "jsonl", max_row_bytes=100)


# --- Parquet ---------------------------------------------------------------------------------------


def test_parquet_types_are_cast_to_text(tmp_path: Path) -> None:
    table = pa.table(
        {
            "transaction_id": pa.array([1, 2, None], pa.int64()),
            "account_id": pa.array(["a", None, "c"]).dictionary_encode(),
            "timestamp": pa.array(
                [
                    dt.datetime(2026, 3, 2, 9, 15, tzinfo=dt.timezone(dt.timedelta(hours=1))),
                    dt.datetime(2026, 3, 2, 9, 15, 0, 500000, tzinfo=dt.UTC),
                    None,
                ],
                pa.timestamp("us", "Europe/Paris"),
            ),
            "product": ["p", "q", "r"],
            "quantity": pa.array([decimal.Decimal("1.50"), decimal.Decimal("0.000001"), None], pa.decimal128(12, 6)),
            "ignored": pa.array([[1], [2], [3]]),
        }
    )
    path = tmp_path / "b.parquet"
    pq.write_table(table, path)
    rows = read(path, "parquet")
    assert [r["row"] for r in rows] == [1, 2, 3]
    assert [r["transaction_id"] for r in rows] == ["1", "2", None]
    assert [r["account_id"] for r in rows] == ["a", None, "c"]
    assert [r["timestamp"] for r in rows] == ["2026-03-02T08:15:00.000000Z", "2026-03-02T09:15:00.500000Z", None]
    assert [r["quantity"] for r in rows] == ["1.500000", "0.000001", None]
    assert [r["region"] for r in rows] == [None, None, None]
    assert json.loads(rows[1]["raw"]) == {
        "transaction_id": "2",
        "timestamp": "2026-03-02T09:15:00.500000Z",
        "product": "q",
        "quantity": "0.000001",
    }


def test_parquet_naive_timestamps_floats_and_chunks(tmp_path: Path) -> None:
    n = 10
    table = pa.table(
        {
            "transaction_id": [f"t{i}" for i in range(n)],
            "account_id": ["a"] * n,
            "timestamp": pa.array([dt.datetime(2026, 3, 2, 9, 0, i) for i in range(n)], pa.timestamp("s")),
            "product": ["p"] * n,
            "quantity": [0.5 * i for i in range(n)],
            "region": ["DE"] * n,
        }
    )
    path = tmp_path / "b.parquet"
    pq.write_table(table, path, row_group_size=3)
    with path.open("rb") as source:
        chunks = list(read_chunks(source, "parquet", chunk_rows=4))
    assert all(c.num_rows <= 4 for c in chunks)
    rows = [r for c in chunks for r in c.to_pylist()]
    assert [r["row"] for r in rows] == list(range(1, n + 1))
    assert rows[3]["timestamp"] == "2026-03-02T09:00:03.000"  # Parquet keeps ms; no offset: rejected later
    assert rows[3]["quantity"] == "1.5"


def test_parquet_refusals(tmp_path: Path) -> None:
    path = tmp_path / "missing.parquet"
    pq.write_table(pa.table({"transaction_id": ["t"], "account_id": ["a"], "timestamp": ["ts"]}), path)
    with pytest.raises(FileRefused, match=r"lacks required column.*product, quantity"):
        read(path, "parquet")
    nested = tmp_path / "nested.parquet"
    pq.write_table(pa.table({name: [["x"]] if name == "quantity" else ["x"] for name in RAW_COLUMNS}), nested)
    with pytest.raises(FileRefused, match="'quantity' has type"):
        read(nested, "parquet")
    with pytest.raises(FileRefused, match="not a readable Parquet file"):
        read(write(tmp_path, "garbage.parquet", b"PAR1 this is not parquet at all"), "parquet")
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({name: ["x"] * 1000 for name in RAW_COLUMNS}), good)
    truncated = write(tmp_path, "truncated.parquet", good.read_bytes()[:-40])
    with pytest.raises(FileRefused):
        read(truncated, "parquet")


def test_parquet_from_a_non_seekable_stream(tmp_path: Path) -> None:
    path = tmp_path / "b.parquet"
    pq.write_table(pa.table({name: ["x", "y"] for name in REQUIRED_COLUMNS}), path)

    class Pipe:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def read(self, size: int = -1) -> bytes:
            size = len(self.data) if size < 0 else size
            out, self.data = self.data[:size], self.data[size:]
            return out

        def seekable(self) -> bool:
            return False

    rows = [r for c in read_chunks(Pipe(path.read_bytes()), "parquet") for r in c.to_pylist()]  # type: ignore[arg-type]
    assert [r["transaction_id"] for r in rows] == ["x", "y"]


# --- generated files and memory --------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_generated_files_read_back(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"b.{fmt}"
    generate(2_345, path, seed=3, fmt=fmt, chunk_rows=1_000, reject_rate=0.05)
    with path.open("rb") as source:
        assert detect_format("upload", source.read(64)) == fmt
    rows = read(path, fmt, chunk_rows=500)
    assert len(rows) == 2_345
    assert [r["row"] for r in rows] == list(range(1, 2_346))
    assert all(json.loads(r["raw"]) for r in rows)


def test_generated_formats_agree(tmp_path: Path) -> None:
    results = {}
    for fmt in FORMATS:
        path = tmp_path / f"b.{fmt}"
        generate(500, path, seed=9, fmt=fmt, reject_rate=0.1)
        results[fmt] = [tuple((v or "") for v in fields(r)) for r in read(path, fmt)]
    assert results["csv"] == results["parquet"]
    assert results["csv"] == results["jsonl"]


def peak_python_memory(path: Path, chunk_rows: int) -> int:
    """Peak Python allocations (tracemalloc) while reading ``path`` in chunks."""
    tracemalloc.start()
    try:
        rows = 0
        with path.open("rb") as source:
            for chunk in read_chunks(source, "csv", chunk_rows=chunk_rows):
                rows += chunk.num_rows
        assert rows > 0
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_reading_a_large_csv_keeps_memory_bounded(tmp_path: Path) -> None:
    small, big = tmp_path / "small.csv", tmp_path / "big.csv"
    generate(50_000, small, seed=1)
    generate(300_000, big, seed=1)
    small_peak = peak_python_memory(small, 5_000)
    big_peak = peak_python_memory(big, 5_000)
    assert big_peak < small_peak * 1.5, (small_peak, big_peak)  # does not grow with the file
    assert big_peak < big.stat().st_size / 3, (big_peak, big.stat().st_size)
