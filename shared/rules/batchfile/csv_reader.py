"""CSV batch files (:func:`read_csv`).

UTF-8 (optional BOM), header row required and its names stripped of surrounding whitespace; a required column
missing, or any of ``RAW_COLUMNS`` named twice, refuses the file. Strictly empty lines are not rows; cells beyond
the header are ignored; a short row's absent cells are null. Python's ``csv`` module in strict mode decides what
malformed quoting is (a stray quote inside an unquoted field, ``a,b"c``, is accepted as a literal quote, as that
module does); pyarrow parses every run of whole records where it gives exactly the same rows (quoted fields
included: :mod:`.csv_text`), that module the rest. A file is refused for its first problem in file order, naming
its physical line: an invalid UTF-8 byte by its line, a quoted field never closed (or not closed within the row
limit) by the line where its row starts. A row's raw text holds every header column (absent cells left out).
"""

from __future__ import annotations

import codecs
import csv
import io
import itertools
import operator
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ...errors import FileRefused
from .chunks import ReadOptions, check_columns, chunk_table, concat
from .csv_text import BadByte, CsvText
from .lines import line_count

if TYPE_CHECKING:
    import _csv

_CSV_BATCH_ROWS = 8192  # records csv reads at a time
_CSV_PARSE = pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=True)
_CSV_CONVERT = {"null_values": [], "strings_can_be_null": False, "check_utf8": False}  # decoded already
_LINE_NUM = operator.attrgetter("line_num")
#: What the refusal of a CSV file whose last row has a quoted field still open at its end says.
UNCLOSED_QUOTE = "has a quoted field that is never closed"


def read_csv(source: BinaryIO, options: ReadOptions) -> Iterator[pa.Table]:
    """The chunks of a CSV file (a :class:`~.chunks.Reader`): read in blocks of about ``options.csv_block_bytes``,
    by Python's csv module alone where ``options.csv_fast`` is false (the same tables and refusals, slower)."""
    return _CsvReader(source, options).chunks()


class _CsvReader:
    """The data rows of one CSV file as chunks: runs of whole records parsed by pyarrow (C++) where that gives
    exactly what Python's csv module gives, the rest by that module, with the same rows, raw text and refusals
    either way; ``csv_fast`` false: the csv module alone."""

    def __init__(self, source: BinaryIO, options: ReadOptions) -> None:
        max_row_bytes = options.max_row_bytes
        if csv.field_size_limit() < max_row_bytes:
            csv.field_size_limit(max_row_bytes)
        self._text = CsvText(source, options.csv_block_bytes, options.lines_before)
        self._chunk_rows = options.chunk_rows
        self._max_row_bytes = max_row_bytes
        self._fast = options.csv_fast
        self._names: list[str] = []  # each header name once, in order
        self._positions: list[int] = []  # the column of each name's first occurrence
        self._ids_only = options.ids_only
        self._kept: list[int] = []  # the names (their index) the chunks hold
        self._width = 0
        self._rows = options.rows_before  # data rows read
        self._done = options.rows_before  # data rows yielded
        self._pending: list[pa.Table] = []  # rows read, not yet yielded

    def chunks(self) -> Iterator[pa.Table]:
        try:
            yield from self._chunks()
        except BadByte as exc:
            raise FileRefused(f"not UTF-8: invalid byte 0x{exc.byte:02x} on line {exc.line}") from None

    def _chunks(self) -> Iterator[pa.Table]:
        self._text.next_block()
        reader = csv.reader(self._text.lines(), strict=True)
        header: list[str] | None = None
        start = 1  # the header's first line
        try:
            for cells in reader:
                if cells:
                    header = cells
                    break
                start = reader.line_num + 1
        except csv.Error as exc:
            raise self._malformed(exc, start, reader.line_num) from None
        if header is None:
            raise FileRefused("CSV has no header row")
        names = [name.strip() for name in header]
        check_columns(names, "CSV header")
        positions = {name: names.index(name) for name in dict.fromkeys(names)}  # first of each name
        self._names, self._positions, self._width = list(positions), list(positions.values()), len(names)
        kept = ("transaction_id",) if self._ids_only else self._names
        self._kept = [index for index, name in enumerate(self._names) if name in kept]
        if not self._fast:
            yield from self._python(reader, 0, None)
        else:
            self._text.sync()
            while (run := self._text.fast_run()) is not None:
                if not run:  # csv takes the records until pyarrow can read on
                    line = self._text.line()
                    quoted = csv.reader(self._text.lines(), strict=True)
                    yield from self._python(quoted, line, self._text.csv_quota)
                    self._text.sync()
                elif (table := self._parsed(run)) is not None:
                    yield from self._emit(table)
                else:  # ragged rows, a row too long...: csv decides, as it would have
                    line = self._text.line() - line_count(run)
                    text = io.StringIO(run.decode(), newline="")
                    yield from self._python(csv.reader(text, strict=True), line, None)
        if self._pending:
            yield concat(self._pending)

    def _python(self, reader: _csv.Reader, line: int, quota: Callable[[], int] | None) -> Iterator[pa.Table]:
        """The rows of ``reader`` (whose lines start after physical line ``line``), batch by batch,
        until it ends or ``quota`` (the records for the next batch) says 0."""
        while True:
            # Cells of a batch of rows in one flat list; ``ends`` is its length after each row. All
            # C-level, and no row list outlives its row (keeps the cyclic GC out of the hot loop).
            # Batches smaller than a chunk stay cache-friendly, which is faster than one batch a chunk.
            records = min(_CSV_BATCH_ROWS, self._chunk_rows + self._done - self._rows)
            if quota is not None and not (records := min(records, quota())):
                return
            # ``read`` keeps the reader's line count after the last whole row (zip reads it after each row): where a
            # row that fails starts.
            flat: list[str] = []
            ends: list[int] = []
            read = deque([reader.line_num], maxlen=1)
            rows = map(len, map(flat.__iadd__, itertools.islice(reader, records)))
            lines = map(read.append, map(_LINE_NUM, itertools.repeat(reader)))
            try:
                ends.extend(map(operator.itemgetter(0), zip(rows, lines, strict=False)))
            except (csv.Error, BadByte) as exc:
                self._batch(flat, ends)  # a row before the error may be too long: the first problem wins
                if isinstance(exc, BadByte):
                    raise
                raise self._malformed(exc, line + read[0] + 1, line + reader.line_num) from None
            yield from self._emit(self._batch(flat, ends))
            if len(ends) < records:
                return

    def _malformed(self, exc: csv.Error, start: int, line: int) -> FileRefused:
        """The refusal of a row starting on physical line ``start`` that csv failed on at line ``line``."""
        limit = self._max_row_bytes
        if "field larger than field limit" in str(exc):
            if line > start:  # the field runs on over line ends: a quote opened and not closed in time
                return FileRefused(
                    f"CSV line {start}: the row starting here has a quoted field not closed within the limit "
                    f"of {limit} bytes"
                )
            return FileRefused(f"CSV line {start}: a row is longer than the limit of {limit} bytes")
        if "unexpected end of data" in str(exc):
            return FileRefused(f"CSV line {start}: the row starting here {UNCLOSED_QUOTE}")
        return FileRefused(f"malformed CSV at line {line}: {exc}")

    def _batch(self, flat: list[str], ends: list[int]) -> pa.Table:
        """The rows of a batch read by csv; refuses the first row longer than the limit."""
        cells = np.diff(np.array(ends, np.int64), prepend=0)
        width = self._width
        long_row: int | None = None
        if np.all((cells == width) | (cells == 0)):  # empty lines are not rows
            columns: Sequence[Sequence[str | None]] = [flat[i::width] for i in self._positions]
        else:
            columns, long_row = _ragged_columns(flat, ends, width, self._max_row_bytes)
            columns = [columns[i] for i in self._positions]
        arrays = [pa.array(values, pa.string()) for values in columns]
        too_long = np.flatnonzero(_value_bytes(arrays) > self._max_row_bytes)
        if len(too_long) and (long_row is None or too_long[0] < long_row):
            long_row = int(too_long[0])
        if long_row is not None:
            raise FileRefused(
                f"data row {self._rows + long_row + 1} is longer than the limit of {self._max_row_bytes} bytes"
            )
        return self._table(arrays)

    def _parsed(self, data: bytes) -> pa.Table | None:
        """The rows of a run of whole records that pyarrow reads as csv does (:mod:`.csv_text`); None unless they
        are exactly what csv would read without error: every row as wide as the header (or empty) and no row's
        cells longer than the limit together."""
        if data.startswith(codecs.BOM_UTF8):  # pyarrow would drop it; an empty line first keeps it
            data = b"\n" + data
        if self._ids_only:  # the columns kept alone, where no record's bytes together can pass the limit
            kept = self._read(data, [self._positions[index] for index in self._kept])
            if kept is None or self._text.longest_record() > self._max_row_bytes:
                return None if kept is None else self._checked(self._read(data))
            return chunk_table(list(zip([self._names[i] for i in self._kept], kept, strict=True)), self._rows)
        return self._checked(self._read(data))

    def _read(self, data: bytes, columns: Sequence[int] | None = None) -> list[pa.Array] | None:
        """``data`` parsed by pyarrow: every column (or those given) as text; None where it fails (a row of another
        width, mostly)."""
        names = [str(i) for i in range(self._width)]
        read = pacsv.ReadOptions(column_names=names, use_threads=False, block_size=len(data) + 1)
        kept = names if columns is None else [names[i] for i in columns]
        convert = pacsv.ConvertOptions(
            include_columns=kept, column_types=dict.fromkeys(kept, pa.string()), **_CSV_CONVERT
        )
        try:
            table = pacsv.read_csv(pa.BufferReader(data), read, _CSV_PARSE, convert)
        except pa.ArrowException:
            return None
        return [column.combine_chunks() for column in table.columns]

    def _checked(self, columns: list[pa.Array] | None) -> pa.Table | None:
        """The chunk of every column parsed (:meth:`_read`), unless a row's cells together pass the limit: None."""
        if columns is None:
            return None
        if not len(columns[0]):
            return self._table([pa.nulls(0, pa.string())] * len(self._positions))
        if np.any(_value_bytes(columns) > self._max_row_bytes):
            return None
        return self._table([columns[i] for i in self._positions])

    def _table(self, arrays: list[pa.Array]) -> pa.Table:
        """The next rows as a chunk, from the arrays of ``self._names`` (those kept)."""
        return chunk_table([(self._names[i], arrays[i]) for i in self._kept], self._rows)

    def _emit(self, table: pa.Table) -> Iterator[pa.Table]:
        """Add rows to the chunk being built; yield every chunk they complete."""
        if not table.num_rows:
            return
        self._pending.append(table)
        self._rows += table.num_rows
        while self._rows - self._done >= self._chunk_rows:
            rows = concat(self._pending)
            yield rows.slice(0, self._chunk_rows)
            self._done += self._chunk_rows
            self._pending = [rows.slice(self._chunk_rows)] if rows.num_rows > self._chunk_rows else []


def _ragged_columns(
    flat: list[str], ends: list[int], width: int, max_row_bytes: int
) -> tuple[list[list[str | None]], int | None]:
    """Columns of a batch whose rows have varying cell counts: short rows padded with nulls (absent
    cells), cells beyond the header dropped, empty lines skipped; and the first row with more cells
    than the header that is longer than the limit, if any."""
    rows: list[list[str | None]] = []
    long_row: int | None = None
    start = 0
    for end in ends:
        row = flat[start:end]
        start = end
        if not row:
            continue
        if len(row) > width:
            if long_row is None and sum(map(len, row)) > max_row_bytes:
                long_row = len(rows)
            del row[width:]
        cells: list[str | None] = list(row)
        cells.extend([None] * (width - len(cells)))
        rows.append(cells)
    columns = [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]
    return columns, long_row


def _value_bytes(arrays: list[pa.Array]) -> np.ndarray:
    """Per row, the UTF-8 bytes of its cells together (nulls count 0)."""
    total = np.zeros(len(arrays[0]), dtype=np.int64)
    for array in arrays:
        if array.null_count:
            total += pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False)
        else:  # the lengths are the differences of the offsets
            offsets = np.frombuffer(array.buffers()[1], np.int32, len(array) + 1, array.offset * 4)
            total += offsets[1:] - offsets[:-1]
    return total
