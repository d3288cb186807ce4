"""Tables as bytes: Parquet and an Arrow stream each read back exactly (38-digit sums, any text), the reader tells
which it was given, and damaged bytes of either are an error, never a wrong table."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import pyarrow as pa
import pytest

from shared.rules.schemas import PARTIAL_SCHEMA
from shared.tables import decode_table, encode_stream, encode_table
from support.records import partial


def fast_stream(table: pa.Table) -> bytes:
    return encode_stream(table, dense=False)


ENCODINGS: dict[str, Callable[[pa.Table], bytes]] = {
    "parquet": encode_table,
    "dense stream": encode_stream,
    "fast stream": fast_stream,
}
#: Partials with the largest sums the store takes, text beyond ASCII, and repeated keys (a dictionary's worth).
TABLE = pa.Table.from_pylist(
    [
        partial("acct-ü", product="GPU «A100»", net=10**37, tax=-(10**37) + 1, quantity="99999999999999999999.999999"),
        *(partial(f"acct-{n % 3}", transactions=n) for n in range(1, 40)),
    ],
    schema=PARTIAL_SCHEMA,
)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_table_reads_back_exactly_as_it_was_written(encoding: str) -> None:
    data = ENCODINGS[encoding](TABLE)
    read = decode_table(data)
    assert read.equals(TABLE)
    assert read.column("net")[0].as_py() == Decimal(10**37)
    assert decode_table(memoryview(b"ahead" + data)[5:]).equals(TABLE)  # a part of a message's payload
    chunked = pa.concat_tables([TABLE.slice(0, 7), TABLE.slice(7)])  # a results message's tables, concatenated
    assert decode_table(ENCODINGS[encoding](chunked)).equals(TABLE)
    assert decode_table(ENCODINGS[encoding](TABLE.slice(0, 0))).equals(TABLE.slice(0, 0))


def test_the_reader_tells_the_encodings_apart_by_their_first_bytes() -> None:
    assert [encode(TABLE)[:4] for encode in ENCODINGS.values()] == [b"PAR1"] + [b"\xff\xff\xff\xff"] * 2


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage"])
def test_damaged_bytes_are_an_error(encoding: str, damage: str) -> None:
    data = ENCODINGS[encoding](TABLE)
    damaged = {"truncated": data[: len(data) // 2], "empty": b"", "garbage": data[:4] + b"\x00" * 64}[damage]
    with pytest.raises(ValueError, match="encoded table is damaged"):
        decode_table(damaged)
