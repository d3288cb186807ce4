"""The SQL store: records manifests and partial aggregates idempotently, and tracks batch progress.

Batch states: ``processing`` until every work item is accounted for; then ``complete`` (all recorded) or
``failed`` (at least one work item was poisoned; replaying it from the poison queue can still complete
the batch); ``refused`` when the initiator refused the file, even after some of its work items were
recorded: then nothing of it is counted. ``complete`` and ``refused`` never change. A batch whose work
items are all in has ``completed_at`` and ``latency_seconds`` (``completed_at - accepted_at``) set.

Concurrency: every write locks the affected batch rows first (``SELECT ... FOR UPDATE`` in batch id
order on PostgreSQL; ``BEGIN IMMEDIATE`` on SQLite, which serialises writers), so read-modify-write of
aggregates and counters never loses an update; the ``work_items`` primary key makes double counting
impossible even if that were bypassed.

On SQLite a store keeps the aggregates of the batches it folded lately in memory (:class:`_FoldCache`), so
that adding to them needs no read; each batch's ``fold_token`` tells whether they are still what is stored.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import localcontext
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from azure.core.credentials import TokenCredential
from sqlalchemy.dialects import postgresql, sqlite

from shared.errors import ConfigurationError, InfrastructureError
from shared.protocol import Manifest, PoisonNotice, WorkItemResult
from shared.rules.duplicates import keep_first
from shared.rules.schemas import PARTIAL_SCHEMA, REJECT_SCHEMA

from .schema import EXACT, aggregates, batches, held, rejects, work_items

MIGRATIONS = Path(__file__).with_name("migrations")
#: The newest migration's revision (a test checks it is Alembic's head): a store already there opens
#: without loading Alembic (0.25 CPU s of every `billing submit --wait` and role start).
SCHEMA_REVISION = "0007"
#: Azure Database for PostgreSQL server names; their Microsoft Entra login takes a token for this scope.
AZURE_POSTGRES = ".postgres.database.azure.com"
ENTRA_POSTGRES_SCOPE = "https://ossrdbms-aad.database.windows.net/.default"
#: States a batch rests in (only a replay of its poisoned items moves a ``failed`` batch on).
FINAL_STATES = frozenset({"complete", "failed", "refused"})

_MIGRATION_LOCK = 0x62696C6C  # PostgreSQL advisory lock key ("bill")
_IMMEDIATE = "billing_sqlite_immediate"
_CHUNK = 1000
_AGGREGATE_KEY = ("batch_id", "account_id", "product", "billing_day")
_AGGREGATE_VALUES = ("currency", "transactions", "quantity", "net", "tax", "total")
_SUMMED = _AGGREGATE_VALUES[1:]
#: How aggregate columns are held in Arrow while folding.
_ARROW_TYPES = {**{f.name: f.type for f in PARTIAL_SCHEMA}, "batch_id": pa.string(), "billing_day": pa.date32()}
#: A fold's table (see :func:`_fold`).
_FOLD_SCHEMA = pa.schema([(name, _ARROW_TYPES[name]) for name in _AGGREGATE_KEY + _AGGREGATE_VALUES])
#: Reads one batch's stored aggregates on SQLite, as a fold's columns.
_SQLITE_BATCH = f"SELECT {', '.join(_FOLD_SCHEMA.names)} FROM aggregates WHERE batch_id = ?"
#: At most this many aggregates (keys) cached per store: ~280 bytes each (measured on the 1,000,000-row bench batch:
#: the key's index entry ~140, its currency and sums ~80 in arrays that may have as much room again): at most ~85 MiB
#: with five batches of ~46,000 keys (what a 1,000,000-row sample batch has, and as many at 10,000,000 rows: the
#: key space, not the batch, sets the size), ~15 MiB for one, beside the controller's ~410 MiB peak RSS without it
#: (the target is 500 MiB at 10,000,000 rows).
_CACHED_ROWS = 250_000
#: States in which a batch's aggregates never change again: nothing to gain from caching them.
_SETTLED = frozenset({"complete", "refused"})
#: Sets a fold's sums on SQLite, binding the canonical decimal text Arrow wrote (no conversion per value).
_SQLITE_UPSERT = (
    f"INSERT INTO aggregates ({', '.join(_AGGREGATE_KEY + _AGGREGATE_VALUES)}) "
    f"VALUES ({', '.join('?' * len(_AGGREGATE_KEY + _AGGREGATE_VALUES))}) "
    f"ON CONFLICT ({', '.join(_AGGREGATE_KEY)}) DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in _SUMMED)
)
_PG_TYPES = {"billing_day": "date", "transactions": "bigint", **dict.fromkeys(_SUMMED[1:], "numeric")}
#: One PostgreSQL statement adds a whole fold (one array per column) to the stored sums.
_PG_UPSERT = sa.text(
    f"INSERT INTO aggregates ({', '.join(_AGGREGATE_KEY + _AGGREGATE_VALUES)}) SELECT * FROM unnest("
    + ", ".join(f"CAST(:{name} AS {_PG_TYPES.get(name, 'text')}[])" for name in _AGGREGATE_KEY + _AGGREGATE_VALUES)
    + f") ON CONFLICT ({', '.join(_AGGREGATE_KEY)}) DO UPDATE SET "
    + ", ".join(f"{name} = aggregates.{name} + excluded.{name}" for name in _SUMMED)
)

#: What a batch row holds before anything is known of the batch but its id.
_NEW_BATCH_ROW = dict(
    source="",
    state="processing",
    rows=0,
    accepted=0,
    rejected=0,
    work_items=None,
    completed_items=0,
    poisoned_items=0,
    transactions_recorded=0,
    requests=0,
)
#: The statements every apply runs, built once (SQLAlchemy then compiles each once, too).
_NEW_BATCH = {
    name: insert(batches).on_conflict_do_nothing(index_elements=["batch_id"])
    for name, insert in (("postgresql", postgresql.insert), ("sqlite", sqlite.insert))
}
_LOCK_BATCHES = (
    sa.select(batches)
    .where(batches.c.batch_id.in_(sa.bindparam("batch_ids", expanding=True)))
    .order_by(batches.c.batch_id)
    .with_for_update()
)
_UPDATE_BATCH = sa.update(batches).where(batches.c.batch_id == sa.bindparam("row_batch_id"))
_RECORDED = sa.select(work_items.c.work_item_id, work_items.c.poison_reason).where(
    work_items.c.work_item_id.in_(sa.bindparam("ids", expanding=True))
)


@dataclass(frozen=True)
class BatchStatus:
    """One batch's progress as stored."""

    batch_id: str
    source: str
    state: str
    rows: int
    accepted: int
    rejected: int
    work_items: int | None
    completed_items: int
    poisoned_items: int
    transactions_recorded: int
    pricebook_hash: str | None
    taxes_hash: str | None
    refused_reason: str | None
    accepted_at: datetime | None
    uploaded_at: datetime | None
    first_item_sent_at: datetime | None
    last_item_sent_at: datetime | None
    debatched_at: datetime | None
    completed_at: datetime | None
    latency_seconds: float | None
    requests: int
    updated_at: datetime
    claims_deleted_at: datetime | None

    @property
    def requests_per_1000(self) -> float | None:
        """Requests made for the batch per 1,000 accepted transactions (None before its manifest)."""
        return round(self.requests * 1000 / self.accepted, 3) if self.accepted else None

    def to_json_dict(self) -> dict[str, Any]:
        """JSON-safe values: ISO 8601 datetimes, latency as a float; with ``requests_per_1000``."""
        return {
            **{
                key: value.isoformat() if isinstance(value, datetime) else value
                for key, value in dataclasses.asdict(self).items()
            },
            "requests_per_1000": self.requests_per_1000,
        }


@dataclass(frozen=True)
class ApplyOutcome:
    """What one ``Store.apply`` call recorded."""

    new_items: int
    duplicate_items: int
    completed_batches: list[str] = field(default_factory=list)
    failed_batches: list[str] = field(default_factory=list)
    #: Seconds from accepted to complete of each completed batch (those with a manifest).
    latency_seconds: dict[str, float] = field(default_factory=dict)


#: What a batch row says of its aggregates: their fold token, and its completed work items.
_Stamp = tuple[str | None, int]
#: An aggregate's key within its batch (see :func:`_keys`).
_Key = str


class _Folded:
    """A batch's complete stored aggregates (SQLite), held so that adding to some of its keys costs what those
    keys cost, whatever the batch's size: each key's row, and the rows' currency and sums in arrays rewritten in
    place (a decimal as its 16 bytes: copied, never converted). Row 0 has no currency and zero sums: what a key
    not stored yet has."""

    def __init__(self, table: pa.Table) -> None:
        self._rows: dict[_Key, int] = dict(zip(_keys(table), range(1, table.num_rows + 1), strict=True))
        self._columns = {name: np.concatenate([_array(name, 1), _numpy(table[name])]) for name in _AGGREGATE_VALUES}

    def __len__(self) -> int:
        """How many aggregates (keys)."""
        return len(self._rows)

    def plus(self, added: pa.Table) -> _Summed:
        """``added`` (aggregates of the batch) plus what is stored for their keys, exactly: a row per key."""
        keys = _keys(added)
        if len(set(keys)) < len(keys):
            added = _fold(added)
            keys = _keys(added)
        rows = self._rows
        at = np.array([rows.get(key, 0) for key in keys], np.int64)
        stored = {name: _arrow(column[at], _ARROW_TYPES[name]) for name, column in self._columns.items()}
        return _Summed(_plus(added, stored), keys, at)

    def add(self, summed: _Summed) -> None:
        """Take what :meth:`plus` gave, and nothing changed since, as its keys' aggregates (the new keys get their
        rows here, in ``summed.rows`` too)."""
        rows, at = self._rows, summed.rows
        new = np.flatnonzero(at == 0)
        if len(new):
            start = len(rows) + 1
            rows.update(zip([summed.keys[i] for i in new], range(start, start + len(new)), strict=True))
            at[new] = np.arange(start, start + len(new))
        for name, column in self._columns.items():
            if len(rows) >= len(column):  # full: room for twice as many
                column = self._columns[name] = np.concatenate([column, _array(name, max(len(column), len(rows)))])
            column[at] = _numpy(summed.table[name])


@dataclass(frozen=True)
class _Summed:
    """What :meth:`_Folded.plus` made: the sums (a row per key), their keys, each key's row (0: none yet)."""

    table: pa.Table
    keys: list[_Key]
    rows: np.ndarray


def _array(name: str, length: int) -> np.ndarray:
    """Room for ``length`` values of aggregate column ``name`` as :class:`_Folded` holds them: no currency, zeros."""
    if name == "currency":
        return np.full(length, None, object)
    return np.zeros(length, "V16" if pa.types.is_decimal(_ARROW_TYPES[name]) else np.int64)


def _numpy(column: pa.ChunkedArray) -> np.ndarray:
    """A column without nulls as :class:`_Folded` holds it: decimals as their 16 bytes, text as objects."""
    array = column.combine_chunks()
    if pa.types.is_decimal(array.type):
        return np.frombuffer(array.buffers()[1], "V16", len(array), array.offset * 16)
    values: np.ndarray = array.to_numpy(zero_copy_only=False)
    return values


def _arrow(values: np.ndarray, kind: pa.DataType) -> pa.Array:
    """The Arrow column of ``kind`` that :func:`_numpy` made ``values`` from (a currency None is null)."""
    if pa.types.is_decimal(kind):
        return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])
    return pa.array(values, kind)


#: What an apply wrote of one batch's aggregates (SQLite): the batch's stored aggregates it added to, the sums.
_Written = tuple[_Folded, _Summed]


class _FoldCache:
    """The complete stored aggregates of the batches a store added to lately (SQLite), so that adding to them
    again needs no read: at most :data:`_CACHED_ROWS` aggregates, the least recently used batch evicted first, a batch
    settled ``complete`` or ``refused`` dropped (nothing adds to it again).

    Why it is exact whatever else writes to the database: every write of a batch's aggregates, by any store,
    sets a fresh random ``fold_token`` on the batch's row in the same transaction, and an entry is kept only
    after its transaction committed, stamped with the row as written. ``Store.apply`` compares the stamp with
    the row while it holds the row locked (``BEGIN IMMEDIATE``): equal, nobody wrote the batch's aggregates
    since, and the entry is what is stored; different (another store's write, a refusal, an outcome unknown),
    the batch's aggregates are read once again. The stamp holds the row's completed work items too, which any
    writer counting a work item changes: a controller older than the token, still running beside, included.
    """

    def __init__(self, limit: int = _CACHED_ROWS) -> None:
        self._limit = limit
        self._entries: OrderedDict[str, tuple[_Stamp, _Folded]] = OrderedDict()
        self._rows = 0
        self._lock = threading.Lock()  # a store may be shared by threads

    def stored(self, conn: sa.Connection, batch_id: str, stamp: _Stamp) -> _Folded:
        """``batch_id``'s stored aggregates, its row (locked in ``conn``) stamped ``stamp``: cached or read."""
        with self._lock:
            entry = self._entries.get(batch_id)
            if entry is not None and entry[0] == stamp:
                self._entries.move_to_end(batch_id)
                return entry[1]
        return _Folded(_batch_aggregates(conn, batch_id))

    def committed(self, rows: Mapping[str, Mapping[str, Any]], merged: Mapping[str, _Written]) -> None:
        """Keep what a committed transaction wrote: ``rows`` (batch rows as written) and, per batch it added to,
        its stored aggregates as :meth:`stored` gave them with the sums it wrote.

        The given aggregates are added to in place: no other transaction holds them (one that began after this
        one committed finds this one's token on the row, not the entry's)."""
        with self._lock:
            for batch_id, row in rows.items():
                written = merged.get(batch_id)
                settled = row["state"] in _SETTLED
                if written is None and not settled:
                    continue  # its aggregates not written: an entry is still what is stored
                self._discard(batch_id)
                if written is not None and not settled:
                    folded, summed = written
                    folded.add(summed)
                    if len(folded) <= self._limit:
                        self._entries[batch_id] = (_stamp(row), folded)
                        self._rows += len(folded)
            while self._rows > self._limit:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._rows -= len(evicted)

    def drop(self, batch_ids: Iterable[str]) -> None:
        """Forget these batches."""
        with self._lock:
            for batch_id in batch_ids:
                self._discard(batch_id)

    def _discard(self, batch_id: str) -> None:
        entry = self._entries.pop(batch_id, None)
        if entry is not None:
            self._rows -= len(entry[1])


class Store:
    """The controller's SQL store (SQLite or PostgreSQL); migrates itself to the latest schema on open."""

    def __init__(self, url: str, *, migrate: bool = True, credential: TokenCredential | None = None) -> None:
        """Open the store at ``url``. PostgreSQL logs in with a Microsoft Entra token from
        ``credential`` when one is given, or from ``DefaultAzureCredential`` when the URL names an
        Azure Database for PostgreSQL server and no password (the keyless way on Azure)."""
        self.url = _normalise_url(url)
        if credential is None and _is_azure_postgres(self.url):
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential()
        self._engine = _create_engine(self.url, credential)
        self._folds = _FoldCache()  # stays empty on PostgreSQL: it adds to the stored sums in SQL
        if migrate:
            self.migrate()

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine (for reports)."""
        return self._engine

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._engine.dialect.name

    def migrate(self) -> None:
        """Upgrade the schema to Alembic ``head``; a no-op when current, safe when run by several processes."""
        if self.revision() == SCHEMA_REVISION:
            return
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.set_main_option("sqlalchemy.url", self.url.render_as_string(hide_password=False).replace("%", "%%"))
        with self._write() as conn:
            if self.dialect == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_MIGRATION_LOCK)))
            config.attributes["connection"] = conn
            command.upgrade(config, "head")

    def revision(self) -> str | None:
        """The schema revision the database is at (None before the first migration)."""
        try:
            with self._engine.connect() as conn:
                return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one_or_none()
        except sa.exc.ProgrammingError:  # PostgreSQL: no such table yet
            return None
        except sa.exc.OperationalError as exc:
            if "no such table" in str(exc):  # SQLite
                return None
            raise InfrastructureError(f"SQL store unavailable: {exc}") from exc

    def ping(self) -> None:
        """One round trip to the database (raises when it cannot be reached)."""
        with self._engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    def close(self) -> None:
        """Release every pooled connection."""
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- writes ---------------------------------------------------------------------------------------

    def apply(
        self,
        manifests: Sequence[Manifest],
        results: Sequence[WorkItemResult],
        poisoned: Sequence[PoisonNotice] = (),
        *,
        requests: Mapping[str, int] | None = None,
    ) -> ApplyOutcome:
        """Record manifests, work item results and poison notices in ONE transaction, idempotently,
        and add ``requests`` (batch id → requests made for it) to the batches' counts.

        A work item already recorded is skipped entirely; a manifest already recorded changes nothing.
        Results may precede their manifest: the batch then waits in ``processing`` with unknown size.
        A poisoned work item counts as accounted for (its batch ends ``failed``) until its result
        arrives after a replay: it is then recorded like any other and the batch can still complete.
        A work item's rejects are recorded with it, its ``accepted`` and ``rejected`` rows added to the batch's,
        its held rows (possible duplicates) kept aside until the batch completes: then the first of each
        repeated id is counted where its first occurrence was rejected, the others rejected as duplicates.
        A refused manifest deletes whatever of its batch was already counted (aggregates, rejects, held rows,
        the counts); later results of a refused batch are recorded but never counted.
        The partials of all new work items are added up in Arrow and written with one upsert statement.
        """
        first_manifests: dict[str, Manifest] = {}
        for manifest in manifests:
            first_manifests.setdefault(manifest.batch_id, manifest)
        first_results: dict[str, WorkItemResult] = {}
        for result in results:
            first_results.setdefault(result.work_item_id, result)
        notices = {n.work_item_id: n for n in reversed(poisoned) if n.work_item_id not in first_results}
        batch_ids = sorted(
            set(first_manifests) | {r.batch_id for r in first_results.values()} | {n.batch_id for n in notices.values()}
        )
        if not batch_ids:
            return ApplyOutcome(new_items=0, duplicate_items=0)

        now = datetime.now(UTC)
        try:
            with self._write() as conn:
                rows = self._lock_batches(conn, batch_ids, now)
                before = {batch_id: dict(row) for batch_id, row in rows.items()}
                for manifest in first_manifests.values():
                    if rows[manifest.batch_id]["work_items"] is None:
                        _fill_from_manifest(rows[manifest.batch_id], manifest)
                        if manifest.refused is not None:
                            _forget_counts(conn, rows[manifest.batch_id])

                recorded = _recorded_work_items(conn, [*first_results, *notices])
                new = [r for r in first_results.values() if r.work_item_id not in recorded]
                recovered = [r for r in first_results.values() if recorded.get(r.work_item_id) is not None]
                fresh_poison = [n for n in notices.values() if n.work_item_id not in recorded]
                records = [
                    {
                        "work_item_id": r.work_item_id,
                        "batch_id": r.batch_id,
                        "transactions": r.transactions,
                        "recorded_at": now,
                    }
                    for r in new
                ] + [
                    {
                        "work_item_id": n.work_item_id,
                        "batch_id": n.batch_id,
                        "transactions": 0,
                        "recorded_at": now,
                        "poison_reason": n.reason,
                    }
                    for n in fresh_poison
                ]
                for chunk in _chunks(records, _CHUNK):
                    conn.execute(sa.insert(work_items), [{"poison_reason": None, **record} for record in chunk])
                for result in recovered:
                    conn.execute(
                        sa.update(work_items)
                        .where(work_items.c.work_item_id == result.work_item_id)
                        .values(transactions=result.transactions, recorded_at=now, poison_reason=None)
                    )
                    rows[result.batch_id]["poisoned_items"] -= 1
                counted = [r for r in new + recovered if rows[r.batch_id]["refused_reason"] is None]
                for result in new + recovered:
                    rows[result.batch_id]["completed_items"] += 1
                for result in counted:
                    _count(rows[result.batch_id], result.transactions, result.rejects.num_rows)
                _insert_rejects(conn, [(r.batch_id, r.rejects) for r in counted])
                _insert_held(conn, [(r.batch_id, r.held) for r in counted])
                for notice in fresh_poison:
                    rows[notice.batch_id]["poisoned_items"] += 1
                for batch_id, count in (requests or {}).items():
                    rows[batch_id]["requests"] += count
                settling = {batch_id: state for batch_id, row in rows.items() if (state := _next_state(row))}
                kept = [(b, _resolve_held(conn, rows[b])) for b, state in settling.items() if state == "complete"]
                partials = _partials([(r.batch_id, r.partials) for r in counted] + kept)
                merged = self._merge_aggregates(conn, partials, rows, before)

                completed: list[str] = []
                failed: list[str] = []
                for batch_id, row in rows.items():
                    if batch_id in settling:
                        _settle(row, settling[batch_id], now)
                    if row != before[batch_id]:
                        _update_batch(conn, row, now)
                        if row["state"] != before[batch_id]["state"]:
                            {"complete": completed, "failed": failed}.get(row["state"], []).append(batch_id)
        except BaseException:
            self._folds.drop(batch_ids)  # rolled back, or committed maybe: read again
            raise
        self._folds.committed(rows, merged)
        return ApplyOutcome(
            new_items=len(new) + len(recovered),
            duplicate_items=len(results) - len(new) - len(recovered),
            completed_batches=completed,
            failed_batches=failed,
            latency_seconds={
                b: rows[b]["latency_seconds"] for b in completed if rows[b]["latency_seconds"] is not None
            },
        )

    def _merge_aggregates(
        self,
        conn: sa.Connection,
        partials: pa.Table,
        rows: Mapping[str, dict[str, Any]],
        before: Mapping[str, Mapping[str, Any]],
    ) -> dict[str, _Written]:
        """Add ``partials`` (of :func:`_partials`) into ``aggregates`` exactly, in one write, and give each batch
        added to a fresh fold token (in ``rows``). On PostgreSQL the partials are folded per key and added in SQL
        (``NUMERIC``); on SQLite (decimal text) in Arrow, to the stored aggregates of the keys they touch, from each
        batch's stored aggregates as they were (``before``), cached or read once: those and the sums written are
        returned."""
        if not partials.num_rows:
            return {}
        batch_ids = sorted(pc.unique(partials["batch_id"]).to_pylist())
        for batch_id in batch_ids:
            rows[batch_id]["fold_token"] = _fresh_token()
        if conn.dialect.name == "postgresql":
            folded = _fold(partials)
            conn.execute(_PG_UPSERT, {name: _sql_values(folded[name]) for name in folded.column_names})
            return {}
        merged = {}
        for batch_id in batch_ids:
            added = partials if len(batch_ids) == 1 else partials.filter(pc.equal(partials["batch_id"], batch_id))
            stored = self._folds.stored(conn, batch_id, _stamp(before[batch_id]))
            merged[batch_id] = (stored, stored.plus(added))
        touched = pa.concat_tables([summed.table for _, summed in merged.values()])
        values = zip(*map(_sql_values, touched.columns), strict=True)
        for chunk in _chunks(values, _CHUNK):  # a few rows at a time: no pile of young tuples
            conn.exec_driver_sql(_SQLITE_UPSERT, chunk)
        return merged

    def mark_claims_deleted(self, batch_id: str) -> None:
        """Record that ``batch_id``'s claim-check blobs are gone."""
        with self._write() as conn:
            update = sa.update(batches).where(batches.c.batch_id == batch_id)
            conn.execute(update.values(claims_deleted_at=datetime.now(UTC)))

    # -- reads ----------------------------------------------------------------------------------------

    def batch(self, batch_id: str) -> BatchStatus | None:
        """One batch's status, or None if nothing is known about it yet."""
        with self._engine.connect() as conn:
            row = conn.execute(sa.select(batches).where(batches.c.batch_id == batch_id)).mappings().first()
        return None if row is None else _status(row)

    def batches(self) -> list[BatchStatus]:
        """Every batch, oldest accepted first (batches still waiting for their manifest last)."""
        with self._engine.connect() as conn:
            found = [_status(row) for row in conn.execute(sa.select(batches)).mappings()]
        return sorted(found, key=lambda s: (s.accepted_at is None, s.accepted_at or s.updated_at, s.batch_id))

    def claims_to_delete(self, settled_before: datetime) -> list[str]:
        """Batches ``complete`` or ``refused`` (nothing will read their claim checks again) since
        before ``settled_before`` whose claim-check blobs are still there."""
        query = sa.select(batches.c.batch_id).where(
            batches.c.state.in_(("complete", "refused")),
            batches.c.updated_at < settled_before,
            batches.c.claims_deleted_at.is_(None),
        )
        with self._engine.connect() as conn:
            return list(conn.scalars(query.order_by(batches.c.updated_at)))

    # -- internals ------------------------------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[sa.Connection]:
        """A write transaction (``BEGIN IMMEDIATE`` on SQLite); connection failures become InfrastructureError."""
        try:
            with self._engine.connect() as conn:
                conn.execution_options(**{_IMMEDIATE: True})
                with conn.begin():
                    yield conn
        except sa.exc.OperationalError as exc:
            raise InfrastructureError(f"SQL store unavailable: {exc}") from exc

    def _lock_batches(self, conn: sa.Connection, batch_ids: list[str], now: datetime) -> dict[str, dict[str, Any]]:
        """Create missing batch rows (state ``processing``), then lock all of them in id order."""
        conn.execute(
            _NEW_BATCH[conn.dialect.name], [{**_NEW_BATCH_ROW, "batch_id": b, "updated_at": now} for b in batch_ids]
        )
        return {row["batch_id"]: dict(row) for row in conn.execute(_LOCK_BATCHES, {"batch_ids": batch_ids}).mappings()}


def _normalise_url(url: str) -> sa.URL:
    """Parse the URL; plain ``postgresql://`` means psycopg 3 (the driver this project installs)."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise ConfigurationError(f"invalid SQL URL: {exc}") from exc
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ConfigurationError(f"unsupported SQL backend {parsed.get_backend_name()!r} (sqlite or postgresql)")
    return parsed


def _is_azure_postgres(url: sa.URL) -> bool:
    """Whether ``url`` names an Azure Database for PostgreSQL server and no password."""
    return url.get_backend_name() == "postgresql" and url.password is None and (url.host or "").endswith(AZURE_POSTGRES)


def _create_engine(url: sa.URL, credential: TokenCredential | None = None) -> sa.Engine:
    """PostgreSQL with pre-ping (and, with ``credential``, an Entra token as each new connection's
    password); SQLite in WAL mode, 30 s busy timeout, transactions begun explicitly."""
    if url.get_backend_name() == "postgresql":
        engine = sa.create_engine(url, pool_pre_ping=True)
        if credential is not None:

            @sa.event.listens_for(engine, "do_connect")
            def _with_token(_dialect: Any, _record: Any, _args: Any, params: dict[str, Any]) -> None:
                params["password"] = credential.get_token(ENTRA_POSTGRES_SCOPE).token  # cached until near expiry

        return engine
    if url.database and url.database != ":memory:" and not url.database.startswith("file:"):
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # pysqlite must not BEGIN on its own; see _on_begin
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout = 30000")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_IMMEDIATE) else "BEGIN")

    return engine


T = TypeVar("T")


def _chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` as lists of at most ``size``, taken as they come (an iterator is never held whole)."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def _recorded_work_items(conn: sa.Connection, ids: list[str]) -> dict[str, str | None]:
    """Work item id → its poison reason (None when it was recorded normally), for those recorded."""
    found: dict[str, str | None] = {}
    for chunk in _chunks(ids, _CHUNK):
        found.update((row.work_item_id, row.poison_reason) for row in conn.execute(_RECORDED, {"ids": chunk}))
    return found


def _stamp(row: Mapping[str, Any]) -> _Stamp:
    return row["fold_token"], row["completed_items"]


def _fresh_token() -> str:
    return uuid.uuid4().hex


def _fill_from_manifest(row: dict[str, Any], manifest: Manifest) -> None:
    row.update(
        source=manifest.source,
        rows=manifest.rows,
        work_items=manifest.work_items,
        pricebook_hash=manifest.pricebook_hash,
        taxes_hash=manifest.taxes_hash,
        refused_reason=manifest.refused,
        accepted_at=manifest.accepted_at,
        uploaded_at=manifest.uploaded_at,
        first_item_sent_at=manifest.first_item_sent_at,
        last_item_sent_at=manifest.last_item_sent_at,
        debatched_at=manifest.debatched_at,
    )


def _count(row: dict[str, Any], accepted: int, rejected: int) -> None:
    """Add rows accepted (counted in the aggregates) and rejected to a batch's row."""
    row["accepted"] += accepted
    row["transactions_recorded"] += accepted
    row["rejected"] += rejected


def _forget_counts(conn: sa.Connection, row: dict[str, Any]) -> None:
    """A refused batch counts nothing: delete its aggregates (a fresh fold token), rejects and held rows, zero
    its counts."""
    for table in (aggregates, rejects, held):
        conn.execute(sa.delete(table).where(table.c.batch_id == row["batch_id"]))
    row.update(accepted=0, rejected=0, transactions_recorded=0, fold_token=_fresh_token())


def _insert_rejects(conn: sa.Connection, tables: Iterable[tuple[str, pa.Table]]) -> None:
    """Record rejected rows (``REJECT_SCHEMA`` tables, by batch)."""
    records = (
        {"batch_id": batch_id, **record} for batch_id, table in tables if table.num_rows for record in table.to_pylist()
    )
    for chunk in _chunks(records, 5000):
        conn.execute(sa.insert(rejects), chunk)


def _insert_held(conn: sa.Connection, tables: Iterable[tuple[str, pa.Table]]) -> None:
    """Keep held rows (``HELD_SCHEMA`` tables, by batch) until their batch completes."""
    records = (
        {"batch_id": batch_id, **record, "billing_day": date.fromisoformat(record["billing_day"])}
        for batch_id, table in tables
        if table.num_rows
        for record in table.to_pylist()
    )
    for chunk in _chunks(records, _CHUNK):
        conn.execute(sa.insert(held), chunk)


def _resolve_held(conn: sa.Connection, row: dict[str, Any]) -> pa.Table:
    """As a batch completes, every row of it validated: decide its held rows (:func:`keep_first`), reject the
    duplicates, count the rest; the partials of those counted (``PARTIAL_SCHEMA``) are returned."""
    batch_id = row["batch_id"]
    found = conn.execute(sa.select(held).where(held.c.batch_id == batch_id).order_by(held.c.row)).mappings().all()
    if not found:
        return PARTIAL_SCHEMA.empty_table()
    numbers = np.array([record["row"] for record in found], np.int64)
    repeat_of = np.array([record["repeat_of"] for record in found], np.int64)
    firsts = sorted(set(repeat_of.tolist()))
    query = sa.select(rejects.c.row).where(rejects.c.batch_id == batch_id)
    rejected = [
        number for chunk in _chunks(firsts, _CHUNK) for number in conn.scalars(query.where(rejects.c.row.in_(chunk)))
    ]
    kept = keep_first(numbers, repeat_of, np.array(rejected, np.int64))
    duplicates = [
        {"row": record["row"], "reason": "duplicate_transaction_id", "raw": record["raw"]}
        for record, keep in zip(found, kept, strict=True)
        if not keep
    ]
    _insert_rejects(conn, [(batch_id, pa.Table.from_pylist(duplicates, schema=REJECT_SCHEMA))])
    conn.execute(sa.delete(held).where(held.c.batch_id == batch_id))
    _count(row, int(kept.sum()), len(duplicates))
    counted = [
        {**{name: record[name] for name in PARTIAL_SCHEMA.names}, "billing_day": record["billing_day"].isoformat()}
        for record, keep in zip(found, kept, strict=True)
        if keep
    ]
    return pa.Table.from_pylist(counted, schema=PARTIAL_SCHEMA)


def _partials(tables: Sequence[tuple[str, pa.Table]]) -> pa.Table:
    """Partial aggregates (``PARTIAL_SCHEMA`` tables, by batch) as one table with a ``batch_id`` column and
    ``billing_day`` as a date (checked); a null sum raises ``ValueError``."""
    if not tables:
        return _FOLD_SCHEMA.empty_table()
    table = pa.concat_tables([partials for _, partials in tables])
    for name in _SUMMED:
        if table[name].null_count:
            raise ValueError(f"partial aggregates with a null {name}")
    batch_ids = pa.chunked_array([pa.repeat(batch_id, partials.num_rows) for batch_id, partials in tables], pa.string())
    day = table.schema.get_field_index("billing_day")
    return table.set_column(day, "billing_day", table["billing_day"].cast(pa.date32())).add_column(
        0, "batch_id", batch_ids
    )


def _fold(table: pa.Table) -> pa.Table:
    """``table``'s rows summed per aggregate key, exactly, in key order (key, first currency not null, sums).

    Arrow's integer and decimal sums wrap silently on overflow, so a column whose sum might not fit its
    type is summed in a wider one; a sum that does not fit the stored type then raises ``ValueError``.
    """
    summed = {}
    for name in _SUMMED:
        column = table[name]
        summed[name] = column if _sum_fits(column) else column.cast(_wider(column.type))
    kept = {name: table[name] for name in (*_AGGREGATE_KEY, "currency")}
    grouped = (
        pa.table({**kept, **summed})
        .group_by(list(_AGGREGATE_KEY), use_threads=False)
        .aggregate([("currency", "first"), *((name, "sum") for name in _SUMMED)])
    )
    folded = pa.table(
        {
            **{key: grouped[key] for key in _AGGREGATE_KEY},
            "currency": grouped["currency_first"],
            **{name: grouped[f"{name}_sum"].cast(table.schema.field(name).type) for name in _SUMMED},
        }
    )
    return folded.sort_by([(key, "ascending") for key in _AGGREGATE_KEY])


def _plus(added: pa.Table, stored: Mapping[str, pa.Array]) -> pa.Table:
    """``added``'s aggregates plus the ``stored`` columns, row by row, exactly, with the stored currency where there
    is one; a sum that does not fit its column's type raises ``ValueError``."""
    summed = {}
    for name in _SUMMED:
        column, kind = added[name], added.schema.field(name).type
        if pa.types.is_decimal(kind):  # a sum of two has one digit more: added in a type with room for it
            wide = pa.decimal256(kind.precision + 1, kind.scale)
            summed[name] = pc.add(column.cast(wide), stored[name].cast(wide)).cast(kind)
        else:
            summed[name] = pc.add_checked(column, stored[name])
    return pa.table(
        {
            **{key: added[key] for key in _AGGREGATE_KEY},
            "currency": pc.coalesce(stored["currency"], added["currency"]),
            **summed,
        }
    )


def _keys(table: pa.Table) -> list[_Key]:
    """The key within its batch of each of ``table``'s aggregates, as one string (hashed once, unlike a tuple): the
    account's length, the account, the product and the day's number, joined by NUL. The day's number holds no NUL
    and the length tells where the account ends, so two keys are one string only when they are one key."""
    account, day = table["account_id"], table["billing_day"].cast(pa.int32()).cast(pa.string())
    length = pc.utf8_length(account).cast(pa.string())
    keys: list[_Key] = pc.binary_join_element_wise(length, account, table["product"], day, "\0").to_pylist()
    return keys


def _sum_fits(column: pa.ChunkedArray) -> bool:
    """Whether Arrow sums any rows of ``column`` without overflow: rows × largest magnitude within its type."""
    bounds = pc.min_max(column)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None:
        return True
    kind = column.type
    if not pa.types.is_decimal(kind):
        largest: int = max(abs(low), abs(high))
        return len(column) * largest < 2**63
    with localcontext(EXACT):
        largest = int(max(abs(low), abs(high)).scaleb(kind.scale))
    limit: int = 10**kind.precision
    return len(column) * largest < limit


def _wider(kind: pa.DataType) -> pa.DataType:
    """A type no sum of fewer than 2^63 values of ``kind`` can overflow."""
    return pa.decimal256(76, kind.scale) if pa.types.is_decimal(kind) else pa.decimal128(38, 0)


def _sql_values(column: pa.ChunkedArray) -> list[Any]:
    """Python values to bind: ints stay ints; decimals and dates become their canonical text."""
    values: list[Any] = (column if pa.types.is_integer(column.type) else column.cast(pa.string())).to_pylist()
    return values


def _batch_aggregates(conn: sa.Connection, batch_id: str) -> pa.Table:
    """One batch's stored aggregates on SQLite (one query), as a table like :func:`_fold` makes."""
    cursor = conn.connection.cursor()  # the driver's plain tuples: no conversion per value
    try:
        found = cursor.execute(_SQLITE_BATCH, (batch_id,)).fetchall()
    finally:
        cursor.close()
    columns = zip(*found, strict=True) if found else [()] * len(_FOLD_SCHEMA)
    as_read = {
        name: pa.array(column, pa.int64() if name == "transactions" else pa.string())
        for name, column in zip(_FOLD_SCHEMA.names, columns, strict=True)
    }
    return pa.table(as_read).cast(_FOLD_SCHEMA)


def _next_state(row: Mapping[str, Any]) -> str | None:
    """The final state a batch moves to now that every work item is accounted for, if it moves (``failed``
    may still become ``complete`` when its poisoned items are replayed)."""
    if row["state"] in FINAL_STATES - {"failed"}:
        return None
    if row["refused_reason"] is not None:
        state = "refused"
    elif row["work_items"] is None or row["completed_items"] + row["poisoned_items"] < row["work_items"]:
        return None
    else:
        state = "failed" if row["poisoned_items"] else "complete"
    return None if state == row["state"] else state


def _settle(row: dict[str, Any], state: str, now: datetime) -> None:
    """Move a batch to a final state (see :func:`_next_state`)."""
    row["state"] = state
    row["completed_at"] = now
    row["latency_seconds"] = (now - row["accepted_at"]).total_seconds() if row["accepted_at"] else None


def _update_batch(conn: sa.Connection, row: dict[str, Any], now: datetime) -> None:
    values = {k: v for k, v in row.items() if k != "batch_id"} | {"updated_at": now}
    conn.execute(_UPDATE_BATCH, {**values, "row_batch_id": row["batch_id"]})


def _status(row: sa.RowMapping) -> BatchStatus:
    return BatchStatus(**{f.name: row[f.name] for f in dataclasses.fields(BatchStatus)})
