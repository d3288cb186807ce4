"""Debatching: cut a batch file's rows, as read, into work items as they stream in.

Only what needs the whole batch is done here: reading the file (a file that cannot be read is refused
whole) and telling, in one pass over the transaction ids, which rows repeat an earlier row's id
(:class:`~shared.rules.duplicates.FirstOccurrences`). Validation and rating are the processors', so they
scale out with them. This part is synchronous CPU work (run it in a thread). Work items are yielded as
soon as they are cut, so they are rated while the rest of the file is still arriving. Whether the whole
file can be read is known only at its end: a :class:`~shared.errors.FileRefused` then refuses the batch,
and the controller leaves nothing of it counted, whatever was already sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shared.protocol import encode_table
from shared.rules.batchfile import read_chunks
from shared.rules.duplicates import FirstOccurrences

#: Rows go out grouped by account and product within windows of the file, so that each work item covers
#: few aggregate keys: fewer partial aggregates to rate, send and fold. Measured on a sample 1M-row file:
#: 911,000 partial rows in file order, 475,000 sorted by chunk of 50,000 rows, 194,000 grouped by window
#: of 200,000. The first window is the first chunk, so rating starts as soon; each next one is twice the
#: last, up to ``WINDOW_ROWS`` (~30 MB of rows as read held).
WINDOW_ROWS = 200_000


class Debatch:
    """Cuts one batch file into encoded work items of at most ``work_item_size`` rows.

    A work item holds its rows as read (:func:`~shared.rules.batchfile.read_chunks`' columns, raw text
    included) and ``repeat_of``: the row of the id's first occurrence where the row repeats an id, else 0.
    The counts are final once :meth:`items` is exhausted.
    """

    def __init__(self, *, work_item_size: int) -> None:
        self._work_item_size = work_item_size
        self.rows = self.work_items = 0

    def items(self, source: BinaryIO, fmt: str) -> Iterator[tuple[int, bytes]]:
        """Yield ``(rows, encoded rows)`` per work item, window after window of the file."""
        first = FirstOccurrences()
        window: list[pa.Table] = []
        window_rows, limit = 0, 1
        for chunk in read_chunks(source, fmt):
            self.rows += chunk.num_rows
            ids = pc.utf8_trim_whitespace(chunk.column("transaction_id").combine_chunks())
            repeat_of = first.repeat_of(ids, chunk.column("row").to_numpy())
            window.append(chunk.append_column("repeat_of", pa.array(repeat_of)))
            window_rows += chunk.num_rows
            if window_rows >= limit:
                yield from self._cut(window)
                window, window_rows, limit = [], 0, min(2 * window_rows, WINDOW_ROWS)
        if window_rows:
            yield from self._cut(window)

    def _cut(self, window: list[pa.Table]) -> Iterator[tuple[int, bytes]]:
        """The window's rows grouped by account and product as work items (the window emptied: its rows
        are held once or twice at a time, never three times)."""
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
    """An order of ``table``'s rows by account and product as read, each in order of first appearance (a
    sort of integers, several times faster than of the strings), then file order."""
    account, product = (
        pc.dictionary_encode(table.column(name).chunk(0), null_encoding="encode") for name in ("account_id", "product")
    )
    key = account.indices.to_numpy().astype(np.int64) * len(product.dictionary) + product.indices.to_numpy()
    order: np.ndarray = np.argsort(key, kind="stable")
    return order
