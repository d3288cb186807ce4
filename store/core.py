"""The SQL store: :class:`Store` opens it (migrated), records results (:mod:`store.recording`), keeps the ledger
(:mod:`store.ledger`) and reads batches and reports (:mod:`store.queries`): the one face callers use."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import sqlalchemy as sa

from . import migrate as migrations
from . import pricebooks, queries
from .batches import ApplyOutcome, BatchState, BatchStatus, accounted, stalled, status, waiting_batches
from .engine import Patience, open_engine, writing
from .ledger import closing, documents, numbers, parties
from .ledger.numbers import merges_numbered
from .ledger.periods import late
from .schema import batches

if TYPE_CHECKING:  # in annotations only: the store runs without the Azure SDK, and only recording loads Arrow
    from azure.core.credentials import TokenCredential

    from shared.messages import IdsPart, Manifest, PoisonNotice, WorkItemResult

    from .ledger.documents import Difference, Document, Period
    from .ledger.parties import Customer, Imported, Seller
    from .partials import Folds
    from .pricebooks import PriceRow
    from .queries import Dimension, Filters, Result


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
        ``patience``, a store that cannot be reached is waited for within its bound (a command's), its schema's
        check on opening too."""
        self.url, self._engine = open_engine(url, credential, patience)
        self._patience = patience
        self._stalled_after = stalled_after
        self._folds: Folds | None = None  # the sums of the partials it records (store.partials), once it records
        if migrate:
            self.patiently(self.migrate)

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine, for tests and benchmarks that look below this face."""
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
        from .partials import Folds
        from .recording import apply  # the write path loads Arrow; a store that only reads never does

        if self._folds is None:
            self._folds = Folds()
        return apply(self._engine, manifests, results, poisoned, ids=ids, requests=requests, folds=self._folds)

    def record_price_books(self, rows: Iterable[PriceRow]) -> None:
        """Record the rows of price books batches are rated with (:func:`store.price_rows_of`), once a price
        book: before the aggregates they rated are written."""
        with writing(self._engine) as conn:
            pricebooks.record(conn, rows)

    def price_book_rows(self, hashes: Iterable[str]) -> Mapping[tuple[str, str], PriceRow]:
        """The recorded rows of the price books named, by (price book, product)."""
        with self._engine.connect() as conn:
            return pricebooks.read(conn, hashes)

    def warm_up(self) -> None:
        """Load what :meth:`apply` needs (Arrow, the ledger's code) now: the first results then wait for no import."""
        from . import recording  # noqa: F401

    def sweep(self) -> ApplyOutcome:
        """Decide the batches left waiting for an earlier batch (:meth:`waiting`) that can be decided now."""
        return self.apply([], [])

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

    # -- the ledger ----------------------------------------------------------------------------------

    def close_period(
        self, period: str, *, now: datetime | None = None, require_customers: bool = False
    ) -> list[Document]:
        """Close ``period`` (``YYYY-MM``, ended): its documents issued in one transaction (:mod:`store.ledger.closing`);
        :class:`~store.LedgerError` for a period that cannot be closed, no seller registered, or (with
        ``require_customers``) an account to document without a customer record."""
        return closing.close(self._engine, period, now=now, require_customers=require_customers)

    def void(self, batch_id: str, *, now: datetime | None = None) -> BatchStatus:
        """Void a complete batch (:func:`store.ledger.numbers.void`); its status after."""
        return numbers.void(self._engine, batch_id, now=now)

    def pending(self, period: str) -> list[Difference]:
        """What closing ``period`` now would issue; nothing is written."""
        return closing.pending(self._engine, period)

    def periods(self, only: str | None = None) -> list[Period]:
        """Every period with billed rows or documents, newest first (or only ``only``)."""
        return closing.periods(self._engine, only)

    def documents(
        self,
        *,
        period: str | None = None,
        account: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Document]:
        """The documents issued, by number, of a period, an account, a kind (None: any)."""
        return documents.documents(self._engine, period=period, account=account, kind=kind, limit=limit, offset=offset)

    def document(self, number: int) -> Document | None:
        """The document numbered ``number``, if issued."""
        return documents.document(self._engine, number)

    # -- the parties ---------------------------------------------------------------------------------

    def set_seller(self, seller: Seller, *, now: datetime | None = None) -> Seller:
        """Register ``seller`` as the seller's newest version (:mod:`store.ledger.parties`); the version stored."""
        return parties.set_seller(self._engine, seller, now=now)

    def seller(self) -> Seller | None:
        """The seller in force, None before one is registered."""
        return parties.seller(self._engine)

    def import_customers(self, customers: Sequence[Customer], *, now: datetime | None = None) -> Imported:
        """Upsert customers by account id, all or nothing: a new version for each new or changed one."""
        return parties.import_customers(self._engine, customers, now=now)

    def customers(self) -> list[Customer]:
        """Every customer in force, by account id."""
        return parties.customers(self._engine)

    def customer(self, account_id: str) -> Customer | None:
        """The customer in force for ``account_id``, if any."""
        return parties.customer(self._engine, account_id)

    # -- reads ----------------------------------------------------------------------------------------

    def accounted(self, batch_ids: Sequence[str]) -> set[str]:
        """Those of ``batch_ids`` whose manifest is recorded: an initiator took their request, finished their file."""
        return accounted(self._engine, batch_ids)

    def totals(
        self, by: Sequence[Dimension], filters: Filters | None = None, *, limit: int | None = None, offset: int = 0
    ) -> Result:
        """The aggregates matching ``filters`` summed per ``by`` and currency (:func:`store.queries.totals`)."""
        return queries.totals(self._engine, by, filters, limit=limit, offset=offset)

    def aggregates(self, filters: Filters | None = None, *, limit: int | None = None, offset: int = 0) -> Result:
        """Per account, product, billing day and currency."""
        return queries.totals(self._engine, queries.AGGREGATE_KEY, filters, limit=limit, offset=offset)

    def invoices(self, filters: Filters | None = None, *, limit: int | None = None, offset: int = 0) -> Result:
        """Per account, billing period and currency: what each account owes."""
        return queries.totals(self._engine, queries.INVOICE_KEY, filters, limit=limit, offset=offset)

    def daily(self, filters: Filters | None = None, *, by_product: bool = False) -> Result:
        """Per billing day and currency (and product)."""
        return queries.totals(self._engine, ("billing_day", "product") if by_product else ("billing_day",), filters)

    def top(self, dimension: Dimension, filters: Filters | None = None, *, limit: int = 10) -> Result:
        """The ``limit`` accounts (or products, ...) with the largest net, in each currency, largest first."""
        return queries.top(self._engine, dimension, filters, limit=limit)

    def rejects_by_reason(self, batch_id: str) -> dict[str, int]:
        """How many rows of the batch were rejected, per reason code (most frequent first)."""
        return queries.rejects_by_reason(self._engine, batch_id)

    def rejected_rows(self, batch_id: str, *, limit: int | None = None, offset: int = 0) -> list[dict[str, Any]]:
        """The batch's rejected rows by row number (``row``, ``reason``, ``raw``: the row as JSON text)."""
        return queries.rejected_rows(self._engine, batch_id, limit=limit, offset=offset)

    def poisoned_items(self, batch_id: str) -> list[dict[str, Any]]:
        """The batch's work items that went to a poison queue and were not replayed since, with the reason."""
        return queries.poisoned_items(self._engine, batch_id)

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
