"""The processor's CPU work, run in worker processes: decode, validate, rate and aggregate work items."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from shared.errors import InputError, PoisonMessage
from shared.messages import WorkHeader, WorkItemResult
from shared.messaging.envelope import Envelope
from shared.rules.batchfile import raw_texts
from shared.rules.duplicates import id_hashes
from shared.rules.rating import aggregate, itemise
from shared.rules.reference import PriceBook, TaxTable, load_price_book, load_tax_table
from shared.rules.schemas import HELD_SCHEMA
from shared.rules.validation import validate
from shared.rules.versions import Rates, Version
from shared.wire import decode_work, results_envelope

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


#: Reference data parsed in this worker process, by content hash, and the batches' versions loaded, by versions:
#: each is parsed once per process, not per work item.
_BOOKS: dict[str, PriceBook] = {}
_TABLES: dict[str, TaxTable] = {}
_RATES: dict[tuple[Version, ...], Rates] = {}
#: Entries each cache keeps at most (dropped oldest first).
_CACHED = 32


def rates_of(versions: tuple[Version, ...], references: Mapping[str, bytes]) -> Rates:
    """``versions`` loaded from ``references`` (content hash -> bytes), each price book and tax table parsed once per
    process; ``KeyError`` for one not in ``references``."""
    rates = _RATES.get(versions)
    if rates is None:
        loaded = [
            (
                v.effective_from,
                _parsed(_BOOKS, v.pricebook_hash, references, load_price_book),
                _parsed(_TABLES, v.taxes_hash, references, load_tax_table),
            )
            for v in versions
        ]
        rates = _remember(_RATES, versions, Rates.of(loaded))
    return rates


def _parsed(cache: dict[str, T], digest: str, references: Mapping[str, bytes], load: Callable[[bytes], T]) -> T:
    found = cache.get(digest)
    return _remember(cache, digest, load(references[digest])) if found is None else found


def _remember(cache: dict[K, T], key: K, value: T) -> T:
    if len(cache) >= _CACHED:
        del cache[next(iter(cache))]
    cache[key] = value
    return value


def rate_work_items(
    items: list[tuple[WorkHeader, bytes, bytes]], references: dict[str, bytes], traces: list[dict[str, str]]
) -> tuple[Envelope | None, dict[int, str]]:
    """Read, validate and rate a dequeued batch of work items into one coalesced results envelope.

    ``items`` are each work item's header, payload and bytes of its part of the inbox blob (if it names
    one); ``references`` maps content hashes to price book / tax table bytes; ``traces`` are the items'
    trace contexts (of their rating spans), by position, for their results to carry. Returns the
    envelope (None if nothing could be rated) and, by position, the items that are poison with why.
    """
    results: list[WorkItemResult] = []
    poisoned: dict[int, str] = {}
    for index, (header, encoded, text) in enumerate(items):
        try:
            rows = decode_work(header, encoded, text)
            result = rate_rows(header, rows, rates_of(header.dated(), references))
        except (InputError, KeyError) as exc:
            poisoned[index] = str(exc) if isinstance(exc, PoisonMessage) else f"unratable: {exc}"
            continue
        results.append(dataclasses.replace(result, trace=traces[index]))
    return (results_envelope(results) if results else None), poisoned


def rate_rows(header: WorkHeader, rows: pa.Table, rates: Rates) -> WorkItemResult:
    """A work item's rows validated and rated: the partial aggregates of the otherwise valid rows whose
    id is not a repeat (``repeat_of`` 0), the rejects, and the otherwise valid repeats rated one by one
    and held for the controller to tell duplicates (:mod:`shared.rules.duplicates`). A held row carries its id and
    the id's hash, a rejected first occurrence the hash of its id: what the controller checks in the ledger, and
    takes out of it."""
    valid, rejects = validate(rows, rates)
    repeats = rows.filter(pc.greater(rows.column("repeat_of"), 0))
    holding = pc.is_in(valid.column("row"), value_set=repeats.column("row"))
    counted, held = valid.filter(pc.invert(holding)), valid.filter(holding)
    of_held = repeats.filter(pc.is_in(repeats.column("row"), value_set=held.column("row")))  # valid's order
    held_ids = pc.utf8_trim_whitespace(of_held.column("transaction_id"))
    held_table = pa.Table.from_arrays(
        [
            of_held["row"],
            of_held["repeat_of"],
            raw_texts(of_held),
            held_ids,
            pa.array(id_hashes(held_ids)),
            *itemise(held, rates).columns,
        ],
        schema=HELD_SCHEMA,
    )
    partials = aggregate(counted, rates)
    return WorkItemResult(
        header.work_item_id,
        header.batch_id,
        counted.num_rows,
        partials,
        rejects.append_column("id_hash", _first_occurrence_hashes(rows, rejects.column("row"))),
        held_table,
        marked=header.marked,
    )


def _first_occurrence_hashes(rows: pa.Table, numbers: pa.Array | pa.ChunkedArray) -> pa.Array:
    """For rows ``numbers`` of ``rows``, the hash of the row's id where the row is its id's first occurrence
    (``repeat_of`` 0, or its own row) and the id is not empty (the ids the initiator recorded); null elsewhere."""
    of_rows = rows.take(pc.index_in(numbers, value_set=rows.column("row").combine_chunks()))
    ids = pc.fill_null(pc.utf8_trim_whitespace(of_rows.column("transaction_id")), "")
    repeat_of = of_rows.column("repeat_of")
    first = pc.and_(pc.or_(pc.equal(repeat_of, 0), pc.equal(repeat_of, of_rows.column("row"))), pc.not_equal(ids, ""))
    return pc.if_else(first, pa.array(id_hashes(ids)), pa.scalar(None, pa.int64()))
