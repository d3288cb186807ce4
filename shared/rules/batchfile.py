"""Streaming readers for transaction batch files (``docs/billing-rules.md``, "Batch files").

:func:`read_chunks` turns a CSV, JSON Lines or Parquet file into Arrow tables (``CHUNK_SCHEMA``)
with memory bounded by ``chunk_rows`` and ``max_row_bytes``, never by the file size. Values are
text exactly as found (not stripped, not validated: :mod:`shared.rules.validation` does that); null means
the cell or key is absent. A file that cannot be read at all raises :class:`FileRefused` with a
one-line message; row-level problems are left for validation.

Format decisions:

* CSV: UTF-8 (optional BOM), header row required and its names stripped of surrounding
  whitespace; a required column missing, or any of ``RAW_COLUMNS`` named twice, refuses the file.
  Strictly empty lines are not rows; cells beyond the header are ignored; a short row's absent
  cells are null. Python's ``csv`` module in strict mode decides what malformed quoting is (a stray
  quote inside an unquoted field, ``a,b"c``, is accepted as a literal quote, as that module does);
  pyarrow parses every run of whole records where it gives exactly the same rows (quoted fields
  included: :func:`_quoting`), that module the rest. A file is refused for its first problem in file
  order (an invalid UTF-8 byte: naming its line).
* JSON Lines: there is no header, so an absent required key is just a missing field of that row.
  A JSON number keeps its literal text (``1.50`` stays ``"1.50"``, ``1e3`` stays ``"1e3"``). A
  boolean, array, object or non-standard constant (``NaN``) is present but invalid: it is stored as
  :data:`INVALID_SENTINEL` followed by its JSON text, which no field rule accepts.
* Parquet: every column is cast to text (numbers and decimals to their text, time-zone aware
  timestamps to UTC ISO 8601 with ``Z``, naive ones without offset); a required column missing, or a
  column whose type has no text form, refuses the file.

A row's raw text (for reject reports, :func:`raw_texts`; made only for the rows that need it) is a
compact JSON object of the original column -> text: every header column of a CSV row (absent cells
left out), the original line of a JSON Lines row, the ``RAW_COLUMNS`` present in a Parquet file.
Errors of the underlying stream itself (``OSError``) propagate unchanged: they are transient, not a
property of the file.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import io
import itertools
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..errors import FileRefused

if TYPE_CHECKING:
    import _csv

FORMATS = ("csv", "jsonl", "parquet")
RAW_COLUMNS = ("transaction_id", "account_id", "timestamp", "product", "quantity", "region")
REQUIRED_COLUMNS = RAW_COLUMNS[:5]
#: A chunk's first columns: the fields as text, then the 1-based data row number.
CHUNK_SCHEMA = pa.schema([(name, pa.string()) for name in RAW_COLUMNS] + [("row", pa.int64())])
#: Schema metadata of a chunk whose raw text is made from its columns: ``[[JSON name, column], ...]``.
_RAW_KEY = b"billing.raw"
#: Prefix of a JSON Lines value that is present but of a type no field accepts (boolean, array...).
INVALID_SENTINEL = "\x00"

_EXTENSIONS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
_CSV_BATCH_ROWS = 8192  # records csv reads at a time
_CSV_PARSE = pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=True)
_CSV_CONVERT = {"null_values": [], "strings_can_be_null": False, "check_utf8": False}  # decoded already


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
    if fmt not in FORMATS:
        raise ValueError(f"unknown batch format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if chunk_rows < 1:
        raise ValueError("chunk_rows must be positive")
    if fmt == "csv":
        return _CsvReader(
            source, chunk_rows, max_row_bytes, csv_fast, csv_block_bytes, rows_before, lines_before, ids_only
        ).chunks()
    if fmt == "jsonl":
        return _read_jsonl(source, chunk_rows, max_row_bytes, rows_before, lines_before)
    if rows_before or lines_before:
        raise ValueError("a Parquet file is read whole")
    return _read_parquet(source, chunk_rows)


# --- CSV -------------------------------------------------------------------------------------------


class _BadByte(Exception):
    """A byte that is not UTF-8, on a 1-based physical line of the file."""

    def __init__(self, byte: int, line: int) -> None:
        super().__init__(byte, line)
        self.byte = byte
        self.line = line


class _CsvReader:
    """The data rows of one CSV file as chunks: runs of whole records parsed by pyarrow (C++) where that gives
    exactly what Python's csv module gives, the rest by that module, with the same rows, raw text and refusals
    either way; ``fast=False``: the csv module alone."""

    def __init__(
        self,
        source: BinaryIO,
        chunk_rows: int,
        max_row_bytes: int,
        fast: bool,
        block_bytes: int,
        rows_before: int = 0,
        lines_before: int = 0,
        ids_only: bool = False,
    ) -> None:
        if csv.field_size_limit() < max_row_bytes:
            csv.field_size_limit(max_row_bytes)
        self._text = _CsvText(source, block_bytes, lines_before)
        self._chunk_rows = chunk_rows
        self._max_row_bytes = max_row_bytes
        self._fast = fast
        self._names: list[str] = []  # each header name once, in order
        self._positions: list[int] = []  # the column of each name's first occurrence
        self._ids_only = ids_only
        self._kept: list[int] = []  # the names (their index) the chunks hold
        self._width = 0
        self._rows = rows_before  # data rows read
        self._done = rows_before  # data rows yielded
        self._pending: list[pa.Table] = []  # rows read, not yet yielded

    def chunks(self) -> Iterator[pa.Table]:
        try:
            yield from self._chunks()
        except _BadByte as exc:
            raise FileRefused(
                f"not UTF-8: invalid byte 0x{exc.byte:02x} after data row {self._done} (near line {exc.line})"
            ) from None

    def _chunks(self) -> Iterator[pa.Table]:
        self._text.next_block()
        reader = csv.reader(self._text.lines(), strict=True)
        try:
            header = next((cells for cells in reader if cells), None)
        except csv.Error as exc:
            raise self._malformed(exc, reader.line_num) from None
        if header is None:
            raise FileRefused("CSV has no header row")
        names = [name.strip() for name in header]
        _check_columns(names, "CSV header")
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
            yield _concat(self._pending)

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
            flat: list[str] = []
            ends: list[int] = []
            try:
                ends.extend(map(len, map(flat.__iadd__, itertools.islice(reader, records))))
            except (csv.Error, _BadByte) as exc:
                self._batch(flat, ends)  # a row before the error may be too long: the first problem wins
                if isinstance(exc, _BadByte):
                    raise
                raise self._malformed(exc, line + reader.line_num) from None
            yield from self._emit(self._batch(flat, ends))
            if len(ends) < records:
                return

    def _malformed(self, exc: csv.Error, line: int) -> FileRefused:
        if "field larger than field limit" in str(exc):
            return FileRefused(f"CSV line {line}: a row is longer than the limit of {self._max_row_bytes} bytes")
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
        """The rows of a run of whole records that pyarrow reads as csv does (:func:`_quoting`); None unless they
        are exactly what csv would read without error: every row as wide as the header (or empty) and no row's
        cells longer than the limit together."""
        if data.startswith(codecs.BOM_UTF8):  # pyarrow would drop it; an empty line first keeps it
            data = b"\n" + data
        if self._ids_only:  # the columns kept alone, where no record's bytes together can pass the limit
            kept = self._read(data, [self._positions[index] for index in self._kept])
            if kept is None or self._text.longest_record() > self._max_row_bytes:
                return None if kept is None else self._checked(self._read(data))
            return _table(list(zip([self._names[i] for i in self._kept], kept, strict=True)), self._rows)
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
        return _table([(self._names[i], arrays[i]) for i in self._kept], self._rows)

    def _emit(self, table: pa.Table) -> Iterator[pa.Table]:
        """Add rows to the chunk being built; yield every chunk they complete."""
        if not table.num_rows:
            return
        self._pending.append(table)
        self._rows += table.num_rows
        while self._rows - self._done >= self._chunk_rows:
            rows = _concat(self._pending)
            yield rows.slice(0, self._chunk_rows)
            self._done += self._chunk_rows
            self._pending = [rows.slice(self._chunk_rows)] if rows.num_rows > self._chunk_rows else []


class _CsvText:
    """A CSV byte stream block by block (whole lines each, checked to be UTF-8), and a position in the current
    block at the start of a record. Pyarrow reads the runs of records that it reads exactly as Python's csv module
    does (:func:`_quoting`); csv reads the records where it might not, and records that go on into the next block.

    A block that is not UTF-8 raises :class:`_BadByte` naming the line of its first bad byte."""

    def __init__(self, source: BinaryIO, block_bytes: int, lines_before: int = 0) -> None:
        self._blocks = line_blocks(source, block_bytes)
        self._first = True
        self._data = b""  # the current block
        self._bytes = np.empty(0, np.uint8)  # the same, as an array
        self._pos = 0  # in ``_data``, at the start of a record
        self._stop = -1  # in ``_data``: what csv reads past before pyarrow goes on
        self._lines_before = lines_before  # lines before the current block
        self._lines_after = lines_before  # lines before the next one
        self._piece = io.StringIO()  # what :meth:`lines` reads from, decoded from ``_data``
        self._piece_text = ""
        self._piece_at = 0  # where ``_piece`` starts in ``_data``
        self._piece_bytes = max(1, block_bytes // 16)  # bytes handed to csv at a time
        self._quotes = _Quotes(self._bytes)  # of the last run, from its start
        self._run_start = 0

    def next_block(self) -> bool:
        """Move to the start of the next block; False at the end of the stream."""
        data = next(self._blocks, None)
        if data is None:
            return False
        if self._first:
            data, self._first = data.removeprefix(codecs.BOM_UTF8), False
        self._lines_before = self._lines_after
        try:
            data.decode()
        except UnicodeDecodeError as exc:
            raise _BadByte(data[exc.start], self._lines_before + line_count(data[: exc.start]) + 1) from None
        self._data, self._bytes, self._pos, self._stop = data, np.frombuffer(data, np.uint8), 0, -1
        self._lines_after += line_count(data)
        return True

    def lines(self) -> Iterator[str]:
        """Lines from the position on, block after block, as csv reads them (newlines kept; ``\\n``,
        ``\\r\\n`` or ``\\r``); :meth:`sync` to where a reader of them stopped."""
        self._piece, self._piece_text, self._piece_at = io.StringIO(), "", self._pos
        return self._lines()

    def _lines(self) -> Iterator[str]:
        while True:
            while self._pos < len(self._data):
                end = self._data.find(b"\n", self._pos + self._piece_bytes) + 1 or len(self._data)
                self._piece_text, self._piece_at = self._data[self._pos : end].decode(), self._pos
                self._piece = io.StringIO(self._piece_text, newline="")
                yield from self._piece
                self._pos = end
            if not self.next_block():
                return

    def sync(self) -> None:
        """Move the position to where the reader of :meth:`lines` stopped (the end of a record)."""
        self._pos = self._piece_at + len(self._piece_text[: self._piece.tell()].encode())

    def line(self) -> int:
        """Lines before the position."""
        return self._lines_before + line_count(self._data[: self._pos])

    def fast_run(self) -> bytes | None:
        """The whole records from the position on that pyarrow reads as csv does (moving past them); b"" where
        csv must read the record at the position (:meth:`csv_quota`), None at the end of the stream."""
        if self._pos == len(self._data) and not self.next_block():
            return None
        start = self._pos
        self._quotes = _Quotes(self._bytes, start)
        self._stop, self._pos = _quoting(self._data, self._quotes, start)
        self._run_start = start
        return self._data[start : self._pos]

    def longest_record(self) -> int:
        """The bytes of the longest record of the last run :meth:`fast_run` gave (its line ends counted: more than
        its cells hold together)."""
        start, end = self._run_start, self._pos
        breaks = np.flatnonzero(self._bytes[start:end] == _LF) + start
        ends = breaks[~self._quotes.quoted(breaks)]
        return int(np.diff(ends, prepend=start - 1, append=end - 1).max(initial=0))

    def csv_quota(self) -> int:
        """For a csv reader of :meth:`lines` at the end of a record: 0 once it has read past what pyarrow could
        not read (pyarrow goes on from there), else the lines up to that place (at least 1)."""
        self.sync()
        if self._pos > self._stop:
            return 0
        return self._data.count(b"\n", self._pos, self._stop) + 1


_QUOTE, _COMMA, _LF, _CR = b'"'[0], b","[0], b"\n"[0], b"\r"[0]


def _quoting(data: bytes, quotes: _Quotes, start: int) -> tuple[int, int]:
    """For a block of whole lines from ``start``, the start of a record (``quotes``: its quoting from there): where
    csv must read instead of pyarrow, and the end of the last record before that place (``start`` if none).

    The two read a quoted field alike but for what follows its closing quote: pyarrow reads on, csv in strict mode
    refuses anything but a comma or a line end. So csv reads from the first such closing quote, and from a quoted
    field still open at the block's end (its record goes on in the next block); where neither is, the place is the
    block's end."""
    if not len(quotes.starts):
        return len(data), len(data)
    refused = np.flatnonzero(quotes.refused)
    if not len(refused) and not quotes.inside[-1]:
        return len(data), len(data)
    stop = int(quotes.starts[refused[0]]) if len(refused) else len(data)
    end = stop
    while (end := max(data.rfind(b"\n", start, end), data.rfind(b"\r", start, end))) >= 0:
        run = int(np.searchsorted(quotes.starts, end)) - 1  # the last run before this line end
        if run < 0 or not quotes.inside[run]:
            return (stop if len(refused) else end + 1), end + 1
        end = int(quotes.starts[np.flatnonzero(~quotes.was_inside[: run + 1])[-1]])  # the run that opened the field
    return (stop if len(refused) else start), start


class _Quotes:
    """The quoting of CSV text (``array`` its bytes) from ``start``, the start of a record, run of quotes by run of
    quotes: a run at a field's start opens a field (and closes it again when even), a run elsewhere outside a quoted
    field is literal text, and in a quoted field the quotes of a run pair up as escaped quotes and an odd last one
    closes it. ``starts`` of each run, whether the text after it is ``inside`` a quoted field (``was_inside`` before
    it), and which runs close a field with what csv in strict mode ``refused`` after it (not a comma, not a line
    end)."""

    def __init__(self, array: np.ndarray, start: int = 0) -> None:
        quotes = np.flatnonzero(array[start:] == _QUOTE) + start
        breaks = np.flatnonzero(np.diff(quotes) != 1) + 1
        self.starts = quotes[np.r_[0, breaks]] if len(quotes) else quotes
        ends = quotes[np.r_[breaks - 1, len(quotes) - 1]] + 1 if len(quotes) else quotes
        before_run = np.where(self.starts > start, array[np.maximum(self.starts - 1, 0)], _LF)
        after_run = np.where(ends < len(array), array[np.minimum(ends, len(array) - 1)], _LF)
        field_start = (before_run == _COMMA) | (before_run == _LF) | (before_run == _CR)
        odd = ((ends - self.starts) & 1).astype(bool)
        # Each run maps the state (in a quoted field or not) by one of three functions: negation (an odd run at a
        # field's start), back to outside (an odd run inside a field), or none (an even run).
        negations = np.cumsum(odd & field_start)
        back = np.maximum.accumulate(np.where(odd & ~field_start, np.arange(len(self.starts)), -1))
        self.inside = ((negations - np.where(back >= 0, negations[np.maximum(back, 0)], 0)) & 1).astype(bool)
        self.was_inside = np.r_[False, self.inside[:-1]]
        closing = np.where(self.was_inside, odd, field_start & ~odd)
        self.refused = closing & (after_run != _COMMA) & (after_run != _LF) & (after_run != _CR)

    def quoted(self, positions: np.ndarray) -> np.ndarray:
        """Whether each of ``positions`` (none of them a quote) lies inside a quoted field."""
        run = np.searchsorted(self.starts, positions) - 1
        return (run >= 0) & self.inside[np.maximum(run, 0)] if len(self.starts) else np.zeros(len(positions), bool)


def line_blocks(source: BinaryIO, block_bytes: int) -> Iterator[bytes]:
    """The stream in blocks of about ``block_bytes`` ending at a ``\\n`` (a longer line: a longer block)."""
    parts: list[bytes | memoryview] = []  # of a block, up to the last read
    while data := source.read(block_bytes):
        cut = data.rfind(b"\n") + 1
        if not cut:
            parts.append(data)
            continue
        parts.append(memoryview(data)[:cut] if parts else data[:cut])
        block = b"".join(parts)
        parts = [data[cut:]] if cut < len(data) else []
        del data  # not kept while the block is parsed
        yield block
        del block
    if parts:
        yield b"".join(parts)


def line_count(text: bytes) -> int:
    """Physical lines ended in ``text``, as csv counts them (``\\n``, ``\\r\\n`` or ``\\r``)."""
    lines = text.count(b"\n")
    return lines + text.count(b"\r") - text.count(b"\r\n") if b"\r" in text else lines


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


# --- JSON Lines ------------------------------------------------------------------------------------


def _read_jsonl(
    source: BinaryIO, chunk_rows: int, max_row_bytes: int, rows_before: int, lines_before: int
) -> Iterator[pa.Table]:
    columns: dict[str, list[str | None]] = {name: [] for name in RAW_COLUMNS}
    raws: list[str] = []
    done = rows_before
    line_no = lines_before
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
    return _table(arrays, done, pa.array(raws, pa.string()))


# --- Parquet ---------------------------------------------------------------------------------------


def _read_parquet(source: BinaryIO, chunk_rows: int) -> Iterator[pa.Table]:
    spool: BinaryIO | None = None
    with contextlib.ExitStack() as stack:
        if not source.seekable():  # Parquet needs random access (its footer comes last)
            spool = stack.enter_context(tempfile.TemporaryFile())
            shutil.copyfileobj(source, spool)
            spool.seek(0)
        try:
            parquet = pq.ParquetFile(spool or source)
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise FileRefused(f"not a readable Parquet file: {_one_line(exc)}") from None
        names = parquet.schema_arrow.names
        _check_columns(names, "Parquet schema")
        present = [name for name in RAW_COLUMNS if name in names]
        for name in present:
            kind = parquet.schema_arrow.field(name).type
            if not _textual(kind):
                raise FileRefused(f"Parquet column {name!r} has type {kind}, which has no text form")
        done = 0
        try:
            for batch in parquet.iter_batches(batch_size=chunk_rows, columns=present):
                yield _table([(name, _as_text(batch.column(name))) for name in present], done)
                done += batch.num_rows
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise FileRefused(f"Parquet file unreadable after data row {done}: {_one_line(exc)}") from None


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


# --- shared helpers --------------------------------------------------------------------------------


def _check_columns(names: Sequence[str], where: str) -> None:
    """Refuse a file whose columns lack a required one or repeat one of ``RAW_COLUMNS``."""
    missing = [name for name in REQUIRED_COLUMNS if name not in names]
    if missing:
        raise FileRefused(f"{where} lacks required column(s): {', '.join(missing)}")
    repeated = [name for name in RAW_COLUMNS if names.count(name) > 1]
    if repeated:
        raise FileRefused(f"{where} repeats column(s): {', '.join(repeated)}")


def _table(arrays: Sequence[tuple[str, pa.Array]], done: int, raw: pa.Array | None = None) -> pa.Table:
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


def _concat(tables: list[pa.Table]) -> pa.Table:
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


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__
