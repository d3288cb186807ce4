"""Debatching: validate a batch file's rows as they stream in and cut accepted rows into work items.

This part is synchronous CPU work (run it in a thread). Work items are yielded as soon as they are
cut, so they are rated while the rest of the file is still arriving. Whether the whole file can be
read is known only at its end: a :class:`~shared.errors.FileRefused` then refuses the batch, and
the controller leaves nothing of it counted, whatever was already sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shared.protocol import encode_table
from shared.rules.batchfile import read_chunks
from shared.rules.rating import RATED_COLUMNS
from shared.rules.reference import PriceBook, TaxTable
from shared.rules.schemas import REJECT_SCHEMA
from shared.rules.validation import TransactionIdSet, validate

#: Accepted rows go out grouped by the aggregate key (account, product, billing day) within windows of
#: the file, so that each work item covers few keys: fewer partial aggregates to rate, send and fold.
#: Measured on a sample 1M-row file: 911,000 partial rows in file order, 475,000 sorted by chunk of 50,000
#: rows, 194,000 grouped by window of 200,000. The first window is the first chunk, so rating starts as soon; each
#: next one is twice the last, up to ``WINDOW_ROWS`` (~20 MB of accepted rows held).
WINDOW_ROWS = 200_000


class Debatch:
    """Cuts one batch file into encoded work items of at most ``work_item_size`` transactions.

    The counts are final once :meth:`items` is exhausted.
    """

    def __init__(self, price_book: PriceBook, tax_table: TaxTable, *, work_item_size: int) -> None:
        self._price_book = price_book
        self._tax_table = tax_table
        self._work_item_size = work_item_size
        self._rejects: list[pa.Table] = []
        self.rows = self.accepted = self.work_items = 0

    @property
    def rejected(self) -> int:
        return sum(table.num_rows for table in self._rejects)

    @property
    def rejects(self) -> pa.Table:
        """Every rejected row so far (``REJECT_SCHEMA``)."""
        return pa.concat_tables(self._rejects).cast(REJECT_SCHEMA) if self._rejects else REJECT_SCHEMA.empty_table()

    def items(self, source: BinaryIO, fmt: str) -> Iterator[tuple[int, bytes]]:
        """Yield ``(transactions, encoded transactions)`` per work item, window after window of the file."""
        seen = TransactionIdSet()
        window: list[pa.Table] = []
        window_rows, limit = 0, 1
        for chunk in read_chunks(source, fmt):
            self.rows += chunk.num_rows
            good, bad = validate(chunk, self._price_book, self._tax_table, seen)
            if bad.num_rows:
                self._rejects.append(bad)
            self.accepted += good.num_rows
            window.append(good.select(RATED_COLUMNS))
            window_rows += good.num_rows
            if window_rows >= limit:
                yield from self._cut(window)
                window, window_rows, limit = [], 0, min(2 * window_rows, WINDOW_ROWS)
        if window_rows:
            yield from self._cut(window)

    def _cut(self, window: list[pa.Table]) -> Iterator[tuple[int, bytes]]:
        """The window's rows grouped by aggregate key as work items (the window emptied: its rows are
        held once or twice at a time, never three times)."""
        table = pa.concat_tables(window).combine_chunks()
        window.clear()
        table = table.take(_grouped(table))
        start = 0
        while start < table.num_rows:
            item = table.slice(start, self._work_item_size)
            start += item.num_rows
            self.work_items += 1
            yield item.num_rows, encode_table(item.combine_chunks())


def _grouped(table: pa.Table) -> np.ndarray:
    """An order of ``table``'s rows by account and product, each in order of first appearance (a
    sort of integers, several times faster than of the strings), then file order. Sorting each key's
    rows by time too saved 0.4 % of the partial aggregates (measured): not worth its CPU."""
    account, product = (pc.dictionary_encode(table.column(name).chunk(0)) for name in ("account_id", "product"))
    key = account.indices.to_numpy().astype(np.int64) * len(product.dictionary) + product.indices.to_numpy()
    order: np.ndarray = np.argsort(key, kind="stable")
    return order
