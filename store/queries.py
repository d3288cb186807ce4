"""Queries across batches, shared by ``billing report``, the HTTP API and the console.

One function, :func:`totals`, groups the stored aggregates by any of :data:`DIMENSIONS` (always by currency
too: money of two currencies is never added) under :class:`Filters`; :class:`~store.Store` names its common uses
(aggregates, invoices per billing period, daily totals) and :func:`top` ranks accounts or products by net.

- **SQL groups and sums**, on SQLite and PostgreSQL alike. PostgreSQL sums ``NUMERIC`` exactly; SQLite keeps
  money as decimal text, which its own ``SUM`` would turn into REAL, so there an exact aggregate
  (``exact_sum``, Python ``Decimal``) is registered on the connection. Money comes back as Python ints in
  minor units, quantity as an exact ``Decimal``; nothing is ever a float.
- **Which batches count**: by default every ``complete`` batch; batches named in :attr:`Filters.batches`
  count whatever their state (a ``failed`` one with what it counted so far); a voided batch never counts
  (:mod:`store.ledger.numbers`), nor does one still running: its aggregates are written when it settles
  (:mod:`store.partials`). Each row names the batches it sums (``batches``) and each :class:`Result` lists the
  batches it includes and those it left out: those with matching rows (failed, voided) and those still running,
  with their state.
- Rows come in key order (byte order of the text, as Python sorts) so that ``limit``/``offset`` page stably.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal, localcontext
from typing import Any, Literal

import sqlalchemy as sa

from .batches import BatchState
from .schema import EXACT, aggregates, batches, rejects, work_items

Dimension = Literal["batch_id", "account_id", "product", "billing_day", "billing_period", "currency"]
DIMENSIONS: tuple[Dimension, ...] = ("batch_id", "account_id", "product", "billing_day", "billing_period", "currency")
MONEY_COLUMNS = ("net", "tax", "total")
MEASURES = ("transactions", "quantity", *MONEY_COLUMNS)
#: Invoices: one per (account, billing period, currency).
INVOICE_KEY: tuple[Dimension, ...] = ("account_id", "billing_period")
#: Aggregates as stored, summed over batches: per (account, product, billing day, currency).
AGGREGATE_KEY: tuple[Dimension, ...] = ("account_id", "product", "billing_day")

#: What :class:`BatchRef` says of a voided batch (it counts nowhere, whatever its state).
VOIDED = "voided"
#: Batches a report leaves out even when named: voided, or still running.
_UNCOUNTED = (VOIDED, BatchState.processing.value)

#: ``YYYY-MM``, year 0001 to 9999 (no look-ahead: JSON Schema and pydantic patterns use it too).
PERIOD_PATTERN = r"^([0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})-(0[1-9]|1[0-2])$"


@dataclass(frozen=True)
class Filters:
    """What to count. Empty tuples mean "any"; ``start``/``end`` are billing days, both inclusive (``start`` after
    ``end`` is refused); ``period`` (``YYYY-MM``) narrows the days to that month."""

    accounts: tuple[str, ...] = ()
    products: tuple[str, ...] = ()
    currencies: tuple[str, ...] = ()
    batches: tuple[str, ...] = ()
    start: date | None = None
    end: date | None = None
    period: str | None = None

    def __post_init__(self) -> None:
        if self.period is not None and not re.fullmatch(PERIOD_PATTERN, self.period):
            raise ValueError(f"billing period {self.period!r} is not YYYY-MM")
        if self.start is not None and self.end is not None and self.start > self.end:
            raise ValueError(f"the range is reversed: from {self.start} is after to {self.end}")

    @property
    def days(self) -> tuple[date | None, date | None]:
        """The first and last billing day counted (None: unbounded)."""
        start, end = self.start, self.end
        if self.period is not None:
            year, month = int(self.period[:4]), int(self.period[5:])
            first, last = date(year, month, 1), date(year, month, calendar.monthrange(year, month)[1])
            start = first if start is None else max(start, first)
            end = last if end is None else min(end, last)
        return start, end


@dataclass(frozen=True, order=True)
class BatchRef:
    """A batch and its state when the query ran (a :class:`BatchState` value, or ``unknown``)."""

    batch_id: str
    state: str


@dataclass(frozen=True)
class Result:
    """Rows (the group key, ``currency``, the measures, ``batches``), and which batches they include."""

    key: tuple[str, ...]
    rows: list[dict[str, Any]]
    batches: list[BatchRef]
    excluded: list[BatchRef] = field(default_factory=list)


def totals(
    engine: sa.Engine,
    by: Sequence[Dimension],
    filters: Filters | None = None,
    *,
    limit: int | None = None,
    offset: int = 0,
) -> Result:
    """The aggregates matching ``filters`` summed per ``by`` (and currency), in key order."""
    unknown = set(by) - set(DIMENSIONS)
    if unknown:
        raise ValueError(f"unknown dimensions {sorted(unknown)}; choose among {DIMENSIONS}")
    key: tuple[Dimension, ...] = (*dict.fromkeys(d for d in by if d != "currency"), "currency")
    filters = filters or Filters()
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            _register_exact_sum(conn)
        columns = [_dimension(d, sqlite).label(d) for d in key]
        query = (
            sa.select(*columns, *_measures(sqlite), _batch_list(sqlite).label("batches"))
            .select_from(aggregates.join(batches, aggregates.c.batch_id == batches.c.batch_id))
            .where(*_conditions(filters, sqlite))
            .group_by(*columns)
            .order_by(*(_ordered(c, sqlite) for c in columns))
            .offset(offset)
        )
        if limit is not None:
            query = query.limit(limit)
        rows = [_row(r._mapping, key) for r in conn.execute(query)]
        included = sorted({batch_id for row in rows for batch_id in row["batches"]})
        states = _states(conn, included) if filters.batches else dict.fromkeys(included, BatchState.complete.value)
        excluded = _excluded(conn, filters, sqlite)
        if filters.batches:  # those named leave out only the voided and the running
            named = set(filters.batches)
            excluded = [ref for ref in excluded if ref.state in _UNCOUNTED and ref.batch_id in named]
    return Result(key, rows, [BatchRef(b, states.get(b, "unknown")) for b in included], excluded)


def top(engine: sa.Engine, dimension: Dimension, filters: Filters | None = None, *, limit: int = 10) -> Result:
    """The ``limit`` accounts (or products, ...) with the largest net, in each currency, largest first."""
    found = totals(engine, (dimension,), filters)
    ranked: list[dict[str, Any]] = []
    for currency in sorted({row["currency"] for row in found.rows}):
        mine = [row for row in found.rows if row["currency"] == currency]
        ranked.extend(sorted(mine, key=lambda row: (-row["net"], row[dimension]))[:limit])
    kept = {batch_id for row in ranked for batch_id in row["batches"]}
    return Result(found.key, ranked, [b for b in found.batches if b.batch_id in kept], found.excluded)


def rejects_by_reason(engine: sa.Engine, batch_id: str) -> dict[str, int]:
    """How many rows of the batch were rejected, per reason code (most frequent first)."""
    query = (
        sa.select(rejects.c.reason, sa.func.count().label("count"))
        .where(rejects.c.batch_id == batch_id)
        .group_by(rejects.c.reason)
    )
    with engine.connect() as conn:
        found = [(r.reason, int(r._mapping["count"])) for r in conn.execute(query)]
    return dict(sorted(found, key=lambda item: (-item[1], item[0])))


def rejected_rows(
    engine: sa.Engine, batch_id: str, *, limit: int | None = None, offset: int = 0
) -> list[dict[str, Any]]:
    """The batch's rejected rows by row number (``row``, ``reason``, ``raw``: the row as JSON text)."""
    query = (
        sa.select(rejects.c.row, rejects.c.reason, rejects.c.raw)
        .where(rejects.c.batch_id == batch_id)
        .order_by(rejects.c.row)
        .limit(limit)
        .offset(offset)
    )
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def poisoned_items(engine: sa.Engine, batch_id: str) -> list[dict[str, Any]]:
    """The batch's work items that went to a poison queue and were not replayed since, with the reason."""
    query = (
        sa.select(work_items.c.work_item_id, work_items.c.poison_reason, work_items.c.recorded_at)
        .where(work_items.c.batch_id == batch_id, work_items.c.poison_reason.is_not(None))
        .order_by(work_items.c.work_item_id)
    )
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def _dimension(name: Dimension, sqlite: bool) -> sa.ColumnElement[Any]:
    if name != "billing_period":
        return aggregates.c[name]
    if sqlite:  # ISO text: the period is its first seven characters
        return sa.func.substr(aggregates.c.billing_day, 1, 7)
    return sa.func.to_char(aggregates.c.billing_day, "YYYY-MM")


def _ordered(column: sa.ColumnElement[Any], sqlite: bool) -> sa.ColumnElement[Any]:
    """Order by code point (SQLite's BINARY; PostgreSQL's ``C`` collation), as Python sorts text."""
    if sqlite or isinstance(column.type, sa.Date):
        return column
    return sa.collate(column, "C")


def _measures(sqlite: bool) -> list[sa.ColumnElement[Any]]:
    summed: list[sa.ColumnElement[Any]] = [sa.func.sum(aggregates.c.transactions).label("transactions")]
    for name in ("quantity", *MONEY_COLUMNS):
        column = aggregates.c[name]
        function = sa.func.exact_sum(column, type_=column.type) if sqlite else sa.func.sum(column, type_=column.type)
        summed.append(function.label(name))
    return summed


def _batch_list(sqlite: bool) -> sa.ColumnElement[str]:
    """The distinct batch ids of a group, comma-separated (batch ids have no comma)."""
    distinct = sa.distinct(aggregates.c.batch_id)
    if sqlite:
        return sa.func.group_concat(distinct, type_=sa.Text)
    return sa.func.string_agg(distinct, sa.literal_column("','"), type_=sa.Text)


def _conditions(filters: Filters, sqlite: bool, *, complete: bool = True) -> list[sa.ColumnElement[bool]]:
    t = aggregates
    found: list[sa.ColumnElement[bool]] = []
    for column, values in (
        (t.c.account_id, filters.accounts),
        (t.c.product, filters.products),
        (t.c.currency, filters.currencies),
        (t.c.batch_id, filters.batches),
    ):
        if values:
            found.append(column.in_(sorted(set(values))))
    start, end = filters.days
    if start is not None:
        found.append(t.c.billing_day >= start)
    if end is not None:
        found.append(t.c.billing_day <= end)
    if complete:
        found.append(batches.c.voided_at.is_(None))  # a voided batch counts nowhere (store.ledger.numbers)
        if not filters.batches:
            found.append(batches.c.state == BatchState.complete.value)
    return found


def _excluded(conn: sa.Connection, filters: Filters, sqlite: bool) -> list[BatchRef]:
    """Batches not complete, or voided, that have rows matching ``filters`` (a voided one's state: ``voided``), and
    those still running (their rows not written yet)."""
    matching = sa.exists().where(
        aggregates.c.batch_id == batches.c.batch_id, *_conditions(filters, sqlite, complete=False)
    )
    left_out = sa.or_(batches.c.state != BatchState.complete.value, batches.c.voided_at.is_not(None))
    running = batches.c.state == BatchState.processing.value
    query = sa.select(batches.c.batch_id, batches.c.state, batches.c.voided_at).where(
        sa.or_(sa.and_(left_out, matching), running)
    )
    return sorted(BatchRef(r.batch_id, VOIDED if r.voided_at else r.state) for r in conn.execute(query))


def _states(conn: sa.Connection, batch_ids: list[str]) -> dict[str, str]:
    if not batch_ids:
        return {}
    query = sa.select(batches.c.batch_id, batches.c.state).where(batches.c.batch_id.in_(batch_ids))
    return {r.batch_id: r.state for r in conn.execute(query)}


def _row(mapping: sa.RowMapping, key: tuple[Dimension, ...]) -> dict[str, Any]:
    row: dict[str, Any] = {name: mapping[name] for name in key}
    row["transactions"] = int(mapping["transactions"])
    row["quantity"] = Decimal(mapping["quantity"])
    row.update({name: int(mapping[name]) for name in MONEY_COLUMNS})
    row["batches"] = sorted(mapping["batches"].split(","))
    return row


class _ExactSum:
    """SQLite aggregate ``exact_sum(text)``: the exact decimal sum, as canonical text (never REAL)."""

    def __init__(self) -> None:
        self.total = Decimal(0)

    def step(self, value: str | int | None) -> None:
        if value is not None:
            with localcontext(EXACT):
                self.total += Decimal(value)

    def finalize(self) -> str:
        return format(self.total, "f")


def _register_exact_sum(conn: sa.Connection) -> None:
    conn.connection.driver_connection.create_aggregate("exact_sum", 1, _ExactSum)  # type: ignore[union-attr]
