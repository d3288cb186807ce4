"""``billing poison``: inspect, replay and purge the poison queues of every pipeline queue."""

from __future__ import annotations

from collections.abc import Collection

from rich.console import Console
from rich.table import Table

from shared.messaging.envelope import ClaimCheck
from shared.messaging.poison import Action, PoisonEntry, PoisonQueue
from shared.messaging.storage import Storage
from shared.settings import Settings

#: How much of an entry's original content ``list`` shows.
PREVIEW = 60


async def overview(settings: Settings) -> list[tuple[str, int, list[PoisonEntry]]]:
    """Per pipeline queue: about how many poisoned messages, and the first ones."""
    async with Storage(settings) as storage:
        await storage.ensure_all()
        poison = _poison(storage, settings)
        return [(queue, await poison.count(queue), await poison.peek(queue)) for queue in settings.all_queues]


async def act(
    settings: Settings, action: Action, *, queues: Collection[str], ids: Collection[str] | None
) -> list[PoisonEntry]:
    """Apply ``action`` to the chosen entries (every entry when ``ids`` is None) of ``queues``."""
    async with Storage(settings) as storage:
        await storage.ensure_all()
        poison = _poison(storage, settings)
        return [entry for queue in queues for entry in await poison.visit(queue, action, ids)]


def print_overview(found: list[tuple[str, int, list[PoisonEntry]]], console: Console) -> None:
    table = Table(title="Poison queues")
    for column in ("queue", "entry id", "message id", "attempts", "reason", "content"):
        table.add_column(column)
    for queue, count, entries in found:
        if not count and not entries:
            continue
        for entry in entries:
            content = entry.content if len(entry.content) <= PREVIEW else entry.content[:PREVIEW] + "…"
            table.add_row(queue, entry.id, entry.message_id, str(entry.dequeue_count), entry.reason, content)
        if count > len(entries):
            table.add_row(queue, f"… about {count - len(entries)} more", "", "", "", "")
    if table.row_count:
        console.print(table)
    else:
        console.print("no poisoned messages")


def _poison(storage: Storage, settings: Settings) -> PoisonQueue:
    return PoisonQueue(
        storage, ClaimCheck(storage, container=settings.work_container, limit=settings.max_message_bytes)
    )
