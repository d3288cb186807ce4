"""A blocking byte stream filled from async code: a download's blocks, read by a parser thread."""

from __future__ import annotations

import asyncio
import io
import queue
from collections.abc import AsyncIterator

#: How long a blocked side waits before it looks again whether the other side gave up.
_PATIENCE = 0.2


class PipeClosed(OSError):
    """The stream was closed while a reader still waited on it."""


class BlockPipe(io.RawIOBase):
    """Readable like a file; :meth:`feed` fills it from an async iterator of byte blocks.

    At most ``depth`` blocks wait in between, so a slow reader slows the download instead of
    filling memory. An error of the feed is raised to the reader; :meth:`close` releases both sides.
    """

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self._blocks: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=depth)
        self._current = memoryview(b"")
        self._ended = False
        self._abandoned = False

    async def feed(self, blocks: AsyncIterator[bytes]) -> None:
        """Put every block in the pipe, then the end of the stream (or the error that ended it)."""
        item: bytes | BaseException | None
        try:
            async for block in blocks:
                if not await asyncio.to_thread(self._put, block):
                    return
            item = None
        except Exception as exc:  # the reader raises it: it is the one that knows what it was doing
            item = exc
        await asyncio.to_thread(self._put, item)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._current:
            if self._ended:
                return 0
            item = self._get()
            if item is None:
                self._ended = True
                return 0
            if isinstance(item, BaseException):
                raise item
            self._current = memoryview(item)
        size = min(len(buffer), len(self._current))
        buffer[:size] = self._current[:size]
        self._current = self._current[size:]
        return size

    def close(self) -> None:
        """Stop both sides: the feed stops putting, a waiting reader gets :class:`PipeClosed`."""
        self._abandoned = True
        super().close()

    def _put(self, item: bytes | BaseException | None) -> bool:
        while not self._abandoned:
            try:
                self._blocks.put(item, timeout=_PATIENCE)
                return True
            except queue.Full:
                continue
        return False

    def _get(self) -> bytes | BaseException | None:
        while not self._abandoned:
            try:
                return self._blocks.get(timeout=_PATIENCE)
            except queue.Empty:
                continue
        raise PipeClosed("the batch file stream was closed")
