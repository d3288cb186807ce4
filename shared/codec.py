"""Tables on the wire: Arrow IPC, compressed whole with zstd (small, fast, exact types)."""

from __future__ import annotations

import struct

import pyarrow as pa

_CODEC = pa.Codec("zstd", compression_level=3)
_LENGTH = struct.Struct("<Q")


def encode_table(table: pa.Table) -> bytes:
    """Serialise and compress a table."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    raw = sink.getvalue()
    return _LENGTH.pack(raw.size) + _CODEC.compress(raw, asbytes=True)


def decode_table(data: bytes) -> pa.Table:
    """The table :func:`encode_table` wrote; raises ``ValueError`` on damaged data."""
    if len(data) < _LENGTH.size:
        raise ValueError("encoded table is truncated")
    (size,) = _LENGTH.unpack_from(data)
    try:
        raw = _CODEC.decompress(memoryview(data)[_LENGTH.size :], decompressed_size=size)
        return pa.ipc.open_stream(raw).read_all()
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"encoded table is damaged: {exc}") from exc
