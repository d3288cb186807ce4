"""Bounded, jittered back-off for a dependency that does not answer (after the SDK's own retries)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..errors import is_transient

log = logging.getLogger(__name__)

PAUSE_MIN = 1.0
PAUSE_MAX = 30.0
T = TypeVar("T")


def pause(failures: int) -> float:
    """Seconds to wait after the ``failures``-th failure in a row: doubling from 1 s up to 30 s, ±20 %."""
    return min(PAUSE_MIN * 2.0 ** (failures - 1), PAUSE_MAX) * random.uniform(0.8, 1.2)


async def patiently(what: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """``await attempt()`` until it succeeds; transient failures (:func:`~shared.errors.is_transient`:
    outages, 5xx, timeouts, the SQL store unavailable) are logged once per try and retried with
    :func:`pause`; others raise."""
    failures = 0
    while True:
        try:
            return await attempt()
        except Exception as exc:
            if not is_transient(exc):
                raise
            failures += 1
            wait = pause(failures)
            log.warning("%s unavailable (%s); retrying in %.1f s", what, exc, wait)
            await asyncio.sleep(wait)
