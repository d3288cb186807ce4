"""The processor's CPU work, run in worker processes: decode, rate and aggregate work items."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache

from shared.errors import InputError, PoisonMessage
from shared.messaging.envelope import Envelope
from shared.messaging.processes import pid_alive
from shared.protocol import WorkHeader, WorkItemResult, decode_work, results_envelope
from shared.rules.rating import aggregate
from shared.rules.reference import PriceBook, TaxTable, load_price_book, load_tax_table


def rating_pool(workers: int, *, owner_check: float = 1.0) -> ProcessPoolExecutor:
    """A pool of ``workers`` rating processes, started now (not when the first work item waits for
    them): forks of a fork server that imported this module once, each exiting with its owner."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=exit_with, initargs=(os.getpid(), owner_check))
    for _ in range(workers):
        pool.submit(_started)
    return pool


def _started() -> None:
    """A task that does nothing: submitted once per worker, it makes the pool start them all."""


def exit_with(owner: int, interval: float = 1.0) -> None:
    """Worker initializer: exit once the process that owns the pool is gone, even SIGKILLed (a
    killed owner cannot shut its pool down, and idle workers would otherwise wait forever)."""

    def watch() -> None:
        while True:
            time.sleep(interval)
            if not pid_alive(owner):
                os._exit(0)

    threading.Thread(target=watch, name="owner-watch", daemon=True).start()


@lru_cache(maxsize=16)
def _price_book(data: bytes) -> PriceBook:
    return load_price_book(data)


@lru_cache(maxsize=16)
def _tax_table(data: bytes) -> TaxTable:
    return load_tax_table(data)


def rate_work_items(
    items: list[tuple[WorkHeader, bytes]], references: dict[str, bytes], traces: list[dict[str, str]]
) -> tuple[Envelope | None, dict[int, str]]:
    """Rate a dequeued batch of work items into one coalesced results envelope.

    ``references`` maps content hashes to price book / tax table bytes; ``traces`` are the items'
    trace contexts (of their rating spans), by position, for their results to carry. Returns the
    envelope (None if nothing could be rated) and, by position, the items that are poison with why.
    """
    results: list[WorkItemResult] = []
    poisoned: dict[int, str] = {}
    for index, (header, encoded) in enumerate(items):
        try:
            transactions = decode_work(header, encoded)
            price_book = _price_book(references[header.pricebook_hash])
            tax_table = _tax_table(references[header.taxes_hash])
            partials = aggregate(transactions, price_book, tax_table)
        except (InputError, KeyError) as exc:
            poisoned[index] = str(exc) if isinstance(exc, PoisonMessage) else f"unratable: {exc}"
            continue
        results.append(WorkItemResult(header.work_item_id, header.batch_id, header.rows, partials, traces[index]))
    return (results_envelope(results) if results else None), poisoned
