"""What completing a batch reads of the ledger's ids, on SQLite and PostgreSQL: the plan of every statement its
transaction runs against ``ledger_ids`` (captured as it runs, then explained in a transaction set up as the
store's), with a ledger analysed while empty and then loaded in bulk (PostgreSQL, taking it for a few rows, would
read it whole). None reads the table whole: an id is probed by hash in each segment, a batch's ids are read from
its segment."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from benchmarks.ledger import InProcess, ledger_filter, load_ledger
from shared.rules.bloom import IdFilter
from store import BatchState, Store
from store.engine import index_plans, writing
from support.ledger import csv_of, manifest_with, rows_of

#: Ids of the loaded ledger: 300 complete batches of 1,000.
LOADED, LOADED_BATCH = 300_000, 1_000


@contextmanager
def ledger_statements(store: Store) -> Iterator[list[tuple[str, Any]]]:
    """Every statement the store runs against ``ledger_ids`` while the block runs, with its parameters (the first
    set of an executemany)."""
    found: list[tuple[str, Any]] = []

    def seen(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, many: bool) -> None:
        if "ledger_ids" in statement and not statement.lstrip().upper().startswith("INSERT"):
            found.append((statement, parameters[0] if many else parameters))

    sa.event.listen(store.engine, "before_cursor_execute", seen)
    try:
        yield found
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", seen)


def plans(store: Store, statements: list[tuple[str, Any]]) -> list[str]:
    """The plan of each statement, one text each, explained as the store's own transactions plan it."""
    sqlite = store.dialect == "sqlite"
    explained = []
    with writing(store.engine) as conn:
        index_plans(conn)
        for statement, parameters in statements:
            rows = conn.exec_driver_sql(("EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN ") + statement, parameters)
            explained.append("\n".join(str(row[-1]) for row in rows))
        conn.rollback()
    return explained


def reads_whole(statement: str, plan: str) -> bool:
    """Whether a plan reads ``ledger_ids`` whole (PostgreSQL's sequential scan, SQLite's scan without an index), or a
    segment whole to find ids by hash (the hashes checked row by row, not probed: PostgreSQL's ``Filter``, SQLite's
    search by the segment alone)."""
    by_hash = "id_hash IN" in statement or "id_hash =" in statement
    return any(
        "Seq Scan on ledger_ids" in line
        or (line.strip().startswith("SCAN ledger_ids") and "INDEX" not in line)
        or (by_hash and ("Filter: (id_hash" in line or line.strip().endswith("USING PRIMARY KEY (segment=?)")))
        for line in plan.splitlines()
    )


def test_completing_batches_reads_no_ledger_whole_however_stale_its_statistics(store: Store) -> None:
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if store.dialect == "postgresql":  # statistics of an empty ledger, kept so: autovacuum would analyse it
            conn.exec_driver_sql("ALTER TABLE ledger_ids SET (autovacuum_enabled = false)")
        conn.exec_driver_sql("ANALYZE ledger_ids")
    load_ledger(store, LOADED, batch_rows=LOADED_BATCH)
    shared = InProcess(bits=1 << 22)
    shared.filter, shared.serial = ledger_filter(LOADED, 1 << 22, batch_rows=LOADED_BATCH)
    marked = IdFilter(shared.filter.bits, shared.filter.to_bytes())  # what both initiators read before either merged
    earlier = [f"ledger-{i}" for i in range(0, LOADED, 997)]  # billed by the batches loaded: held, found, taken
    one = shared.cut("one", csv_of(rows_of([f"s{i}" for i in range(300)] + earlier)), marked_with=marked)
    two = shared.cut("two", csv_of(rows_of([f"s{i}" for i in range(150, 450)], bad_every=7)), marked_with=marked)
    store.apply([one.manifest, manifest_with(two.manifest, filter_serial=one.manifest.filter_serial)], [])
    with ledger_statements(store) as statements:
        store.apply([], one.results + two.results)  # one completes; two, debatched at the same time, is refused
    states = {b: store.batch(b) for b in ("one", "two")}
    one_is, two_is = states["one"], states["two"]
    assert one_is is not None and (one_is.state, one_is.rejected) == (BatchState.complete, len(earlier))
    assert two_is is not None and two_is.state == BatchState.refused
    kinds = {statement.split()[0].upper() for statement, _ in statements}
    assert {"SELECT", "DELETE"} <= kinds and len(statements) >= 4, statements
    explained = plans(store, statements)
    whole = [f"{s}\n{plan}" for (s, _), plan in zip(statements, explained, strict=True) if reads_whole(s, plan)]
    assert not whole, "\n\n".join(whole)
