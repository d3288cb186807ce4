"""How a batch file lies in the inbox: a text file as zstd frames of whole lines, one block each, read back
whole or a run of frames alone; and how its parts read as those parts of the whole file."""

from __future__ import annotations

import io

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import inbox
from shared.errors import PoisonMessage
from shared.rules.batchfile import line_blocks, read_chunks


def test_text_formats_are_framed_and_parquet_goes_as_it_is() -> None:
    assert inbox.codec("csv") == inbox.codec("jsonl") == inbox.CODEC
    assert inbox.codec("parquet") is None
    assert inbox.frame_bytes(1000) == inbox.MIN_FRAME and inbox.frame_bytes(1 << 40) == inbox.MAX_FRAME
    assert inbox.frame_bytes(32 << 20) == 1 << 20


@given(st.lists(st.binary(max_size=300).map(lambda line: line.replace(b"\n", b"") + b"\n"), max_size=60))
def test_frames_hold_whole_lines_and_read_back_as_the_file(lines: list[bytes]) -> None:
    content = b"".join(lines) + b"tail without a newline" * (len(lines) % 2)
    frames = list(line_blocks(io.BytesIO(content), 100))
    assert b"".join(frames) == content
    assert all(frame.endswith(b"\n") for frame in frames[:-1]) and all(frames)
    blob, index = inbox.in_memory(io.BytesIO(content), 100)
    assert [data for _, data in inbox.read_frames(io.BytesIO(blob), index)] == frames


def test_a_run_of_frames_decompresses_alone() -> None:
    content = b"".join(f"line {i}\n".encode() for i in range(20_000))
    blob, frames = inbox.in_memory(io.BytesIO(content), 4096)
    assert len(frames) > 10 and frames[3].start == sum(frame.length for frame in frames[:3])
    run = frames[4:7]
    part = inbox.Part("b", "csv", run[0].start, run[-1].start + run[-1].length, sum(f.size for f in run), "", 0, 0)
    expected = content[sum(f.size for f in frames[:4]) : sum(f.size for f in frames[:7])]
    assert part.text(blob[part.start : part.end]) == expected
    assert inbox.Part.from_json(part.to_json()) == part


def test_what_is_not_a_frame_is_poison() -> None:
    with pytest.raises(PoisonMessage, match="does not name a frame"):
        inbox.frame_index([("not-a-frame", 10)])
    with pytest.raises(PoisonMessage, match="names frame 1"):
        inbox.frame_index([(inbox.block_id(1, 5), 10)])
    with pytest.raises(PoisonMessage, match="do not decompress"):
        inbox.decompress(b"not zstd", 10)
    with pytest.raises(PoisonMessage, match="ends before its last frame"):
        list(inbox.read_frames(io.BytesIO(b"abc"), [inbox.Frame(0, 10, 10)]))


def test_a_part_after_the_header_reads_as_that_part_of_the_file() -> None:
    rows = "".join(f"t{i},acct-{i % 7},2026-03-02T09:15:00Z,p,{i}.5,\n" for i in range(2000))
    text = ("transaction_id,account_id,timestamp,product,quantity,region\n" + rows).encode()
    whole = pa.concat_tables(read_chunks(io.BytesIO(text), "csv"))
    head, rest = text.split(b"\n", 1)
    cut = rest.index(b"\n", 40_000) + 1
    part = pa.concat_tables(
        read_chunks(io.BytesIO(head + b"\n" + rest[cut:]), "csv", rows_before=rest[:cut].count(b"\n"))
    )
    assert part == whole.slice(whole.num_rows - part.num_rows)
