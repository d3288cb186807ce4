"""Parquet batch files (:func:`read_parquet`).

Every column is cast to text (numbers and decimals to their text, time-zone aware timestamps to UTC ISO 8601 with
``Z``, naive ones without offset); a required column missing, or a column whose type has no text form, refuses the
file. A row's raw text holds the ``RAW_COLUMNS`` present in the file.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ...errors import FileRefused
from .chunks import RAW_COLUMNS, ReadOptions, check_columns, chunk_table, one_line


def read_parquet(source: BinaryIO, options: ReadOptions) -> Iterator[pa.Table]:
    """The chunks of a Parquet file (a :class:`~.chunks.Reader`), which is read whole: a part of one
    (``options.rows_before``, ``options.lines_before``) raises :class:`ValueError`."""
    if options.rows_before or options.lines_before:
        raise ValueError("a Parquet file is read whole")
    return _parquet_chunks(source, options.chunk_rows)


def _parquet_chunks(source: BinaryIO, chunk_rows: int) -> Iterator[pa.Table]:
    spool: BinaryIO | None = None
    with contextlib.ExitStack() as stack:
        if not source.seekable():  # Parquet needs random access (its footer comes last)
            spool = stack.enter_context(tempfile.TemporaryFile())
            shutil.copyfileobj(source, spool)
            spool.seek(0)
        try:
            parquet = pq.ParquetFile(spool or source)
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise FileRefused(f"not a readable Parquet file: {one_line(exc)}") from None
        names = parquet.schema_arrow.names
        check_columns(names, "Parquet schema")
        present = [name for name in RAW_COLUMNS if name in names]
        for name in present:
            kind = parquet.schema_arrow.field(name).type
            if not _textual(kind):
                raise FileRefused(f"Parquet column {name!r} has type {kind}, which has no text form")
        done = 0
        try:
            for batch in parquet.iter_batches(batch_size=chunk_rows, columns=present):
                yield chunk_table([(name, _as_text(batch.column(name))) for name in present], done)
                done += batch.num_rows
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise FileRefused(f"Parquet file unreadable after data row {done}: {one_line(exc)}") from None


def _textual(kind: pa.DataType) -> bool:
    """Whether a Parquet column of this type can be read as text."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return not pa.types.is_nested(kind)


def _as_text(array: pa.Array) -> pa.Array:
    """An Arrow column as text; time-zone aware timestamps become UTC ISO 8601 with ``Z``."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        array = array.dictionary_decode()
        kind = array.type
    if pa.types.is_timestamp(kind):
        if kind.tz is None:
            return pc.strftime(array, format="%Y-%m-%dT%H:%M:%S")
        utc = array.cast(pa.timestamp(kind.unit, "UTC"))
        return pc.binary_join_element_wise(pc.strftime(utc, format="%Y-%m-%dT%H:%M:%S"), "Z", "")
    return array.cast(pa.string())
