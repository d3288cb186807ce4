"""The inbox: where ``billing submit`` leaves a batch file, the initiator reads it whole and each processor
reads just the part it rates.

A text file (CSV, JSON Lines) lies there as independent zstd frames, each holding whole lines of the
file (about :func:`frame_bytes` of it, cut after a newline: :func:`~shared.rules.batchfile.line_blocks`),
each frame one block of the block blob
whose id names the frame's index and size as read. The blob's block list is then the index of its
frames: a work item names a run of whole frames (:class:`Part`), which a processor reads with one ranged
request and decompresses alone; a quarter of the bytes to upload, store and download. A Parquet file,
compressed already, lies there as it is.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import pyarrow as pa

from .errors import PoisonMessage
from .rules.batchfile import line_blocks

CODEC = "zstd"
#: The level frames are compressed at: a CSV or JSON Lines file comes out as small as at zstd's default (3) in two
#: thirds of the client's CPU time.
LEVEL = 1
#: The blob metadata naming the codec of its frames (absent: the file as it is).
CODEC_KEY = "codec"
#: A file is cut in about this many frames, each from ``MIN_FRAME`` to ``MAX_FRAME`` bytes of it (a
#: longer line makes a longer frame): fine enough for work items of any size, few enough requests.
FRAMES = 32
MIN_FRAME, MAX_FRAME = 16 << 10, 2 << 20


def codec(fmt: str) -> str | None:
    """The codec a batch file of format ``fmt`` is stored with (None: as it is)."""
    return None if fmt == "parquet" else CODEC


def frame_bytes(file_bytes: int) -> int:
    """About how many bytes of a file of ``file_bytes`` a frame holds."""
    return min(MAX_FRAME, max(MIN_FRAME, file_bytes // FRAMES))


def compress(frame: bytes) -> bytes:
    compressed: bytes = pa.Codec(CODEC, compression_level=LEVEL).compress(frame, asbytes=True)
    return compressed


def decompress(data: bytes, size: int) -> bytes:
    """The file's bytes in whole frames ``data`` (``size`` of them decompressed)."""
    try:
        decompressed: bytes = pa.Codec(CODEC).decompress(data, decompressed_size=size, asbytes=True)
    except (pa.ArrowException, OSError) as exc:
        raise PoisonMessage("bad_batch_file", f"inbox frames that do not decompress: {exc}") from exc
    if len(decompressed) != size:
        raise PoisonMessage("bad_batch_file", f"inbox frames of {len(decompressed)} bytes, not {size}")
    return decompressed


def block_id(index: int, size: int) -> str:
    """The block id of frame ``index`` holding ``size`` bytes of the file (one length for every frame)."""
    return f"{index:010d}-{size:012d}"


@dataclass(frozen=True)
class Frame:
    """Where a frame lies in the blob (``start``, ``length``) and how many bytes of the file it holds."""

    start: int
    length: int
    size: int


def frame_index(blocks: Iterable[tuple[str, int]]) -> list[Frame]:
    """The frames of a blob from its committed blocks (id, size), in order."""
    frames: list[Frame] = []
    start = 0
    for index, (name, length) in enumerate(blocks):
        try:
            number, size = (int(part) for part in name.split("-"))
        except ValueError:
            raise PoisonMessage("bad_batch_file", f"inbox block {name!r} does not name a frame") from None
        if number != index:
            raise PoisonMessage("bad_batch_file", f"inbox block {index} names frame {number}")
        frames.append(Frame(start, length, size))
        start += length
    return frames


def in_memory(file: BinaryIO, size: int) -> tuple[bytes, list[Frame]]:
    """A file as its inbox blob would hold it in frames of about ``size`` bytes, in memory: the blob's bytes
    and its frames (for benchmarks and tests that cut and rate files without storage)."""
    compressed = [(frame, compress(frame)) for frame in line_blocks(file, size)]
    frames = frame_index((block_id(i, len(frame)), len(data)) for i, (frame, data) in enumerate(compressed))
    return b"".join(data for _, data in compressed), frames


def read_frames(stream: BinaryIO, frames: Iterable[Frame]) -> Iterator[tuple[Frame, bytes]]:
    """Each frame with its bytes of the file, from a stream of the blob."""
    for frame in frames:
        data = stream.read(frame.length)
        if len(data) < frame.length:
            raise PoisonMessage("bad_batch_file", "the inbox blob ends before its last frame")
        yield frame, decompress(data, frame.size)


def file_stream(frames: Iterable[tuple[Frame, bytes]]) -> BinaryIO:
    """The file's bytes as a stream, from its frames (each with its bytes of the file)."""
    return io.BufferedReader(_Joined(data for _, data in frames), buffer_size=1 << 20)


class _Joined(io.RawIOBase):
    """Byte strings read one after the other, as a stream."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        super().__init__()
        self._pieces = pieces
        self._current = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._current:
            piece = next(self._pieces, None)
            if piece is None:
                return 0
            self._current = memoryview(piece)
        size = min(len(buffer), len(self._current))
        buffer[:size] = self._current[:size]
        self._current = self._current[size:]
        return size


@dataclass(frozen=True)
class Part:
    """Rows of a text file as a work item names them: the blob's bytes ``start`` to ``end`` (whole frames,
    ``size`` bytes of the file), the file's ``head`` (a CSV file's header lines, for a part after the first;
    a JSON Lines file has none), and the data rows and physical lines before the part's rows (those of the
    head left out: what :func:`~shared.rules.batchfile.read_chunks` takes)."""

    blob: str
    fmt: str
    start: int
    end: int
    size: int
    head: str
    rows_before: int
    lines_before: int

    def to_json(self) -> dict[str, str | int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, fields: object) -> Part:
        try:
            return cls(**fields)  # type: ignore[arg-type]
        except TypeError as exc:
            raise PoisonMessage("bad_envelope", f"work item part: {exc}") from exc

    def text(self, data: bytes) -> bytes:
        """The part's bytes of the file, ``data`` being the blob's ``start`` to ``end``, after its head."""
        return self.head.encode() + decompress(data, self.size)
