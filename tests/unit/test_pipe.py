"""The initiator's pipe from the download to the parser thread: bytes in order, errors passed on,
and neither side left blocked when the other gives up."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import AsyncIterator

import pytest

from initiator.pipe import BlockPipe, PipeClosed


async def _blocks(parts: list[bytes], error: Exception | None = None) -> AsyncIterator[bytes]:
    for part in parts:
        await asyncio.sleep(0)
        yield part
    if error is not None:
        raise error


async def test_the_reader_gets_every_byte_in_order() -> None:
    parts = [bytes([i]) * (1000 + i) for i in range(50)]
    pipe = BlockPipe(depth=2)
    feeding = asyncio.create_task(pipe.feed(_blocks(parts)))
    read = await asyncio.to_thread(io.BufferedReader(pipe, buffer_size=333).read)
    await feeding
    assert read == b"".join(parts)


async def test_an_error_of_the_download_is_raised_to_the_reader() -> None:
    pipe = BlockPipe()
    feeding = asyncio.create_task(pipe.feed(_blocks([b"abc"], ConnectionResetError("reset by peer"))))
    reader = io.BufferedReader(pipe)
    with pytest.raises(ConnectionResetError, match="reset by peer"):
        await asyncio.to_thread(reader.read)
    await feeding


async def test_closing_releases_a_waiting_reader_and_a_blocked_feed() -> None:
    release = asyncio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        yield b"x" * 10
        await release.wait()
        yield b"never read"

    pipe = BlockPipe(depth=1)
    feeding = asyncio.create_task(pipe.feed(stalled()))
    assert await asyncio.to_thread(pipe.read, 10) == b"x" * 10
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            pipe.read(10)  # waits: nothing more has arrived
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    await asyncio.sleep(0.3)  # the reader is waiting in the pipe
    pipe.close()
    await asyncio.to_thread(reader.join, 5)
    assert not reader.is_alive() and isinstance(outcome[0], PipeClosed)
    release.set()
    await asyncio.wait_for(feeding, 5)  # the feed stops instead of blocking on a full pipe
