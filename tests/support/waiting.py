"""The one way a test waits for something to become true: poll a predicate until it holds or a
deadline passes. :func:`wait_until` for plain code; :func:`wait_until_async` inside an event loop,
where a blocking sleep would stall the very thing being waited for."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.05) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy, and return
    that; after ``timeout`` seconds return its last (falsy) answer. It is called at least once, so
    ``timeout=0`` asks once. Callers assert on the result: ``assert wait_until(...), "why"``."""
    deadline = time.monotonic() + timeout
    while not (result := predicate()) and time.monotonic() < deadline:
        time.sleep(interval)
    return result


async def wait_until_async(predicate: Callable[[], T | Awaitable[T]], interval: float = 0.05) -> T:
    """:func:`wait_until` inside an event loop: sleeps with ``asyncio.sleep`` and awaits ``predicate``'s
    answer when it is awaitable; returns its first truthy answer. Bound it as asyncio code bounds
    anything, ``async with asyncio.timeout(10): await wait_until_async(...)`` (``TimeoutError``)."""
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        await asyncio.sleep(interval)
