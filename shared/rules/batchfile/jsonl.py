"""JSON Lines batch files (:func:`read_jsonl`).

There is no header, so an absent required key is just a missing field of that row. A JSON number keeps its
literal text (``1.50`` stays ``"1.50"``, ``1e3`` stays ``"1e3"``). A boolean, array, object or non-standard
constant (``NaN``) is present but invalid: it is stored as :data:`INVALID_SENTINEL` followed by its JSON text,
which no field rule accepts. A row's raw text is its original line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, BinaryIO

import pyarrow as pa

from ...errors import FileRefused
from .chunks import RAW_COLUMNS, ReadOptions, chunk_table

#: Prefix of a JSON Lines value that is present but of a type no field accepts (boolean, array...).
INVALID_SENTINEL = "\x00"


def read_jsonl(source: BinaryIO, options: ReadOptions) -> Iterator[pa.Table]:
    """The chunks of a JSON Lines file (a :class:`~.chunks.Reader`)."""
    chunk_rows, max_row_bytes = options.chunk_rows, options.max_row_bytes
    columns: dict[str, list[str | None]] = {name: [] for name in RAW_COLUMNS}
    raws: list[str] = []
    done = options.rows_before
    line_no = options.lines_before
    while True:
        line = source.readline(max_row_bytes + 1)
        if not line:
            break
        line_no += 1
        if len(line) > max_row_bytes and not line.endswith(b"\n"):
            raise FileRefused(f"JSON Lines line {line_no} is longer than the limit of {max_row_bytes} bytes")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FileRefused(f"not UTF-8: invalid byte 0x{line[exc.start]:02x} on line {line_no}") from None
        if line_no == 1:
            text = text.removeprefix("\ufeff")
        text = text.strip()
        if not text:
            continue
        try:
            obj = json.loads(text, parse_float=str, parse_int=str, parse_constant=_invalid)
        except ValueError as exc:
            raise FileRefused(f"JSON Lines line {line_no} is not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise FileRefused(f"JSON Lines line {line_no} is not a JSON object")
        for name, values in columns.items():
            values.append(_json_cell(obj.get(name)))
        raws.append(text)
        if len(raws) == chunk_rows:
            yield _jsonl_table(columns, raws, done)
            done += len(raws)
            columns = {name: [] for name in RAW_COLUMNS}
            raws = []
    if raws:
        yield _jsonl_table(columns, raws, done)


def _invalid(constant: str) -> str:
    """A non-standard JSON constant (``NaN``, ``Infinity``) as a present but invalid value."""
    return INVALID_SENTINEL + constant


def _json_cell(value: Any) -> str | None:
    """A JSON value as cell text: strings and numbers as text, null as None, the rest as sentinel."""
    if value is None or isinstance(value, str):
        return value
    return INVALID_SENTINEL + json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _jsonl_table(columns: dict[str, list[str | None]], raws: list[str], done: int) -> pa.Table:
    arrays = [(name, pa.array(values, pa.string())) for name, values in columns.items()]
    return chunk_table(arrays, done, pa.array(raws, pa.string()))
