"""The controller: drains the results queue into the SQL store, one transaction per batch."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from azure.storage.queue import QueueMessage

from shared.envelope import ClaimCheck
from shared.errors import PoisonMessage
from shared.messages import Manifest, WorkItemResult
from shared.poison import PoisonQueue
from shared.protocol import MANIFEST, POISONED, PoisonNotice, parse_manifest, parse_poisoned, parse_results
from shared.service import Service
from shared.settings import Settings
from shared.storage import Storage
from shared.syphon import add_syphon
from shared.triggers import TriggerBus

from .store import Store

log = logging.getLogger(__name__)


class Controller(Service):
    """Records manifests and partial aggregates, idempotently, and completes batches."""

    name = "controller"

    def __init__(
        self, *, storage: Storage, settings: Settings, store: Store, triggers: TriggerBus | None = None, burst: bool = False
    ) -> None:
        super().__init__(storage=storage, settings=settings, triggers=triggers, burst=burst)
        self.store = store
        self.claim_check = ClaimCheck(storage, container=settings.work_container, limit=settings.max_message_bytes)
        # SQL writes serialise per batch anyway: one dequeue task, full batches.
        poison = PoisonQueue(storage, self.claim_check, notify=settings.results_queue)
        self.listen(settings.results_queue, self.handle, poison=poison, max_tasks=1)
        if storage.secondary is not None and settings.enable_syphon:
            add_syphon(self)

    async def handle(self, messages: list[QueueMessage]) -> Mapping[str, str]:
        poisoned: dict[str, str] = {}
        manifests: list[Manifest] = []
        results: list[WorkItemResult] = []
        notices: list[PoisonNotice] = []
        for message in messages:
            try:
                envelope = await self.claim_check.unpack(message.content)
                if envelope.kind == MANIFEST:
                    manifests.append(parse_manifest(envelope))
                elif envelope.kind == POISONED:
                    notices.append(parse_poisoned(envelope))
                else:
                    results.extend(parse_results(envelope))
            except PoisonMessage as exc:
                poisoned[message.id] = str(exc)
        if manifests or results or notices:
            outcome = await asyncio.to_thread(self.store.apply, manifests, results, notices)
            for batch_id in outcome.completed_batches:
                log.info("batch %s complete", batch_id)
            for batch_id in outcome.failed_batches:
                log.error("batch %s failed: work items went to a poison queue (see `billing poison list`)", batch_id)
        # Committed: the listener may now delete these messages.
        return poisoned

    async def aclose(self) -> None:
        await asyncio.to_thread(self.store.close)
