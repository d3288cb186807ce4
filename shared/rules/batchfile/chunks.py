"""What every batch file reader shares: how it is called (:class:`Reader`, :class:`ReadOptions`), the chunks it
yields (``CHUNK_SCHEMA``, :func:`chunk_table`) and their rows' raw text (:func:`raw_texts`), the check of a file's
column names, and refusal messages on one line."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...errors import FileRefused

RAW_COLUMNS = ("transaction_id", "account_id", "timestamp", "product", "quantity", "region")
REQUIRED_COLUMNS = RAW_COLUMNS[:5]
#: A chunk's first columns: the fields as text, then the 1-based data row number.
CHUNK_SCHEMA = pa.schema([(name, pa.string()) for name in RAW_COLUMNS] + [("row", pa.int64())])
#: Schema metadata of a chunk whose raw text is made from its columns: ``[[JSON name, column], ...]``.
_RAW_KEY = b"billing.raw"


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """How a batch file is read (:func:`~shared.rules.batchfile.read_chunks` describes each)."""

    chunk_rows: int = 50_000
    max_row_bytes: int = 64 * 1024
    csv_fast: bool = True
    csv_block_bytes: int = 1 << 20
    rows_before: int = 0
    lines_before: int = 0
    ids_only: bool = False


class Reader(Protocol):
    """A reader of one format: the data rows of ``source`` as chunks of at most ``options.chunk_rows`` rows
    (``CHUNK_SCHEMA``'s columns, then what :func:`raw_texts` makes the rows' raw text of), ``row`` numbering them
    contiguously from ``options.rows_before + 1``. It raises :class:`FileRefused` when the file cannot be read
    (possibly after earlier chunks were yielded), :class:`ValueError` at once for options its format cannot
    honour; errors of the stream itself (``OSError``) propagate unchanged."""

    def __call__(self, source: BinaryIO, options: ReadOptions) -> Iterator[pa.Table]: ...


def check_columns(names: Sequence[str], where: str) -> None:
    """Refuse a file whose columns lack a required one or repeat one of ``RAW_COLUMNS``."""
    missing = [name for name in REQUIRED_COLUMNS if name not in names]
    if missing:
        raise FileRefused(f"{where} lacks required column(s): {', '.join(missing)}")
    repeated = [name for name in RAW_COLUMNS if names.count(name) > 1]
    if repeated:
        raise FileRefused(f"{where} repeats column(s): {', '.join(repeated)}")


def chunk_table(arrays: Sequence[tuple[str, pa.Array]], done: int, raw: pa.Array | None = None) -> pa.Table:
    """A chunk from the columns read, in file order (``RAW_COLUMNS`` absent are all null): the raw text
    ``raw`` if given, else made from those columns (kept, those not of ``RAW_COLUMNS`` as ``raw.<i>``)."""
    rows = len(arrays[0][1])
    sources = [(name, name if name in RAW_COLUMNS else f"raw.{i}") for i, (name, _) in enumerate(arrays)]
    extra = {column: array for (_, column), (_, array) in zip(sources, arrays, strict=True)}
    columns = {name: extra.pop(name, pa.nulls(rows, pa.string())) for name in RAW_COLUMNS}
    numbers = np.arange(done + 1, done + rows + 1, dtype=np.int64)  # from its buffer: no pandas import, as pa.array
    columns["row"] = pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(numbers)])
    if raw is not None:
        return pa.table(columns | {"raw": raw})
    return pa.table(columns | extra, metadata={_RAW_KEY: json.dumps(sources)})


def raw_texts(chunk: pa.Table) -> pa.Array:
    """Each row's raw text (a chunk of :func:`read_chunks`, or rows taken from one): a compact JSON
    object of its columns as read, the original line of a JSON Lines row."""
    if "raw" in chunk.column_names:
        return chunk.column("raw").combine_chunks()
    sources = json.loads(chunk.schema.metadata[_RAW_KEY])
    return _json_objects(
        [name for name, _ in sources], [chunk.column(column).combine_chunks() for _, column in sources]
    )


def concat(tables: list[pa.Table]) -> pa.Table:
    """One table of contiguous columns from consecutive blocks."""
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables).combine_chunks()


def _json_objects(names: Sequence[str], arrays: Sequence[pa.Array]) -> pa.Array:
    """Per row, a compact JSON object of column -> text leaving out null cells, as ``json.dumps`` writes it.

    Rows without nulls (the usual case) are joined from literals and cells, values escaped only
    where needed; the others are written one by one.
    """
    pieces: list[str | pa.Array] = []
    for i, (name, array) in enumerate(zip(names, arrays, strict=True)):
        pieces += [("{" if i == 0 else '",') + json.dumps(name, ensure_ascii=False) + ':"', _json_text(array)]
    objects = pc.binary_join_element_wise(*pieces, '"}', "")
    if not objects.null_count:
        return objects
    holes = objects.is_null()
    rows = pa.Table.from_arrays(list(arrays), names=list(names)).filter(holes).to_pylist()
    texts = [
        json.dumps({k: v for k, v in row.items() if v is not None}, ensure_ascii=False, separators=(",", ":"))
        for row in rows
    ]
    return pc.replace_with_mask(objects, holes, pa.array(texts, pa.string()))


def _json_text(array: pa.Array) -> pa.Array:
    """Text as inside a JSON string: the values with a quote, backslash or control character escaped."""
    if not _needs_escape(array):
        return array
    escape = pc.match_substring_regex(array, r'[\x00-\x1f"\\]').fill_null(False)
    escaped = [json.dumps(value, ensure_ascii=False)[1:-1] for value in array.filter(escape).to_pylist()]
    return pc.replace_with_mask(array, escape, pa.array(escaped, pa.string()))


def _needs_escape(array: pa.Array) -> bool:
    """Whether a string array holds a quote, backslash or control character (perhaps under a null)."""
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)[array.offset : array.offset + len(array) + 1]
    data = array.buffers()[2]
    if data is None or offsets[0] == offsets[-1]:
        return False
    text = np.frombuffer(data, dtype=np.uint8)[offsets[0] : offsets[-1]]
    return bool(np.any((text < 0x20) | (text == 0x22) | (text == 0x5C)))


def one_line(exc: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__
