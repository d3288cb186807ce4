"""The store's SQL tables (SQLAlchemy Core) and the exact column types they use.

Money is stored in minor units as ``NUMERIC(38, 0)``, quantity as ``NUMERIC(38, 6)``: exact, and far
beyond 64-bit integers. SQLite has no exact wide numeric type (its NUMERIC affinity turns big values into
REAL), so there both are kept as canonical decimal text, added exactly outside SQL (see ``store``).
"""

from __future__ import annotations

import decimal
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeEngine

#: Exact arithmetic: any rounding raises instead of silently losing digits.
EXACT = decimal.Context(prec=1000, traps=[decimal.Inexact, decimal.Rounded, decimal.InvalidOperation])

MONEY_PRECISION = 38
QUANTITY_SCALE = 6


class ExactDecimal(sa.types.TypeDecorator[decimal.Decimal]):
    """``NUMERIC(precision, scale)`` on PostgreSQL, canonical decimal TEXT elsewhere; Python ``Decimal``.

    Binding a value with more fractional digits than ``scale`` raises instead of rounding.
    """

    impl = sa.Numeric
    cache_ok = True

    def __init__(self, precision: int, scale: int) -> None:
        super().__init__()
        self.precision = precision
        self.scale = scale
        self._quantum = decimal.Decimal(1).scaleb(-scale)

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(sa.Numeric(self.precision, self.scale, asdecimal=True))
        return dialect.type_descriptor(sa.Text())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        exact = decimal.Decimal(value).quantize(self._quantum, context=EXACT)
        if exact.adjusted() >= self.precision - self.scale:
            raise ValueError(f"{value} does not fit NUMERIC({self.precision}, {self.scale})")
        return exact if dialect.name == "postgresql" else format(exact, "f")

    def process_result_value(self, value: Any, dialect: Dialect) -> decimal.Decimal | None:
        return None if value is None else decimal.Decimal(value)


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp: ``TIMESTAMP WITH TIME ZONE`` on PostgreSQL, naive UTC on SQLite."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: timestamps must be timezone-aware")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def money_type() -> ExactDecimal:
    """Minor units of a currency, exact."""
    return ExactDecimal(MONEY_PRECISION, 0)


def quantity_type() -> ExactDecimal:
    """A quantity with up to six fractional digits, exact."""
    return ExactDecimal(MONEY_PRECISION, QUANTITY_SCALE)


def _sums() -> list[sa.Column[Any]]:
    """An aggregate's currency and exact sums (new columns for each table that has them)."""
    return [
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("transactions", sa.BigInteger, nullable=False),
        sa.Column("quantity", quantity_type(), nullable=False),
        sa.Column("net", money_type(), nullable=False),
        sa.Column("tax", money_type(), nullable=False),
        sa.Column("total", money_type(), nullable=False),
    ]


metadata = sa.MetaData()

#: One row per batch. ``work_items`` stays NULL until the manifest arrives (results may come first).
batches = sa.Table(
    "batches",
    metadata,
    sa.Column("batch_id", sa.String(255), primary_key=True),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("state", sa.String(32), nullable=False),
    sa.Column("rows", sa.BigInteger, nullable=False),
    sa.Column("accepted", sa.BigInteger, nullable=False),
    sa.Column("rejected", sa.BigInteger, nullable=False),
    sa.Column("work_items", sa.BigInteger, nullable=True),
    sa.Column("completed_items", sa.BigInteger, nullable=False),
    sa.Column("poisoned_items", sa.BigInteger, nullable=False),
    sa.Column("transactions_recorded", sa.BigInteger, nullable=False),
    sa.Column("pricebook_hash", sa.String(128), nullable=True),
    sa.Column("taxes_hash", sa.String(128), nullable=True),
    sa.Column("refused_reason", sa.Text, nullable=True),
    sa.Column("accepted_at", UTCDateTime(), nullable=True),
    # Phases as the initiator saw them (from the manifest; None where a phase did not happen).
    sa.Column("uploaded_at", UTCDateTime(), nullable=True),
    sa.Column("first_item_sent_at", UTCDateTime(), nullable=True),
    sa.Column("last_item_sent_at", UTCDateTime(), nullable=True),
    sa.Column("debatched_at", UTCDateTime(), nullable=True),
    sa.Column("completed_at", UTCDateTime(), nullable=True),
    sa.Column("latency_seconds", sa.Float, nullable=True),
    # Storage and Service Bus requests made for the batch (see shared.messaging.tally), counted as it runs.
    sa.Column("requests", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    # When the batch's claim-check blobs were deleted (see Controller.clean_up).
    sa.Column("claims_deleted_at", UTCDateTime(), nullable=True),
    # The ledger (store.ledger.numbers): the batch's number in acceptance order (set when its manifest is recorded,
    # never for a refused batch), and when it was voided (then it counts nowhere; its aggregates stay).
    sa.Column("seq", sa.BigInteger, nullable=True),
    sa.Column("voided_at", UTCDateTime(), nullable=True),
    # The ledger's id filter when the batch was debatched (store.ledger.ids): the merges it held, and the one that
    # added the batch's ids (None for batches from before the ledger kept ids).
    sa.Column("filter_serial", sa.BigInteger, nullable=True),
    sa.Column("id_serial", sa.BigInteger, nullable=True),
    sa.Column("id_segment", sa.BigInteger, nullable=True),  # the segment of ledger_ids holding its ids
    # Its key there (given with its first ids, before it has a seq), the ids parts its manifest counts, and
    # those recorded (table ledger_id_parts): it completes only once all are.
    sa.Column("id_key", sa.BigInteger, nullable=True),
    # The earlier batch it waits for, every work item in (store.ledger.ids): it shares ids with that running batch.
    sa.Column("waiting_for", sa.String(255), nullable=True),
    sa.Column("id_parts", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("id_parts_recorded", sa.BigInteger, nullable=False, server_default="0"),
)


def _measures() -> list[sa.Column[Any]]:
    """A document's signed sums (new columns for each table that has them): transactions, quantity, money."""
    return [
        sa.Column("transactions", sa.BigInteger, nullable=False),
        sa.Column("quantity", quantity_type(), nullable=False),
        sa.Column("net", money_type(), nullable=False),
        sa.Column("tax", money_type(), nullable=False),
        sa.Column("total", money_type(), nullable=False),
    ]


def _rated_by() -> list[sa.Column[Any]]:
    """What rated a documented change (key columns): its price book, tax region and tax rate, as the aggregates
    have them (``''`` where not recorded: region and rate before dated reference data)."""
    return [
        sa.Column("pricebook", sa.String(64), primary_key=True),
        sa.Column("region", sa.String(64), primary_key=True),
        sa.Column("tax_rate", sa.String(32), primary_key=True),
    ]


#: Issued documents (store.ledger.documents): never updated, never deleted. ``pricebooks`` and ``tax_tables`` hold the
#: content hashes its lines were rated with, space-separated.
documents = sa.Table(
    "documents",
    metadata,
    sa.Column("number", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("period", sa.String(7), nullable=False),
    sa.Column("account_id", sa.String(64), nullable=False),
    sa.Column("currency", sa.String(3), nullable=False),
    sa.Column("issued_at", UTCDateTime(), nullable=False),
    sa.Column("net", money_type(), nullable=False),
    sa.Column("tax", money_type(), nullable=False),
    sa.Column("total", money_type(), nullable=False),
    sa.Column("pricebooks", sa.Text, nullable=False),
    sa.Column("tax_tables", sa.Text, nullable=False),
    # Part 3 (migration 0015; nullable: documents issued before it have no snapshots and no due date).
    sa.Column("display_number", sa.String(48), nullable=True),
    sa.Column("corrects", sa.Text, nullable=True),  # the earlier documents of its triple, space-separated
    sa.Column("due_date", sa.Date, nullable=True),
    sa.Column("seller", sa.Text, nullable=True),  # the seller's snapshot as JSON
    sa.Column("customer", sa.Text, nullable=True),  # the customer's snapshot as JSON (null: no record)
)

#: The seller's versions (store.ledger.parties): every ``billing seller set`` adds one; the newest is in force.
sellers = sa.Table(
    "sellers",
    metadata,
    sa.Column("version", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("address", sa.Text, nullable=False),
    sa.Column("country", sa.String(2), nullable=False),
    sa.Column("tax_id", sa.String(64), nullable=False),
    sa.Column("payment_terms_days", sa.Integer, nullable=False),
    sa.Column("prefix", sa.String(16), nullable=False),
    sa.Column("set_at", UTCDateTime(), nullable=False),
)

#: The customers' versions (store.ledger.parties): an import adds a version for each new or changed customer.
customers = sa.Table(
    "customers",
    metadata,
    sa.Column("account_id", sa.String(64), primary_key=True),
    sa.Column("version", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("address", sa.Text, nullable=False),
    sa.Column("country", sa.String(2), nullable=False),
    sa.Column("tax_id", sa.String(64), nullable=True),
    sa.Column("email", sa.String(254), nullable=True),
    sa.Column("set_at", UTCDateTime(), nullable=False),
)

#: A document's lines: the change of one product's sums rated by one price book.
document_lines = sa.Table(
    "document_lines",
    metadata,
    sa.Column("number", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("product", sa.String(255), primary_key=True),
    sa.Column("pricebook", sa.String(64), primary_key=True),  # '': a line from before price books split lines
    *_measures(),
)

#: What each batch changed of a document's line (the line is their sum): what is documented of a batch.
document_batches = sa.Table(
    "document_batches",
    metadata,
    sa.Column("number", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("product", sa.String(255), primary_key=True),
    *_rated_by(),
    sa.Column("batch_id", sa.String(255), primary_key=True),
    *_measures(),
)

#: Changes a close settled without a document (every line of their pair at net 0 and tax 0): documented all the same.
settled_changes = sa.Table(
    "settled_changes",
    metadata,
    sa.Column("period", sa.String(7), primary_key=True),
    sa.Column("account_id", sa.String(64), primary_key=True),
    sa.Column("currency", sa.String(3), primary_key=True),
    sa.Column("product", sa.String(255), primary_key=True),
    *_rated_by(),
    sa.Column("batch_id", sa.String(255), primary_key=True),
    *_measures(),
)

#: The ledger's gap-free counters (store.ledger.numbers): one row each, its ``value`` the last number handed out.
counters = sa.Table(
    "counters",
    metadata,
    sa.Column("name", sa.String(32), primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)

#: Periods closed (store.ledger.periods): a period is closed from its first close on, whatever that close issued.
closed_periods = sa.Table(
    "closed_periods",
    metadata,
    sa.Column("period", sa.String(7), primary_key=True),
    sa.Column("closed_at", UTCDateTime(), nullable=False),
)

#: A batch's late rows (store.ledger.periods): its counted rows of a period that had been closed before it completed.
late_rows = sa.Table(
    "late_rows",
    metadata,
    sa.Column("batch_id", sa.String(255), primary_key=True),
    sa.Column("period", sa.String(7), primary_key=True),
    sa.Column("rows", sa.BigInteger, nullable=False),
)

#: Every work item ever recorded (the idempotency key); ``poison_reason`` set when it was poisoned instead.
work_items = sa.Table(
    "work_items",
    metadata,
    sa.Column("work_item_id", sa.String(255), primary_key=True),
    sa.Column("batch_id", sa.String(255), nullable=False, index=True),
    sa.Column("transactions", sa.BigInteger, nullable=False),
    sa.Column("recorded_at", UTCDateTime(), nullable=False),
    sa.Column("poison_reason", sa.Text, nullable=True),
)

#: What each work item counted, as it came (store.partials): its partial aggregates as an Arrow stream, kept until
#: its batch completes, when they are summed into ``aggregates`` (and when it fails, for what it counted so far).
partials = sa.Table(
    "partials",
    metadata,
    sa.Column("work_item_id", sa.String(255), primary_key=True),
    sa.Column("batch_id", sa.String(255), nullable=False, index=True),
    sa.Column("aggregates", sa.LargeBinary, nullable=False),
)

#: Exact aggregates per (batch, account, product, UTC billing day, price book), written when the batch settles (a
#: day has one price book within a batch): what the reports sum. The price book is the content hash of the one that
#: rated the rows.
aggregates = sa.Table(
    "aggregates",
    metadata,
    sa.Column("batch_id", sa.String(255), primary_key=True),
    sa.Column("account_id", sa.String(64), primary_key=True),
    sa.Column("product", sa.String(255), primary_key=True),
    sa.Column("billing_day", sa.Date, primary_key=True),
    sa.Column("pricebook", sa.String(64), primary_key=True),
    *_sums(),
)

#: The same sums per (batch, account, product, billing period ``YYYY-MM``, price book, tax region, tax rate), written
#: with ``aggregates``: what a period's documents are closed from (store.ledger.closing). The region as resolved
#: (``*`` for none), the rate as decimal text; both ``''`` for aggregates from before they were kept.
period_aggregates = sa.Table(
    "period_aggregates",
    metadata,
    sa.Column("batch_id", sa.String(255), primary_key=True),
    sa.Column("account_id", sa.String(64), primary_key=True),
    sa.Column("product", sa.String(255), primary_key=True),
    sa.Column("period", sa.String(7), primary_key=True),
    sa.Column("pricebook", sa.String(64), primary_key=True),
    sa.Column("region", sa.String(64), primary_key=True),
    sa.Column("tax_rate", sa.String(32), primary_key=True),
    *_sums(),
)

#: The rows of every price book a batch was rated with, by content hash (store.pricebooks): prices as the decimal
#: text of the file (an empty off-peak price is the unit price's; an empty minimum charge is NULL).
price_book_rows = sa.Table(
    "price_book_rows",
    metadata,
    sa.Column("pricebook", sa.String(64), primary_key=True),
    sa.Column("product", sa.String(255), primary_key=True),
    sa.Column("currency", sa.String(3), nullable=False),
    sa.Column("unit", sa.String(32), nullable=False),
    sa.Column("unit_price", sa.String(32), nullable=False),
    sa.Column("offpeak_unit_price", sa.String(32), nullable=False),
    sa.Column("minimum_charge", sa.String(32), nullable=True),
)

#: Rejected rows of a batch (1-based data row number).
rejects = sa.Table(
    "rejects",
    metadata,
    sa.Column("batch_id", sa.String(255), primary_key=True),
    sa.Column("row", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("reason", sa.String(64), nullable=False),
    sa.Column("raw", sa.Text, nullable=False),
    # The hash of the row's id where the row is its id's first occurrence: the ledger recorded that id until the
    # batch completes, and takes it out then if no later row counts it (store.ledger.ids).
    sa.Column("id_hash", sa.BigInteger, nullable=True),
)

#: Rows of a batch held until it completes: otherwise valid, their transaction id repeats an earlier row's
#: (``repeat_of``); then the first of each id is counted if that earlier row was rejected, the others rejected
#: as duplicates (``shared.rules.duplicates``). Each with its own amounts, its raw row, and its id.
held = sa.Table(
    "held",
    metadata,
    sa.Column("batch_id", sa.String(255), primary_key=True),
    sa.Column("row", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("repeat_of", sa.BigInteger, nullable=False),
    sa.Column("raw", sa.Text, nullable=False),
    sa.Column("transaction_id", sa.Text, nullable=False),  # stripped, as the ledger keeps it, and its hash
    sa.Column("id_hash", sa.BigInteger, nullable=False),
    sa.Column("account_id", sa.String(64), nullable=False),
    sa.Column("product", sa.String(255), nullable=False),
    sa.Column("billing_day", sa.Date, nullable=False),
    sa.Column("region", sa.String(64), nullable=False),
    sa.Column("pricebook", sa.String(64), nullable=False),
    sa.Column("tax_rate", sa.String(32), nullable=True),
    *_sums(),
)

#: The ledger's transaction ids (store.ledger.ids): each batch's ids, one row per id's first occurrence, from its ids
#: parts and manifest; at its completion those it did not count are deleted, when voided or refused all of them.
#: The key starts with the segment, so that a batch's ids go into one segment (a batch's ids are found by its
#: segment and ``batch_key``, its ``batches.id_key``); ``id_hash`` (the id's signed 64-bit hash) finds an id's rows
#: in every segment. The ids' text is in ``ledger_id_texts``, read only where two hashes meet.
ledger_ids = sa.Table(
    "ledger_ids",
    metadata,
    sa.Column("segment", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("id_hash", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("batch_key", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("row", sa.BigInteger, primary_key=True, autoincrement=False),
    sqlite_with_rowid=False,
)

#: The text of the ledger's ids (store.ledger.ids), what tells two ids of one hash apart: per batch (``batch_key``),
#: its ids as recorded together, a Parquet table (``IDS_SCHEMA``: row, transaction_id, of any length) of those of
#: rows ``first_row`` to ``last_row``. Deleted with the batch's ids when it is voided or refused.
ledger_id_texts = sa.Table(
    "ledger_id_texts",
    metadata,
    sa.Column("batch_key", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("first_row", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("last_row", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("ids", sa.LargeBinary, nullable=False),
)

#: The ids parts recorded (store.ledger.ids): a part delivered twice is recorded once.
ledger_id_parts = sa.Table(
    "ledger_id_parts",
    metadata,
    sa.Column("batch_id", sa.String(255), primary_key=True),
    sa.Column("part", sa.BigInteger, primary_key=True, autoincrement=False),
)

# The cross-batch report filters (store.queries; migration 0005).
sa.Index("ix_aggregates_account_day", aggregates.c.account_id, aggregates.c.billing_day)
sa.Index("ix_aggregates_product_day", aggregates.c.product, aggregates.c.billing_day)
sa.Index("ix_aggregates_day", aggregates.c.billing_day)
sa.Index("ix_batches_state", batches.c.state)
# No two batches share a sequence number (migration 0008).
sa.Index("ux_batches_seq", batches.c.seq, unique=True)
# No two batches share a key of their ids (migration 0012).
sa.Index("ux_batches_id_key", batches.c.id_key, unique=True)
# Documents of a period, of an account (migration 0009).
sa.Index("ix_documents_period_account", documents.c.period, documents.c.account_id, documents.c.currency)
sa.Index("ix_documents_account", documents.c.account_id)
