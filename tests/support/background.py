"""An event loop on a thread of its own, for servers a test runs beside the code under test."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """Use as ``with BackgroundLoop("name") as loop: loop.run(coroutine)``; the thread starts on
    entry (inheriting the entering thread's namespaces) and the loop is stopped and closed on exit."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run ``coroutine`` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=timeout)

    def __enter__(self) -> BackgroundLoop:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()
