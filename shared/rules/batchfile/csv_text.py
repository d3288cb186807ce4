"""A CSV byte stream as the CSV reader (:mod:`.csv_reader`) takes it: block by block, whole lines each, checked
to be UTF-8; and where in a block pyarrow may parse the records and where Python's ``csv`` module must, by the
quoting of the text (:func:`_quoting`)."""

from __future__ import annotations

import codecs
import io
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from .lines import line_blocks, line_count


class BadByte(Exception):
    """A byte that is not UTF-8, on a 1-based physical line of the file."""

    def __init__(self, byte: int, line: int) -> None:
        super().__init__(byte, line)
        self.byte = byte
        self.line = line


class CsvText:
    """A CSV byte stream block by block (whole lines each, checked to be UTF-8), and a position in the current
    block at the start of a record. Pyarrow reads the runs of records that it reads exactly as Python's csv module
    does (:func:`_quoting`); csv reads the records where it might not, and records that go on into the next block.

    A block that is not UTF-8 raises :class:`BadByte` naming the line of its first bad byte."""

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
            raise BadByte(data[exc.start], self._lines_before + line_count(data[: exc.start]) + 1) from None
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
