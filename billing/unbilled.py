"""Files that sit in the inbox unbilled: listing them (``billing status``), sending their requests again
(``billing resubmit``), and ``billing submit --wait`` noticing a request no initiator took
(:mod:`shared.submissions` keeps the inbox's side of all three)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import click
from azure.core.exceptions import AzureError
from rich.console import Console
from rich.markup import escape

from shared import submissions
from shared.errors import InputError
from shared.localstack import resolve
from shared.logs import redact
from shared.messaging.storage import Storage
from shared.settings import Settings
from shared.submissions import InboxFile

from .batch_ids import check_batch_id
from .client import announce
from .sql import open_store

if TYPE_CHECKING:
    from store import BatchStatus, Store


def unbilled(settings: Settings, store: Store) -> list[InboxFile] | None:
    """The inbox's files that no batch in ``store`` accounts for, oldest first; None (and a line on stderr)
    when storage cannot be reached: the rest of ``billing status`` still shows."""

    async def known(batch_ids: list[str]) -> Collection[str]:
        return store.accounted(batch_ids)

    async def find() -> list[InboxFile]:
        async with Storage(settings) as storage:
            return await submissions.unbilled(storage.container(settings.inbox_container), known)

    try:
        return asyncio.run(find())
    except AzureError as exc:
        Console(stderr=True).print(escape(f"unbilled files not listed: {redact(str(exc))}"), soft_wrap=True)
        return None


def as_json(files: Sequence[InboxFile] | None) -> list[dict[str, object]] | None:
    """The files for ``billing status --json`` (None: not listed)."""
    if files is None:
        return None
    return [
        {
            "batch_id": file.batch_id,
            "source": file.source,
            "uploaded_at": file.created.isoformat(),
            "age_seconds": round(file.age()),
        }
        for file in files
    ]


def echo(files: Sequence[InboxFile] | None) -> None:
    """One line a file, for ``billing status``."""
    for file in files or ():
        click.echo(f"unbilled batch_id={file.batch_id} source={file.source} age_seconds={file.age():.0f}")


def resubmit(batch_id: str) -> None:
    """``billing resubmit``: send again the request of a batch whose file sits in the inbox and that no batch
    accounts for; one already accounted for, or without a file in the inbox, is refused."""
    check_batch_id(batch_id)
    settings = resolve()
    with open_store(settings) as store:
        if store.accounted([batch_id]):
            found = store.batch(batch_id)
            state = found.state if found is not None else "known"
            raise InputError(f"batch {batch_id} is already accounted for ({state}): nothing sent")

    async def send() -> None:
        async with Storage(settings) as storage:
            await submissions.resend(storage, settings, batch_id)
            await announce(settings, storage)

    asyncio.run(send())
    click.echo(redact(f"batch {batch_id}: request sent again"))


class RequestWatch:
    """What ``billing submit --wait`` does for batches the store does not know yet: every
    ``BILLING_REQUEST_TAKE_TIMEOUT`` it looks whether an initiator took each one's request; one that no
    initiator took and that no longer waits in the requests queue is sent again, at most
    ``BILLING_REQUEST_RESENDS`` times, and the terminal is told."""

    def __init__(self, settings: Settings, batch_ids: Sequence[str], console: Console) -> None:
        self._settings = settings
        self._console = console
        self._bound = settings.request_take_timeout
        self._next = dict.fromkeys(batch_ids, time.monotonic() + self._bound)
        self._resent = dict.fromkeys(batch_ids, 0)
        self._told: set[str] = set()

    def __call__(self, statuses: Mapping[str, BatchStatus | None]) -> None:
        now = time.monotonic()
        for batch_id, status in statuses.items():
            if status is not None:
                self._next.pop(batch_id, None)  # the store knows it: taken
        due = [batch_id for batch_id, at in self._next.items() if at <= now]
        if due:
            for batch_id in due:
                self._next[batch_id] = now + self._bound
            try:
                lines = asyncio.run(self._look(due))
            except AzureError as exc:  # storage out of reach: look again at the next bound
                lines = [f"could not look at the requests of {', '.join(due)}: {redact(str(exc))}"]
            for line in lines:
                self._console.print(escape(line), soft_wrap=True)

    async def _look(self, due: list[str]) -> list[str]:
        """Look at the batches due; what to tell of them."""
        lines = []
        async with Storage(self._settings) as storage:
            container = storage.container(self._settings.inbox_container)
            waiting = await submissions.queued(storage, self._settings)
            for batch_id in due:
                if await submissions.taken(container, batch_id):
                    del self._next[batch_id]  # an initiator has it: its results follow
                elif waiting is None or batch_id in waiting:
                    if batch_id not in self._told:  # once: it is not lost, and a resend would not help
                        self._told.add(batch_id)
                        lines.append(
                            f"batch {batch_id}: its request waits in the requests queue (is an initiator running?)"
                        )
                elif self._resent[batch_id] >= self._settings.request_resends:
                    del self._next[batch_id]
                    lines.append(
                        f"batch {batch_id}: no initiator took its request, sent {self._resent[batch_id]} time(s) "
                        "again; no more resends (see `billing status`)"
                    )
                else:
                    await submissions.resend(storage, self._settings, batch_id)
                    await announce(self._settings, storage)
                    self._resent[batch_id] += 1
                    lines.append(
                        f"batch {batch_id}: no initiator took its request within {self._bound:g} s: sent it again "
                        f"({self._resent[batch_id]} of at most {self._settings.request_resends})"
                    )
        return lines
