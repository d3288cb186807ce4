"""The SQL store: :class:`Store` opens it (migrated), records results (:mod:`store.recording`) and reads batches."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Self, TypeVar

import sqlalchemy as sa

from . import migrate as migrations
from .batches import ApplyOutcome, BatchState, BatchStatus, stalled, status, waiting_batches
from .engine import Patience, open_engine, writing
from .ledger import late, merges_numbered
from .schema import batches

if TYPE_CHECKING:  # in annotations only: the store runs without the Azure SDK, and only recording loads Arrow
    from azure.core.credentials import TokenCredential

    from shared.messages import IdsPart, Manifest, PoisonNotice, WorkItemResult


T = TypeVar("T")


class Store:
    """The pipeline's SQL store (SQLite or PostgreSQL); migrates itself to the latest schema on open."""

    def __init__(
        self,
        url: str,
        *,
        migrate: bool = True,
        credential: TokenCredential | None = None,
        stalled_after: timedelta | None = None,
        patience: Patience | None = None,
    ) -> None:
        """Open the store at ``url``. PostgreSQL logs in with a Microsoft Entra token from
        ``credential`` when one is given, or from ``DefaultAzureCredential`` when the URL names an
        Azure Database for PostgreSQL server and no password (the keyless way on Azure). With ``stalled_after``,
        a batch's status says why it stalled when it has been ``processing`` that long without a change; with
        ``patience``, a store that cannot be reached is waited for within its bound (a command's)."""
        self.url, self._engine = open_engine(url, credential, patience)
        self._patience = patience
        self._stalled_after = stalled_after
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
        migrations.migrate(self._engine, self.url)

    def revision(self) -> str | None:
        """The schema revision the database is at (None before the first migration)."""
        return migrations.revision(self._engine)

    def patiently(self, read: Callable[[], T]) -> T:
        """``read()`` (of this store), waited for within the store's patience where it has one: a connection the
        server cut as it went down is tried again too."""
        return read() if self._patience is None else self._patience.retry(read)

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
        ids: Sequence[IdsPart] = (),
        requests: Mapping[str, int] | None = None,
    ) -> ApplyOutcome:
        """Record manifests, work item results, poison notices and ids parts in ONE transaction, idempotently
        (:func:`store.recording.apply`)."""
        from .recording import apply  # the write path loads Arrow; a store that only reads never does

        return apply(self._engine, manifests, results, poisoned, ids=ids, requests=requests)

    def warm_up(self) -> None:
        """Load what :meth:`apply` needs (Arrow, the ledger's code) now: the first results then wait for no import."""
        from . import recording  # noqa: F401

    def waiting(self) -> list[str]:
        """Batches whose work items are all recorded, waiting for an earlier batch they share ids with (an
        ``apply``, even of nothing, decides those it can)."""
        with self._engine.connect() as conn:
            return waiting_batches(conn)

    def mark_claims_deleted(self, batch_id: str) -> None:
        """Record that ``batch_id``'s claim-check blobs are gone."""
        with writing(self._engine) as conn:
            update = sa.update(batches).where(batches.c.batch_id == batch_id)
            conn.execute(update.values(claims_deleted_at=datetime.now(UTC)))

    # -- reads ----------------------------------------------------------------------------------------

    def batch(self, batch_id: str) -> BatchStatus | None:
        """One batch's status, or None if nothing is known about it yet."""
        with self._engine.connect() as conn:
            row = conn.execute(sa.select(batches).where(batches.c.batch_id == batch_id)).mappings().first()
            if row is None:
                return None
            return status(row, late(conn, [batch_id]).get(batch_id), _stalled(conn, [row], self._stalled_after)[0])

    def batches(self) -> list[BatchStatus]:
        """Every batch, oldest accepted first (batches still waiting for their manifest last)."""
        with self._engine.connect() as conn:
            rows, of_batches = conn.execute(sa.select(batches)).mappings().all(), late(conn)
            reasons = _stalled(conn, rows, self._stalled_after)
        found = [status(row, of_batches.get(row["batch_id"]), why) for row, why in zip(rows, reasons, strict=True)]
        return sorted(found, key=lambda s: (s.accepted_at is None, s.accepted_at or s.updated_at, s.batch_id))

    def claims_to_delete(self, settled_before: datetime) -> list[str]:
        """Batches ``complete`` or ``refused`` (nothing will read their claim checks again) since
        before ``settled_before`` whose claim-check blobs are still there."""
        query = sa.select(batches.c.batch_id).where(
            batches.c.state.in_((BatchState.complete.value, BatchState.refused.value)),
            batches.c.updated_at < settled_before,
            batches.c.claims_deleted_at.is_(None),
        )
        with self._engine.connect() as conn:
            return list(conn.scalars(query.order_by(batches.c.updated_at)))


def _stalled(conn: sa.Connection, rows: Sequence[sa.RowMapping], after: timedelta | None) -> list[str | None]:
    """For each batch row, why it stalled: still ``processing``, unchanged for ``after`` (None: not asked)."""
    if after is None:
        return [None] * len(rows)
    before = datetime.now(UTC) - after
    numbered = merges_numbered(conn)
    return [
        stalled(row, numbered) if row["state"] == BatchState.processing and row["updated_at"] < before else None
        for row in rows
    ]
