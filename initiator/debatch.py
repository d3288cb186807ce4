"""Debatching: stream a batch file, validate every row, cut accepted rows into work items.

This part is synchronous CPU work (run it in a thread). Encoded work items go to a spool file so
that nothing is enqueued before the whole file has been read: a file that turns out unreadable
half-way is refused whole.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa

from shared.protocol import encode_table
from shared.rules.batchfile import read_chunks
from shared.rules.reference import PriceBook, TaxTable
from shared.rules.schemas import REJECT_SCHEMA
from shared.rules.validation import TransactionIdSet, validate

_RECORD = struct.Struct("<II")  # rows, payload size


@dataclass(frozen=True)
class DebatchOutcome:
    rows: int
    accepted: int
    work_items: int
    rejects: pa.Table

    @property
    def rejected(self) -> int:
        return self.rejects.num_rows


def debatch(
    path: Path,
    fmt: str,
    price_book: PriceBook,
    tax_table: TaxTable,
    *,
    work_item_size: int,
    spool: BinaryIO,
) -> DebatchOutcome:
    """Validate ``path`` and write its work items, encoded, to ``spool``."""
    seen = TransactionIdSet()
    pending: list[pa.Table] = []
    pending_rows = rows = accepted = work_items = 0
    rejects: list[pa.Table] = []

    def flush(size: int) -> None:
        nonlocal pending, pending_rows, work_items
        table = pa.concat_tables(pending).combine_chunks()
        item, rest = table.slice(0, size), table.slice(size)
        payload = encode_table(item)
        spool.write(_RECORD.pack(item.num_rows, len(payload)))
        spool.write(payload)
        work_items += 1
        pending, pending_rows = ([rest] if rest.num_rows else []), rest.num_rows

    with path.open("rb") as source:
        for chunk in read_chunks(source, fmt):
            rows += chunk.num_rows
            good, bad = validate(chunk, price_book, tax_table, seen)
            if bad.num_rows:
                rejects.append(bad)
            if good.num_rows:
                accepted += good.num_rows
                pending.append(good)
                pending_rows += good.num_rows
                while pending_rows >= work_item_size:
                    flush(work_item_size)
    if pending_rows:
        flush(pending_rows)
    all_rejects = pa.concat_tables(rejects).cast(REJECT_SCHEMA) if rejects else REJECT_SCHEMA.empty_table()
    return DebatchOutcome(rows=rows, accepted=accepted, work_items=work_items, rejects=all_rejects)


def read_spool(spool: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """The work items :func:`debatch` wrote, in order: (rows, encoded transactions)."""
    while header := spool.read(_RECORD.size):
        rows, size = _RECORD.unpack(header)
        yield rows, spool.read(size)
