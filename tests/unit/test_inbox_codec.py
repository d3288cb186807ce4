"""How a batch file lies in the inbox: text formats as concatenated zstd frames, read back whole."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st

from shared.protocol import INBOX_CODEC, compress_inbox_block, inbox_codec, inbox_reader
from shared.rules.batchfile import read_chunks


def test_text_formats_are_compressed_and_parquet_goes_as_it_is() -> None:
    assert inbox_codec("csv") == inbox_codec("jsonl") == INBOX_CODEC
    assert inbox_codec("parquet") is None


@given(st.binary(max_size=5000), st.integers(min_value=1, max_value=700))
def test_frames_of_any_size_read_back_as_the_file(content: bytes, block: int) -> None:
    frames = b"".join(compress_inbox_block(content[i : i + block], INBOX_CODEC) for i in range(0, len(content), block))
    assert inbox_reader(io.BytesIO(frames), INBOX_CODEC).read() == content


def test_the_batch_reader_reads_lines_across_frame_boundaries() -> None:
    rows = "".join(f"t{i},acct-{i % 7},2026-03-02T09:15:00Z,p,{i}.5,\n" for i in range(2000))
    text = ("transaction_id,account_id,timestamp,product,quantity,region\n" + rows).encode()
    frames = b"".join(compress_inbox_block(text[i : i + 999], INBOX_CODEC) for i in range(0, len(text), 999))
    tables = list(read_chunks(inbox_reader(io.BytesIO(frames), INBOX_CODEC), "csv", chunk_rows=700))
    assert [t.num_rows for t in tables] == [700, 700, 600]
    assert tables[-1].column("transaction_id")[-1].as_py() == "t1999"


def test_an_uncompressed_stream_is_read_as_it_is() -> None:
    stream = io.BytesIO(b"PAR1...")
    assert inbox_reader(stream, None) is stream
