"""Tables as bytes, as messages carry them and the store keeps them: Parquet where bytes count (a queue message
holds 64 KiB), an Arrow stream where time does (the tables a work item's results are mostly made of)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

#: How a Parquet file starts (an Arrow stream starts otherwise: with a continuation marker).
_PARQUET = b"PAR1"
_DENSE = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=1))
_FAST = pa.ipc.IpcWriteOptions(compression="lz4")


def encode_table(table: pa.Table, *, dictionary: Sequence[str] | None = None) -> bytes:
    """Serialise a table densely: Parquet, zstd at level 1 (as small as the default level here, in two thirds of the
    time), the text columns worth it dictionary-encoded (denser than Arrow IPC, so more transactions fit a 64 KiB
    queue message). ``dictionary`` names those columns where the caller knows them (distinct ids need none);
    otherwise they are counted."""
    sink = pa.BufferOutputStream()
    columns = _repetitive(table) if dictionary is None else list(dictionary)
    pq.write_table(table, sink, compression="zstd", compression_level=1, use_dictionary=columns)
    encoded: bytes = sink.getvalue().to_pybytes()
    return encoded


def encode_stream(table: pa.Table, *, dense: bool = True) -> bytes:
    """Serialise a table fast: an Arrow stream. ``dense``: zstd at level 1, the text columns dictionary-encoded (a work
    item's partial aggregates on the wire: written faster than Parquet, read as fast, nearly as small); otherwise LZ4
    alone (larger still, written and read fastest)."""
    if dense:
        fields, columns = [], []
        for field, column in zip(table.schema, table.combine_chunks().columns, strict=True):
            if pa.types.is_string(field.type):
                column = pc.dictionary_encode(column)
                field = field.with_type(column.type)
            fields.append(field)
            columns.append(column)
        table = pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=table.schema.metadata))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_DENSE if dense else _FAST) as stream:
        stream.write_table(table)
    encoded: bytes = sink.getvalue().to_pybytes()
    return encoded


def decode_table(data: bytes | memoryview, *, metadata: bool = False) -> pa.Table:
    """The table :func:`encode_table` or :func:`encode_stream` wrote (its schema's metadata too if ``metadata``);
    raises ``ValueError`` on damaged data."""
    try:
        if bytes(data[: len(_PARQUET)]) == _PARQUET:  # the file reader, on this thread: a dataset costs more
            table = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
        else:
            table = _plain(pa.ipc.open_stream(pa.py_buffer(data)).read_all())
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"encoded table is damaged: {exc}") from exc
    return table if metadata else table.replace_schema_metadata(None)


def _plain(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary-encoded columns decoded (as :func:`encode_stream` was given it)."""
    schema = pa.schema(
        [
            field.with_type(field.type.value_type) if pa.types.is_dictionary(field.type) else field
            for field in table.schema
        ],
        metadata=table.schema.metadata,
    )
    return table if schema == table.schema else table.cast(schema)


def _repetitive(table: pa.Table) -> list[str]:
    """The text columns worth a dictionary: at most one distinct value in four rows (accounts,
    products, regions; not transaction ids, where a dictionary only adds bytes)."""
    return [
        field.name
        for field, column in zip(table.schema, table.columns, strict=True)
        if pa.types.is_string(field.type) and pc.count_distinct(column).as_py() * 4 <= table.num_rows
    ]
