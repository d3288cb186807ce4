"""Text batch files as whole lines: read in blocks that end at a line end, physical lines counted as Python's
``csv`` module counts them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO


def line_blocks(source: BinaryIO, block_bytes: int) -> Iterator[bytes]:
    """The stream in blocks of about ``block_bytes`` ending at a ``\\n`` (a longer line: a longer block)."""
    parts: list[bytes | memoryview] = []  # of a block, up to the last read
    while data := source.read(block_bytes):
        cut = data.rfind(b"\n") + 1
        if not cut:
            parts.append(data)
            continue
        parts.append(memoryview(data)[:cut] if parts else data[:cut])
        block = b"".join(parts)
        parts = [data[cut:]] if cut < len(data) else []
        del data  # not kept while the block is parsed
        yield block
        del block
    if parts:
        yield b"".join(parts)


def line_count(text: bytes) -> int:
    """Physical lines ended in ``text``, as csv counts them (``\\n``, ``\\r\\n`` or ``\\r``)."""
    lines = text.count(b"\n")
    return lines + text.count(b"\r") - text.count(b"\r\n") if b"\r" in text else lines
