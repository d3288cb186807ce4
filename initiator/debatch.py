"""Debatching: cut a batch file into work items as it streams in, doing only what needs the whole batch.

That is reading the file (a file that cannot be read is refused whole) and telling, in one pass over the
transaction ids, which rows repeat an earlier row's id (:class:`~shared.rules.duplicates.FirstOccurrences`)
and which first occurrences may repeat an id of an earlier batch (the ledger's
:class:`~shared.rules.bloom.IdFilter`): those are marked as repeats of themselves, so that the processors
hold them for the controller's exact check. The batch's ids (each first occurrence's row and id, and their
hashes) are kept for the controller (in parts as they are cut, the rest with the manifest) and for the filter.
Validation and rating are the processors', so that they scale out with them. A text file's work item is a
run of whole frames of its inbox blob (:class:`~shared.inbox.Part`), which the processor reads itself:
nothing of its rows goes through the initiator's messages but the repeated ids. A Parquet file's work items
carry their rows as read.

This part is synchronous CPU work (run it in a thread). Work items are yielded as soon as they are cut, so
they are rated while the rest of the file is still arriving. Whether the whole file can be read is known only
at its end: a :class:`~shared.errors.FileRefused` then refuses the batch, and the controller leaves nothing
of it counted, whatever was already sent.
"""

from __future__ import annotations

import codecs
import csv
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shared import inbox
from shared.errors import FileRefused
from shared.inbox import Frame, Part
from shared.messages import REPEATS_SCHEMA
from shared.rules.batchfile import UNCLOSED_QUOTE, line_count, read_chunks
from shared.rules.bloom import IdFilter
from shared.rules.duplicates import FirstOccurrences
from shared.rules.schemas import IDS_SCHEMA
from shared.tables import encode_table

#: What a CSV reader says of a part that ends inside a record (a quoted line break across frames), or
#: before the header record ends: with more of the file to come, the part goes on with the next frame.
_UNFINISHED = (UNCLOSED_QUOTE, "CSV has no header row")


@dataclass(frozen=True)
class Cut:
    """A work item: its rows, its part of the inbox blob (None: the rows are in the payload), its payload."""

    rows: int
    part: Part | None
    payload: bytes


class Debatch:
    """Cuts one batch file into work items of at least ``work_item_size`` rows (text: whole frames; the last
    ones smaller) or at most that many (Parquet), first occurrences that ``id_filter`` may hold marked. The counts
    and :meth:`ids` are final once the items are exhausted."""

    def __init__(self, *, work_item_size: int, id_filter: IdFilter | None = None) -> None:
        self._work_item_size = work_item_size
        self._first = FirstOccurrences()
        self._id_filter = id_filter
        self._ids: list[pa.Table] = []
        self._hashes: list[np.ndarray] = []
        self.rows = self.work_items = 0

    def ids(self) -> pa.Table:
        """Each first occurrence's row and transaction id (``IDS_SCHEMA``), in file order: those not taken as a
        part (:meth:`take_ids`)."""
        return pa.concat_tables(self._ids) if self._ids else IDS_SCHEMA.empty_table()

    def take_ids(self, at_least: int) -> pa.Table | None:
        """The ids cut since the last part taken (as :meth:`ids`), once there are ``at_least``; else None."""
        if sum(table.num_rows for table in self._ids) < at_least:
            return None
        part, self._ids = self.ids(), []
        return part

    def hashes(self) -> np.ndarray:
        """The 64-bit hashes of :meth:`ids` (what the ledger's filter is given)."""
        return np.concatenate(self._hashes) if self._hashes else np.empty(0, np.uint64)

    def parts(self, blob: str, fmt: str, frames: Sequence[Frame], stream: BinaryIO) -> Iterator[Cut]:
        """Work items of a text file from its blob's ``frames``, read from ``stream`` (the blob from its start).

        Frames are read in parts that end where a record ends: a frame after which a quoted line break or
        the header goes on (or that does not end a line) is read together with the next one. A part reads
        as that part of the whole file would (:func:`~shared.rules.batchfile.read_chunks`), a CSV part
        after the first with the file's header lines put before it. The last frames, as many as a full item
        takes, go out in items of a quarter of the size, so that the batch's last rows are rated side by side."""
        head = b""  # a CSV file's lines up to its header's end
        lines = 0  # physical lines of the file before the frames still pending
        item: _Item | None = None
        pending: list[tuple[Frame, bytes]] = []
        full = 0  # frames of the first full item
        if not frames:
            self._read(b"", fmt, b"", 0)  # an empty file: refused as a whole read refuses it
        for number, (frame, data) in enumerate(inbox.read_frames(stream, frames), start=1):
            pending.append((frame, data))
            last = number == len(frames)
            if not (data.endswith(b"\n") or last):
                continue
            text = b"".join(data for _, data in pending)
            start = head if lines else b""  # the file's first part holds its header
            try:
                rows, repeats = self._read(text, fmt, start, lines)
            except FileRefused as exc:
                if not last and fmt == "csv" and any(reason in str(exc) for reason in _UNFINISHED):
                    continue  # more of the record (or header) is in the next frame
                raise
            if fmt == "csv" and not lines:
                head = _csv_head(text)
            item = item or _Item(start, self.rows, lines - line_count(start))
            item.add([frame for frame, _ in pending], rows, repeats)
            self.rows += rows
            lines += line_count(text)
            pending = []
            tail = len(frames) - number < full  # within the last frames: items of a quarter
            if item.rows >= self._work_item_size // (4 if tail else 1) or last:
                full = full or len(item.frames)
                if item.rows:
                    yield self._cut(blob, fmt, item)
                item = None

    def _read(self, text: bytes, fmt: str, head: bytes, lines: int) -> tuple[int, list[pa.Table]]:
        """Read a part (``head`` put before it, ``lines`` of the file before it): its rows, and those that
        repeat an id (``REPEATS_SCHEMA``). The ids are remembered only once the whole part is read."""
        chunks = list(
            read_chunks(
                io.BytesIO(head + text),
                fmt,
                rows_before=self.rows,
                lines_before=lines - line_count(head),
                ids_only=True,  # the ids are all it needs of each row
            )
        )
        repeats = []
        for chunk in chunks:
            repeat_of = self._repeat_of(chunk)
            hit = repeat_of > 0
            if hit.any():
                rows = chunk.column("row").to_numpy()[hit]
                repeats.append(pa.table([pa.array(rows), pa.array(repeat_of[hit])], schema=REPEATS_SCHEMA))
        return sum(chunk.num_rows for chunk in chunks), repeats

    def _cut(self, blob: str, fmt: str, item: _Item) -> Cut:
        self.work_items += 1
        first, last = item.frames[0], item.frames[-1]
        part = Part(
            blob=blob,
            fmt=fmt,
            start=first.start,
            end=last.start + last.length,
            size=sum(frame.size for frame in item.frames),
            head=item.head.decode(),
            rows_before=item.rows_before,
            lines_before=item.lines_before,
        )
        repeats = pa.concat_tables(item.repeats) if item.repeats else REPEATS_SCHEMA.empty_table()
        return Cut(item.rows, part, encode_table(repeats))

    def tables(self, source: BinaryIO, fmt: str) -> Iterator[Cut]:
        """Work items that carry their rows as read, ``repeat_of`` added (a Parquet file's, or every file's
        when work items carry their rows in the message)."""
        for chunk in read_chunks(source, fmt, chunk_rows=self._work_item_size):
            self.rows += chunk.num_rows
            self.work_items += 1
            table = chunk.append_column("repeat_of", pa.array(self._repeat_of(chunk)))
            yield Cut(chunk.num_rows, None, encode_table(table))

    def _repeat_of(self, chunk: pa.Table) -> np.ndarray:
        """Each row's first occurrence (0 for a first occurrence; its own row for one the ledger may hold)."""
        ids = pc.utf8_trim_whitespace(chunk.column("transaction_id").combine_chunks())
        rows = chunk.column("row").to_numpy()
        every_hash = np.zeros(len(ids), np.uint64)
        repeat_of = self._first.repeat_of(ids, rows, hashes=every_hash)
        present = pc.fill_null(pc.greater(pc.binary_length(ids), 0), False).to_numpy(zero_copy_only=False)
        first = np.flatnonzero((repeat_of == 0) & present)
        self._ids.append(pa.table([pa.array(rows[first]), ids.take(pa.array(first))], schema=IDS_SCHEMA))
        hashes = every_hash[first]
        self._hashes.append(hashes)
        if self._id_filter is not None:
            held = first[self._id_filter.might_contain(hashes)]
            repeat_of[held] = rows[held]
        return repeat_of


@dataclass
class _Item:
    """A text work item being cut: what its part starts with, the rows and lines before it (those of
    ``head`` left out), its frames, rows and repeated rows so far."""

    head: bytes
    rows_before: int
    lines_before: int
    frames: list[Frame] = field(default_factory=list)
    rows: int = 0
    repeats: list[pa.Table] = field(default_factory=list)

    def add(self, frames: list[Frame], rows: int, repeats: list[pa.Table]) -> None:
        self.frames += frames
        self.rows += rows
        self.repeats += repeats


def _csv_head(text: bytes) -> bytes:
    """A CSV file's lines up to the end of its header record, from the start of the file (its BOM left out)."""
    body = text.removeprefix(codecs.BOM_UTF8)
    reader = csv.reader(io.StringIO(body.decode(), newline=""), strict=True)
    next(cells for cells in reader if cells)
    return b"".join(body.splitlines(keepends=True)[: reader.line_num])
