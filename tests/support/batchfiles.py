"""Chunks of :func:`shared.rules.batchfile.read_chunks` as reject reports show their rows."""

from __future__ import annotations

import pyarrow as pa

from shared.rules.batchfile import CHUNK_SCHEMA, raw_texts

#: A chunk's columns with each row's raw text.
RAW_SCHEMA = CHUNK_SCHEMA.append(pa.field("raw", pa.string()))


def with_raw(chunk: pa.Table) -> pa.Table:
    """``chunk``'s ``CHUNK_SCHEMA`` columns and ``raw``, each row's raw text."""
    assert chunk.schema.names[: len(CHUNK_SCHEMA)] == CHUNK_SCHEMA.names
    return chunk.select(CHUNK_SCHEMA.names).append_column("raw", raw_texts(chunk))
