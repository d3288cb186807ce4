"""The controller's store benchmark: CPU seconds of ``Store.apply`` per 1,000,000 transactions, on SQLite.

Cuts a batch file into work items as the initiator does (``Debatch``, from the file's frames as the inbox holds
them), reads and rates each as a processor does
(``rate_work_items``: one results message per work item) and reads the results back as the controller does. Then
records them into a fresh SQLite store, ``N`` results messages per ``apply`` (the controller applies what one
receive brought, 1 to 32 messages), and reports the process CPU time the applies took, best of ``--repeat``.

    python -m benchmarks.store_apply big.csv --groups 1,2,4,32
"""

from __future__ import annotations

import io
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import click

from billing.sample import sample_price_book_bytes, sample_tax_table_bytes
from initiator.debatch import Debatch
from processor.jobs import rate_work_items
from shared import inbox
from shared.messages import Manifest, WorkHeader, WorkItemResult
from shared.rules.reference import load_price_book, load_tax_table
from shared.settings import Settings
from shared.wire import parse_results
from store import BatchState, Store

BATCH = "bench"


def rated(source: Path, price_book: bytes, tax_table: bytes, *, work_item_size: int) -> list[list[WorkItemResult]]:
    """The results messages of ``source`` (CSV) as the controller reads them, one per work item."""
    book, taxes = load_price_book(price_book), load_tax_table(tax_table)
    references = {book.content_hash: price_book, taxes.content_hash: tax_table}
    debatch = Debatch(work_item_size=work_item_size)
    messages = []
    with source.open("rb") as stream:
        blob, frames = inbox.in_memory(stream, inbox.frame_bytes(source.stat().st_size))
    with io.BytesIO(blob) as stream:
        for index, cut in enumerate(debatch.parts(BATCH, "csv", frames, stream)):
            header = WorkHeader(f"{BATCH}-{index}", BATCH, book.content_hash, taxes.content_hash, cut.rows, cut.part)
            text = blob[cut.part.start : cut.part.end] if cut.part else b""
            envelope, poisoned = rate_work_items([(header, cut.payload, text)], references, [{}])
            if envelope is None or poisoned:
                raise click.ClickException(f"work item {index} could not be rated: {poisoned}")
            messages.append(parse_results(envelope))
    return messages


def apply_cpu(messages: list[list[WorkItemResult]], group: int) -> float:
    """CPU seconds to apply ``messages`` to a fresh SQLite store, ``group`` messages per call."""
    results = [result for message in messages for result in message]
    manifest = Manifest(
        batch_id=BATCH,
        source="bench.csv",
        rows=sum(r.transactions + r.rejects.num_rows + r.held.num_rows for r in results),
        work_items=len(results),
        pricebook_hash="",
        taxes_hash="",
        accepted_at=datetime.now(UTC),
    )
    with tempfile.TemporaryDirectory() as folder, Store(f"sqlite:///{folder}/billing.db") as store:
        store.apply([manifest], [])
        started = time.process_time()
        for start in range(0, len(messages), group):
            store.apply([], [result for message in messages[start : start + group] for result in message])
        spent = time.process_time() - started
        status = store.batch(BATCH)
    if status is None or status.state != BatchState.complete:
        raise click.ClickException(f"the batch did not complete: {status}")
    return spent


@click.command()
@click.argument("source", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--groups", default="1,2,4,32", show_default=True, help="Results messages per apply, comma-separated.")
@click.option("--repeat", type=click.IntRange(1), default=3, show_default=True)
@click.option("--pricebook", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Default: the sample.")
@click.option("--taxes", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Default: the sample.")
@click.option(
    "--work-item-size",
    type=click.IntRange(1),
    default=Settings.model_fields["work_item_size"].default,
    show_default=True,
)
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Also write the numbers as JSON.")
def main(
    source: Path,
    groups: str,
    repeat: int,
    pricebook: Path | None,
    taxes: Path | None,
    work_item_size: int,
    output: Path | None,
) -> None:
    """Time Store.apply on SOURCE's rated results."""
    price_book = pricebook.read_bytes() if pricebook else sample_price_book_bytes()
    tax_table = taxes.read_bytes() if taxes else sample_tax_table_bytes()
    messages = rated(source, price_book, tax_table, work_item_size=work_item_size)
    transactions = sum(result.transactions for message in messages for result in message)
    partials = sum(result.partials.num_rows for message in messages for result in message)
    click.echo(f"{len(messages)} results messages, {partials} partial aggregates, {transactions} transactions")
    report = {}
    for group in (int(size) for size in groups.split(",")):
        best = min(apply_cpu(messages, group) for _ in range(repeat))
        report[group] = {"cpu_seconds": round(best, 3), "cpu_seconds_per_1m": round(best * 1e6 / transactions, 3)}
        click.echo(f"{group:>3} messages per apply: {best:.3f} CPU s, {best * 1e6 / transactions:.3f} per 1,000,000")
    if output:
        output.write_text(json.dumps({"transactions": transactions, "partials": partials, "groups": report}, indent=2))


if __name__ == "__main__":
    main()
