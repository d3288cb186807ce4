"""Streaming readers for transaction batch files (``docs/billing-rules.md``, "Batch files").

:func:`read_chunks` turns a CSV, JSON Lines or Parquet file into Arrow tables (``CHUNK_SCHEMA``)
with memory bounded by ``chunk_rows`` and ``max_row_bytes``, never by the file size. Values are
text exactly as found (not stripped, not validated: :mod:`shared.rules.validation` does that); null means
the cell or key is absent. A file that cannot be read at all raises :class:`FileRefused` with a
one-line message; row-level problems are left for validation.

One reader a format, each a :class:`~.chunks.Reader`, with its format's decisions in its module's docstring:
:mod:`.csv_reader` (with :mod:`.csv_text`), :mod:`.jsonl`, :mod:`.parquet`. What they share is in
:mod:`.chunks`; :mod:`.lines` cuts and counts the lines of text files.

A row's raw text (for reject reports, :func:`raw_texts`; made only for the rows that need it) is a
compact JSON object of the original column -> text, or the original line of a JSON Lines row.
Errors of the underlying stream itself (``OSError``) propagate unchanged: they are transient, not a
property of the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import pyarrow as pa

from .chunks import CHUNK_SCHEMA, RAW_COLUMNS, REQUIRED_COLUMNS, Reader, ReadOptions, raw_texts
from .csv_reader import UNCLOSED_QUOTE, read_csv
from .jsonl import INVALID_SENTINEL, read_jsonl
from .lines import line_blocks, line_count
from .parquet import read_parquet

__all__ = [
    "CHUNK_SCHEMA",
    "FORMATS",
    "INVALID_SENTINEL",
    "RAW_COLUMNS",
    "REQUIRED_COLUMNS",
    "UNCLOSED_QUOTE",
    "detect_format",
    "line_blocks",
    "line_count",
    "raw_texts",
    "read_chunks",
]

_READERS: dict[str, Reader] = {"csv": read_csv, "jsonl": read_jsonl, "parquet": read_parquet}
FORMATS = tuple(_READERS)
_EXTENSIONS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}


def detect_format(name: str, head: bytes) -> str:
    """The format of a batch file from its name's extension, else by sniffing its first bytes."""
    lowered = name.lower()
    for extension, fmt in _EXTENSIONS.items():
        if lowered.endswith(extension):
            return fmt
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"{"):
        return "jsonl"
    return "csv"


def read_chunks(
    source: BinaryIO,
    fmt: str,
    *,
    chunk_rows: int = 50_000,
    max_row_bytes: int = 64 * 1024,
    csv_fast: bool = True,
    csv_block_bytes: int = 1 << 20,
    rows_before: int = 0,
    lines_before: int = 0,
    ids_only: bool = False,
) -> Iterator[pa.Table]:
    """Yield the rows of a batch file as tables of at most ``chunk_rows`` rows: ``CHUNK_SCHEMA``'s
    columns, then what :func:`raw_texts` makes the rows' raw text of. With ``ids_only``, a CSV file's rows have
    their ``transaction_id`` and no other column (the others null, no raw text): the same rows and refusals, read
    at about half the cost.

    ``row`` numbers the data rows from 1, contiguously across chunks. Raises :class:`FileRefused`
    when the file cannot be read (possibly after earlier chunks were yielded). A CSV file is read in
    blocks of about ``csv_block_bytes``; ``csv_fast=False`` reads it with Python's csv module alone
    (the same tables and refusals, slower).

    A part of a text file cut where a record ends (:mod:`shared.inbox`) reads as that part of the whole
    file, given the data rows and physical lines before it (``rows_before``, ``lines_before``; a CSV part
    starts with the file's header, whose lines ``lines_before`` leaves out): row numbers and refusals
    then count from the start of the file.
    """
    reader = _READERS.get(fmt)
    if reader is None:
        raise ValueError(f"unknown batch format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if chunk_rows < 1:
        raise ValueError("chunk_rows must be positive")
    options = ReadOptions(
        chunk_rows=chunk_rows,
        max_row_bytes=max_row_bytes,
        csv_fast=csv_fast,
        csv_block_bytes=csv_block_bytes,
        rows_before=rows_before,
        lines_before=lines_before,
        ids_only=ids_only,
    )
    return reader(source, options)
