"""``billing submit`` as a user runs it: refusals enqueue nothing, resubmission changes nothing."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from billing import client
from billing.sample import generate, sample_price_book_bytes, sample_tax_table_bytes
from shared import inbox
from shared.messaging.storage import Storage
from shared.settings import Settings
from shared.submissions import REQUESTED
from support.exact import status
from support.roles import Roles

HEADER = "transaction_id,account_id,timestamp,product,quantity,region\n"
GOOD_ROW = "t1,acct-1,2026-03-02T09:15:00+01:00,{product},1.5,\n"


def billing(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "billing", *args], capture_output=True, text=True, env=os.environ, timeout=120
    )


async def _queued_and_inbox(settings: Settings) -> tuple[int, int]:
    async with Storage(settings) as storage:
        await storage.ensure_all()
        props = await storage.queue(settings.requests_queue).get_queue_properties()
        inbox = storage.container(settings.inbox_container)
        files = [b async for b in inbox.list_blobs() if not b.name.startswith(REQUESTED.format(""))]
    return props.approximate_message_count, len(files)


@pytest.fixture(autouse=True)
def sample_registered(settings_env: Settings) -> None:
    """The sample price book and tax table registered: these tests submit without reference data of their own."""
    asyncio.run(client.register(settings_env, sample_price_book_bytes(), sample_tax_table_bytes()))


@pytest.fixture
def product() -> str:
    from billing.sample import sample_price_book_bytes
    from shared.rules.reference import load_price_book

    return next(iter(load_price_book(sample_price_book_bytes()).products))


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("latin1.csv", (HEADER + "t1,acct-\xe9,2026-03-02T09:15:00Z,P,1,\n").encode("latin-1"), "UTF-8"),
        ("nocol.csv", b"transaction_id,account_id,timestamp,quantity\nt1,a,2026-03-02T09:15:00Z,1\n", "product"),
        ("quotes.csv", (HEADER + 't1,"acct"x,2026-03-02T09:15:00Z,P,1,\n').encode(), "malformed CSV at line 2"),
        ("broken.jsonl", b'{"transaction_id": "t1"}\n[1, 2]\n', "line 2"),
        ("garbage.parquet", b"PAR1 this is not parquet", "arquet"),
    ],
)
def test_unreadable_file_is_refused_and_nothing_is_enqueued(
    settings_env: Settings, tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    result = billing("submit", str(path))
    assert result.returncode != 0
    assert message.lower() in result.stderr.lower()
    assert "Traceback" not in result.stderr
    assert asyncio.run(_queued_and_inbox(settings_env)) == (0, 0)


def test_a_refused_file_among_several_is_reported_and_the_others_go_on(
    settings_env: Settings, tmp_path: Path, product: str
) -> None:
    good, bad = tmp_path / "good.csv", tmp_path / "bad.csv"
    good.write_text(HEADER + GOOD_ROW.format(product=product))
    bad.write_bytes(b"transaction_id,account_id,timestamp,quantity\nt1,a,2026-03-02T09:15:00Z,1\n")
    result = billing("submit", str(bad), str(good))
    assert result.returncode == 2
    assert "bad.csv" in result.stderr and "product" in result.stderr and "good.csv" not in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert re.search(r"^batch \S+ submitted", result.stdout, re.MULTILINE)
    assert asyncio.run(_queued_and_inbox(settings_env)) == (1, 1)
    named = billing("submit", str(good), str(good), "--batch-id", "one")
    assert named.returncode == 2 and "--batch-id" in named.stderr


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(
    settings_env: Settings, tmp_path: Path, product: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.csv"
    path.write_text(HEADER + GOOD_ROW.format(product=product) * 100)
    monkeypatch.setenv("BILLING_MAX_FILE_BYTES", str(path.stat().st_size - 1))
    result = billing("submit", str(path))
    assert result.returncode != 0 and "over the limit" in result.stderr and "Traceback" not in result.stderr
    assert asyncio.run(_queued_and_inbox(settings_env)) == (0, 0)
    monkeypatch.setenv("BILLING_MAX_FILE_BYTES", str(path.stat().st_size))
    assert billing("submit", str(path)).returncode == 0


def test_resubmitting_a_batch_changes_nothing_and_says_so(settings_env: Settings, tmp_path: Path, product: str) -> None:
    path = tmp_path / "batch.csv"
    path.write_text(HEADER + GOOD_ROW.format(product=product))
    first = billing("submit", str(path), "--batch-id", "b-1")
    assert first.returncode == 0, first.stderr
    assert "submitted" in first.stdout
    second = billing("submit", str(path), "--batch-id", "b-1")
    assert second.returncode == 0, second.stderr
    assert "already submitted" in second.stdout
    assert asyncio.run(_queued_and_inbox(settings_env)) == (1, 1)


def test_a_text_file_lies_in_the_inbox_compressed(settings_env: Settings, tmp_path: Path, product: str) -> None:
    path = tmp_path / "batch.csv"
    path.write_text(HEADER + GOOD_ROW.format(product=product) * 2000)
    assert billing("submit", str(path), "--batch-id", "b-z").returncode == 0

    async def stored() -> tuple[dict[str, str], list[tuple[str, int]], bytes]:
        async with Storage(settings_env) as storage:
            blob = storage.container(settings_env.inbox_container).get_blob_client("b-z")
            committed, _ = await blob.get_block_list("committed")
            download = await blob.download_blob()
            return download.properties.metadata, [(b.id, b.size) for b in committed], await download.readall()

    metadata, blocks, content = asyncio.run(stored())
    assert metadata["codec"] == inbox.CODEC and len(content) < path.stat().st_size / 10
    frames = inbox.frame_index(blocks)
    assert len(frames) > 2, "a frame a block"
    read = [data for _, data in inbox.read_frames(io.BytesIO(content), frames)]
    assert b"".join(read) == path.read_bytes() and all(data.endswith(b"\n") for data in read)


def test_an_upload_whose_request_never_went_out_is_submitted_again(
    settings_env: Settings, tmp_path: Path, product: str
) -> None:
    """What a submitter that died between upload and request (or whose upload reply was lost, so that
    the SDK's retry found the blob) leaves behind: the next submission sends the request."""
    path = tmp_path / "batch.csv"
    path.write_text(HEADER + GOOD_ROW.format(product=product))

    async def upload_only() -> None:
        async with Storage(settings_env) as storage:
            await storage.ensure_all()
            await storage.container(settings_env.inbox_container).upload_blob("b-2", path.read_bytes())

    asyncio.run(upload_only())
    assert asyncio.run(_queued_and_inbox(settings_env)) == (0, 1)
    again = billing("submit", str(path), "--batch-id", "b-2")
    assert again.returncode == 0, again.stderr
    assert "b-2 submitted" in again.stdout
    assert asyncio.run(_queued_and_inbox(settings_env)) == (1, 1)
    assert "already submitted" in billing("submit", str(path), "--batch-id", "b-2").stdout


def test_invalid_reference_data_is_refused_before_anything_is_stored(
    settings_env: Settings, tmp_path: Path, product: str
) -> None:
    path = tmp_path / "batch.csv"
    path.write_text(HEADER + GOOD_ROW.format(product=product))
    taxes = tmp_path / "taxes.csv"
    taxes.write_text("region,tax_rate\nDE,0.19\n")  # no default `*` row
    result = billing("submit", str(path), "--taxes", str(taxes))
    assert result.returncode != 0
    assert "*" in result.stderr
    assert asyncio.run(_queued_and_inbox(settings_env)) == (0, 0)


@pytest.mark.parametrize("batch_id", ["a/b", "", "x" * 129, "spaces are not ids"])
def test_a_batch_id_that_cannot_name_blobs_is_refused(
    settings_env: Settings, tmp_path: Path, product: str, batch_id: str
) -> None:
    path = tmp_path / "batch.csv"
    path.write_text(HEADER + GOOD_ROW.format(product=product))
    result = billing("submit", str(path), "--batch-id", batch_id)
    assert result.returncode != 0
    assert "batch id" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert asyncio.run(_queued_and_inbox(settings_env)) == (0, 0)


def test_files_submitted_together_are_numbered_in_the_order_given(
    settings_env: Settings, roles: Roles, tmp_path: Path
) -> None:
    sizes = {"a": 60_000, "b": 10, "c": 2_000}  # the first the slowest to check, hash and upload
    for seed, (name, rows) in enumerate(sizes.items()):
        generate(rows, tmp_path / f"{name}.csv", seed=seed)
    result = billing("submit", *(str(tmp_path / f"{name}.csv") for name in sizes))
    assert result.returncode == 0, result.stderr
    submitted = re.findall(r"^batch (\S+) submitted", result.stdout, re.MULTILINE)
    assert len(submitted) == len(sizes)
    for role in ("initiator", "processor", "controller"):
        roles.burst(role)
    seqs = [status(batch_id)["seq"] for batch_id in submitted]
    assert None not in seqs and seqs == sorted(seqs), seqs
