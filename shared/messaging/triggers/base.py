"""The trigger bus: a pub/sub channel on which publishers announce "work detected" hints.

Triggers are at-most-once hints. A lost trigger only delays work until the listener's slow
safety poll, so :meth:`TriggerBus.publish` logs and drops on transient failure instead of
raising.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class TriggerEvent:
    """Work was enqueued: ``messages`` messages carrying ``transactions`` transactions."""

    account: str
    queue: str
    messages: int
    transactions: int

    def to_json(self) -> str:
        """The event as a compact JSON object."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> TriggerEvent:
        """Parse :meth:`to_json` output; raises ``ValueError`` on anything else."""
        try:
            data = json.loads(text)
            return cls(
                account=str(data["account"]),
                queue=str(data["queue"]),
                messages=int(data["messages"]),
                transactions=int(data["transactions"]),
            )
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a trigger event: {exc}") from exc


TriggerHandler = Callable[[TriggerEvent], None]
"""Called in the event loop for each event received; it must not block."""


class TriggerBus(abc.ABC):
    """Publish and subscribe to :class:`TriggerEvent` hints. Use as ``async with bus``."""

    def __init__(self) -> None:
        self._handlers: list[TriggerHandler] = []
        self._tasks: set[asyncio.Task[None]] = set()

    @abc.abstractmethod
    async def start(self) -> None:
        """Connect and register the subscription; calling it again does nothing."""

    @abc.abstractmethod
    async def publish(self, event: TriggerEvent) -> None:
        """Announce work to every subscriber; transient failures are logged and dropped."""

    async def publish_many(self, events: Iterable[TriggerEvent]) -> None:
        """Announce several events at once (backends may send them in one request)."""
        for event in events:
            await self.publish(event)

    async def announce(self, account: str, counts: Mapping[str, tuple[int, int]]) -> None:
        """Publish one event per queue of ``account``: queue → (messages, transactions) enqueued."""
        await self.publish_many(
            TriggerEvent(account=account, queue=queue, messages=messages, transactions=transactions)
            for queue, (messages, transactions) in counts.items()
        )

    def subscribe(self, handler: TriggerHandler) -> None:
        """Deliver every received event to ``handler`` (before or after :meth:`start`)."""
        self._handlers.append(handler)

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop receiving, unregister the subscription and close the clients."""

    def _dispatch(self, event: TriggerEvent) -> None:
        """Hand one received event to every handler; a failing handler does not stop the rest."""
        for handler in list(self._handlers):
            try:
                handler(event)
            except Exception:
                _LOGGER.exception("trigger handler %r failed on %s", handler, event)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Start an owned task; its result is collected when it ends or in :meth:`_stop_tasks`."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._collect)
        return task

    def _collect(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _LOGGER.error("trigger task %s failed", task.get_name(), exc_info=task.exception())

    async def _stop_tasks(self) -> None:
        """Cancel the owned tasks and wait for them to end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> TriggerBus:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
