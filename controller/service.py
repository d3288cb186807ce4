"""The controller: drains the results queue into the SQL store, one transaction per batch."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from azure.storage.queue import QueueMessage
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode
from prometheus_client import Histogram

from shared import telemetry
from shared.errors import InputError, PoisonMessage
from shared.messages import IdsPart, Kind, Manifest, PoisonNotice, WorkItemResult
from shared.messaging import tally
from shared.messaging.backoff import patiently
from shared.messaging.envelope import ClaimCheck, Envelope
from shared.messaging.poison import PoisonQueue
from shared.messaging.service import Service
from shared.messaging.storage import Storage
from shared.messaging.syphon import add_syphon
from shared.messaging.triggers import TriggerBus
from shared.refstore import PRICEBOOK, ReferenceStore
from shared.rules.reference import load_price_book
from shared.settings import Settings
from shared.submissions import resend_stale
from shared.wire import (
    kind_of,
    notify_controller,
    parse_ids,
    parse_manifest,
    parse_poisoned,
    parse_results,
    warm_up,
)
from store import PriceRow, Store, price_rows_of

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Longest wait between two looks for batches whose claim-check blobs are due for deletion.
CLEAN_UP_INTERVAL = 60.0
#: Batch latency histogram buckets, seconds: from a small batch to the largest.
LATENCY_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class Controller(Service):
    """Records manifests and partial aggregates, idempotently, and completes batches."""

    name = "controller"

    def __init__(
        self,
        *,
        storage: Storage,
        settings: Settings,
        store: Store,
        triggers: TriggerBus | None = None,
        burst: bool = False,
    ) -> None:
        super().__init__(storage=storage, settings=settings, triggers=triggers, burst=burst)
        self.store = store
        self._sql = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sql")
        self.claim_check = ClaimCheck(storage, container=settings.work_container, limit=settings.max_message_bytes)
        self.references = ReferenceStore(storage, container=settings.reference_container)
        self._price_books: set[str] = set()  # those whose rows this controller recorded
        # SQL writes serialise per batch anyway: one dequeue task, and no receive while a fold is
        # written, so that the next takes all that arrived meanwhile (a fold's cost is mostly per
        # transaction: 32 results messages folded at once cost far less CPU than one at a time).
        poison = PoisonQueue(
            storage, self.claim_check, on_poisoned=notify_controller(self.claim_check, settings.results_queue)
        )
        self.listen(settings.results_queue, self.handle, poison=poison, max_tasks=1, prefetch=False)
        # Not on the SQL thread as results wait: the imports of the messages' and the store's first use.
        self.repeat(None, functools.partial(asyncio.to_thread, warm_up))
        self.repeat(None, functools.partial(asyncio.to_thread, store.warm_up))
        self.repeat(min(CLEAN_UP_INTERVAL, max(1.0, settings.claim_check_retention)), self.clean_up)
        if settings.unbilled_resend_age > 0:
            self.repeat(settings.unbilled_resend_age, self.resend_unbilled)
        if storage.secondary is not None and settings.enable_syphon:
            add_syphon(self)
        self.batch_latency = Histogram(
            "billing_batch_latency_seconds",
            "Batches completed, by seconds from accepted to complete",
            buckets=LATENCY_BUCKETS,
            registry=self.metrics,
        )
        self.settled = telemetry.BatchCounters()

    @classmethod
    async def create(
        cls, *, storage: Storage, settings: Settings, triggers: TriggerBus | None, burst: bool
    ) -> Controller:
        """A controller on the configured SQL store, waiting for it while it cannot be reached."""
        store = await patiently("SQL store", lambda: asyncio.to_thread(Store, settings.sql_url_value))
        return cls(storage=storage, settings=settings, store=store, triggers=triggers, burst=burst)

    async def handle(self, messages: list[QueueMessage]) -> Mapping[str, str]:
        poisoned: dict[str, str] = {}
        received = _Received()
        charged: list[tuple[int, list[_Carried]]] = []  # per message: its stamp, what it carries
        unpacked = await asyncio.gather(  # their claim checks read at once
            *(self.claim_check.unpack(message.content) for message in messages), return_exceptions=True
        )
        for message, envelope in zip(messages, unpacked, strict=True):
            try:
                if isinstance(envelope, BaseException):
                    raise envelope
                charged.append((envelope.requests, received.take(envelope)))
            except PoisonMessage as exc:
                poisoned[message.id] = str(exc)
        if any(carried for _, carried in charged):
            await self._record_price_books(received.manifests)
            shares = _requests_carried(charged, own=max(0, tally.take() - sum(stamp for stamp, _ in charged)))
            requests: Counter[str] = Counter()
            spans: list[Span] = []
            last: dict[str, Span] = {}  # per batch, the span of the last thing applied for it
            for (_, carried), counts in zip(charged, shares, strict=True):
                for thing, count in zip(carried, counts, strict=True):
                    requests[thing.batch_id] += count
                    spans.append(span := thing.start_span(count))
                    last[thing.batch_id] = span
            with telemetry.ending(spans):
                apply = functools.partial(
                    self.store.apply,
                    received.manifests,
                    received.results,
                    received.notices,
                    ids=received.ids,
                    requests=requests,
                )
                outcome = await self._in_sql_thread(apply)
            for batch_id in outcome.completed_batches:
                async with self._settling(batch_id, last.get(batch_id), "batch complete"):
                    log.info("batch %s complete", batch_id)
            for latency in outcome.latency_seconds.values():
                self.batch_latency.observe(latency)
            for batch_id in outcome.failed_batches:
                async with self._settling(batch_id, last.get(batch_id), "batch failed") as span:
                    span.set_status(StatusCode.ERROR, "work items went to a poison queue")
                    log.error(
                        "batch %s failed: work items went to a poison queue (see `billing poison list`)", batch_id
                    )
        # Committed: the listener may now delete these messages.
        return poisoned

    async def _record_price_books(self, manifests: list[Manifest]) -> None:
        """Record the rows of the price books of the batches whose manifests came (once a price book), before their
        aggregates are: a batch completes only once its manifest is recorded."""
        wanted = {v.pricebook_hash for m in manifests if m.refused is None for v in m.dated()} - self._price_books
        rows: list[PriceRow] = []
        for digest in sorted(wanted):
            try:
                rows += price_rows_of(load_price_book(await self.references.get(PRICEBOOK, digest)))
            except InputError as exc:  # the initiator refuses a batch whose reference data is so
                log.warning("price book %s not recorded: %s", digest, exc)
                wanted.discard(digest)
        if rows:
            await self._in_sql_thread(functools.partial(self.store.record_price_books, rows))
        self._price_books |= wanted

    @contextlib.asynccontextmanager
    async def _settling(self, batch_id: str, cause: Span | None, name: str) -> AsyncIterator[Span]:
        """A span for a batch that just settled, the child of what settled it; with telemetry on,
        the batch's figures (as ``billing status`` shows them) on it and added to the counters."""
        context = None if cause is None else trace.set_span_in_context(cause)
        with telemetry.span(name, context, attributes={telemetry.BATCH_ID: batch_id}) as span:
            if telemetry.enabled():
                status = await self._in_sql_thread(functools.partial(self.store.batch, batch_id))
                if status is not None:
                    figures = status.to_json_dict()
                    self.settled.settled(figures)
                    span.set_attributes({f"billing.{field}": figures[field] for field in telemetry.BATCH_FIELDS})
            yield span

    async def clean_up(self) -> None:
        """Decide batches left waiting for an earlier batch another controller completed meanwhile; delete the
        claim-check blobs of batches settled longer ago than the retention.

        Costs storage requests only when a batch is due: finding batches is a SQL query.
        """
        settled = await self._in_sql_thread(self.store.sweep)
        for batch_id in settled.completed_batches:
            log.info("batch %s complete (it waited for an earlier batch)", batch_id)
        settled_before = datetime.now(UTC) - timedelta(seconds=self.settings.claim_check_retention)
        for batch_id in await self._in_sql_thread(functools.partial(self.store.claims_to_delete, settled_before)):
            deleted = await self.claim_check.delete_batch(batch_id)
            await self._in_sql_thread(functools.partial(self.store.mark_claims_deleted, batch_id))
            log.info("batch %s: %d claim-check blobs deleted", batch_id, deleted)

    async def resend_unbilled(self) -> None:
        """Send again the request of each inbox file that no batch accounts for, whose request no initiator took
        and nothing sent for ``BILLING_UNBILLED_RESEND_AGE`` (lost: :func:`~shared.submissions.resend_stale`).
        Costs a listing of the inbox a look; more requests only for such files."""

        def accounted(batch_ids: list[str]) -> asyncio.Future[set[str]]:
            return self._in_sql_thread(functools.partial(self.store.accounted, batch_ids))

        age = self.settings.unbilled_resend_age
        resent = await resend_stale(self.storage, self.settings, age, accounted)
        for file in resent:
            log.warning(
                "batch %s: its file (%s) sat %.0f s in the inbox with no batch accounting for it and its request "
                "taken by no initiator: request sent again",
                file.batch_id,
                file.source,
                file.age(),
            )
        if resent:
            await self.announce({self.settings.requests_queue: (len(resent), 0)})

    def readiness(self) -> dict[str, Callable[[], Awaitable[object]]]:
        # Not on the SQL thread: a ping must not wait behind a long fold.
        return {**super().readiness(), "sql": lambda: asyncio.to_thread(self.store.ping)}

    async def aclose(self) -> None:
        await self._in_sql_thread(self.store.close)
        self._sql.shutdown()

    def _in_sql_thread(self, work: Callable[[], T]) -> asyncio.Future[T]:
        """Run blocking SQL work on the controller's one SQL thread (work spread over many threads
        keeps a malloc arena of freed memory each, which raises the peak RSS)."""
        return asyncio.get_running_loop().run_in_executor(self._sql, work)


@dataclass
class _Received:
    """What the messages of a received batch carry for the store, by kind."""

    manifests: list[Manifest] = field(default_factory=list)
    results: list[WorkItemResult] = field(default_factory=list)
    notices: list[PoisonNotice] = field(default_factory=list)
    ids: list[IdsPart] = field(default_factory=list)

    def take(self, envelope: Envelope) -> list[_Carried]:
        """Take in a message, by its kind; what it carries. Raises :class:`PoisonMessage` for a message of a kind
        the controller does not take: one no role knows too (never read as results)."""
        match kind_of(envelope):
            case Kind.MANIFEST:
                self.manifests.append(manifest := parse_manifest(envelope))
                return [_Carried("apply manifest", manifest.batch_id, envelope.trace)]
            case Kind.IDS:
                self.ids.append(part := parse_ids(envelope))
                return [_Carried("apply ids", part.batch_id, envelope.trace)]
            case Kind.POISONED:
                self.notices.append(notice := parse_poisoned(envelope))
                return [_Carried("apply poison notice", notice.batch_id, envelope.trace, notice.work_item_id)]
            case Kind.RESULTS:
                self.results.extend(items := parse_results(envelope))
                return [_Carried("apply work item", r.batch_id, r.trace, r.work_item_id, r.rows) for r in items]
            case other:
                raise PoisonMessage("unexpected_kind", f"the controller takes no {other} message")


@dataclass(frozen=True)
class _Carried:
    """One thing a message carries for a batch (a manifest, an ids part, a work item's results, a poison
    notice) with the trace context it came with: applied in a span of its own."""

    span: str
    batch_id: str
    trace: Mapping[str, str]
    work_item_id: str | None = None
    rows: int = 0

    def start_span(self, requests: int) -> Span:
        attributes: dict[str, str | int] = {telemetry.BATCH_ID: self.batch_id, telemetry.REQUESTS: requests}
        if self.work_item_id is not None:
            attributes |= {telemetry.WORK_ITEM_ID: self.work_item_id, telemetry.ROWS: self.rows}
        context = telemetry.context_of(self.trace)
        return telemetry.TRACER.start_span(self.span, context, SpanKind.CONSUMER, attributes)


def _requests_carried(charged: list[tuple[int, list[_Carried]]], *, own: int) -> list[list[int]]:
    """Requests per thing carried, by message: each message's stamp plus an equal share of this
    controller's own (its receive, claim-check reads and deletes), split over what it carries in
    proportion to rows. Summed by batch, they are what the store adds to each batch."""
    return [
        tally.spread(stamp + share, [thing.rows for thing in carried])
        for (stamp, carried), share in zip(charged, tally.spread(own, [1] * len(charged)), strict=True)
    ]
