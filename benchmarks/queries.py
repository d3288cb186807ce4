"""The cross-batch query benchmark: one account's invoices for one billing period over N aggregate rows.

Fills an empty PostgreSQL database (``--sql-url``; the store migrates it) with ``--rows`` aggregate rows in SQL
(``generate_series``): ``--accounts`` accounts, one complete batch per billing day of a year, a few products,
USD and JPY. Then times ``store.queries.invoices`` for one account and one month, ``--repeat`` times over
different accounts, and keeps the query plan of one of them. The target is 100 ms at 10,000,000 rows.

    python -m benchmarks.queries --sql-url postgresql+psycopg://user@host/db --rows 10000000 --output q.json
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import click
import sqlalchemy as sa

from store import Filters, Store

DAYS = 365
_CHUNK = 1_000_000
#: Row i: account i % A; then day and product from i // A (unique keys; one batch per billing day).
_FILL = """
INSERT INTO aggregates (batch_id, account_id, product, billing_day, pricebook, currency,
                        transactions, quantity, net, tax, total)
SELECT 'bench-' || lpad((i / :accounts % :days)::text, 3, '0'),
       'acct-' || lpad((i % :accounts)::text, 6, '0'),
       'product-' || (i / :accounts / :days)::text,
       DATE '2026-01-01' + (i / :accounts % :days)::int,
       'bench',
       CASE WHEN (i / :accounts / :days) % 3 = 2 THEN 'JPY' ELSE 'USD' END,
       1 + i % 7, (i % 1000) / 8.0, n, n / 5, n + n / 5
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS i,
     LATERAL (SELECT ((i * 7919) % 1000003)::numeric AS n) AS money
"""
_BATCHES = """
INSERT INTO batches (batch_id, source, state, rows, accepted, rejected, work_items, completed_items, poisoned_items,
                     transactions_recorded, updated_at)
SELECT 'bench-' || lpad(d::text, 3, '0'), 'bench', 'complete', 0, 0, 0, 0, 0, 0, 0, now()
FROM generate_series(0, CAST(:days AS integer) - 1) AS d
"""


def fill(store: Store, *, rows: int, accounts: int, echo: Any = print) -> None:
    """Write ``rows`` aggregate rows and their batches into the (empty) store, then ANALYZE."""
    if store.dialect != "postgresql":
        raise click.UsageError("the query benchmark runs on PostgreSQL (give --sql-url postgresql+psycopg://...)")
    if rows > accounts * DAYS * 1000:
        raise click.UsageError("too many rows for that many accounts (at most 1,000 products)")
    with store.engine.begin() as conn:
        conn.execute(sa.text(_BATCHES), {"days": DAYS})
    for first in range(0, rows, _CHUNK):
        last = min(first + _CHUNK, rows) - 1
        with store.engine.begin() as conn:
            conn.execute(sa.text(_FILL), {"accounts": accounts, "days": DAYS, "first": first, "last": last})
        echo(f"  {last + 1:,} / {rows:,} rows")
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("VACUUM ANALYZE"))


def measure(store: Store, *, accounts: int, repeat: int, period: str = "2026-03") -> dict[str, Any]:
    """Time one account's period invoices ``repeat`` times (a different account each time)."""
    timings, found = [], 0
    step = max(1, accounts // max(repeat, 1))
    for n in range(repeat):
        filters = Filters(accounts=(f"acct-{(n * step) % accounts:06d}",), period=period)
        started = time.perf_counter()
        result = store.invoices(filters)
        timings.append((time.perf_counter() - started) * 1000)
        found += len(result.rows)
    with store.engine.connect() as conn:
        sample = Filters(accounts=("acct-000000",), period=period)
        query = sa.text(
            "EXPLAIN (ANALYZE, BUFFERS) SELECT to_char(billing_day, 'YYYY-MM'), currency, sum(net), sum(tax), "
            "sum(total), string_agg(DISTINCT a.batch_id, ',') FROM aggregates a JOIN batches b USING (batch_id) "
            "WHERE account_id = :account AND billing_day BETWEEN :start AND :end AND b.state = 'complete' "
            "GROUP BY 1, 2"
        )
        start, end = sample.days
        plan = [row[0] for row in conn.execute(query, {"account": sample.accounts[0], "start": start, "end": end})]
    return {
        "median_ms": round(statistics.median(timings), 2),
        "p95_ms": round(sorted(timings)[max(0, int(len(timings) * 0.95) - 1)], 2),
        "max_ms": round(max(timings), 2),
        "invoice_rows_per_query": found / max(repeat, 1),
        "plan": plan,
    }


@click.command()
@click.option("--sql-url", required=True, help="An empty PostgreSQL database (postgresql+psycopg://...).")
@click.option("--rows", type=click.IntRange(1), default=10_000_000, show_default=True)
@click.option("--accounts", type=click.IntRange(1), default=10_000, show_default=True)
@click.option("--repeat", type=click.IntRange(1), default=50, show_default=True)
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("bench-queries.json"))
def main(sql_url: str, rows: int, accounts: int, repeat: int, output: Path) -> None:
    """Fill, then time one account's invoices for a billing period."""
    with Store(sql_url) as store:
        started = time.perf_counter()
        fill(store, rows=rows, accounts=accounts, echo=click.echo)
        filled = time.perf_counter() - started
        result = {
            "rows": rows,
            "accounts": accounts,
            "fill_seconds": round(filled, 1),
            **measure(store, accounts=accounts, repeat=repeat),
        }
    output.write_text(json.dumps(result, indent=2) + "\n")
    click.echo(
        f"{rows:,} rows: one account's period invoices in {result['median_ms']} ms median, "
        f"{result['p95_ms']} ms p95 ({repeat} accounts); written to {output}"
    )


if __name__ == "__main__":
    main()
