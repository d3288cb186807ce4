"""The billing job as a team would write it with Celery, for :mod:`benchmarks.celery_baseline`: one
Celery app whose broker is kombu's Azure Storage Queues transport and whose result backend is Celery's
SQLAlchemy database backend (SQLite), and one task that validates and rates a chunk of rows (carried in
the message) with the processor's own rules (:func:`processor.jobs.rate_rows`).

The worker (``celery -A benchmarks.celery_app worker``) is configured by the environment variables named
below, which the baseline sets; the client has an app of its own (:func:`client`).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import pyarrow as pa
from celery import Celery
from celery.signals import worker_ready

from processor.jobs import rate_rows
from shared.messages import WorkHeader
from shared.rules.batchfile import RAW_COLUMNS
from shared.rules.reference import load_price_book, load_tax_table
from shared.rules.versions import Rates

BROKER_ENV = "BILLING_CELERY_BROKER"  # azurestoragequeues://<key>@<queue endpoint>
RESULTS_ENV = "BILLING_CELERY_RESULTS"  # db+sqlite:///<path>
REFERENCES_ENV = "BILLING_CELERY_REFERENCES"  # a folder holding pricebook.csv and taxes.csv
READY_ENV = "BILLING_CELERY_READY"  # a file the worker creates once it consumes
#: The money columns of a partial aggregate, sent as integers (minor units); quantity goes as its text.
MONEY = ("net", "tax", "total")

TASK = "billing.rate_chunk"
CONFIG: dict[str, Any] = {
    "task_serializer": "json",
    "result_serializer": "json",
    "accept_content": ["json"],
    # A storage queue message holds at most 64 KiB: a few thousand rows fit only compressed.
    "task_compression": "zlib",
    # Remote control, gossip, mingle and heartbeats broadcast over fanout queues, which this transport lacks.
    "worker_enable_remote_control": False,
    "broker_connection_retry_on_startup": True,
}

app = Celery("billing_celery_worker", config_source=CONFIG)
if BROKER_ENV in os.environ:  # a worker: configured by its environment
    app.conf.update(broker_url=os.environ[BROKER_ENV], result_backend=os.environ[RESULTS_ENV])


def client(*, broker: str, results: str) -> Celery:
    """The client's app (``with`` it): sends :data:`TASK` by name and reads the results; nothing of the worker's."""
    return Celery("billing_celery_client", config_source=CONFIG | {"broker_url": broker, "result_backend": results})


def worker_environment(*, broker: str, results: str, references: Path) -> dict[str, str]:
    """What configures the worker's app: the same broker and results, and the reference data's folder."""
    return {BROKER_ENV: broker, RESULTS_ENV: results, REFERENCES_ENV: str(references)}


@worker_ready.connect  # type: ignore[untyped-decorator]
def _ready(**_: Any) -> None:
    if READY_ENV in os.environ:
        Path(os.environ[READY_ENV]).touch()


@lru_cache(maxsize=1)
def _references() -> Rates:
    folder = Path(os.environ[REFERENCES_ENV])
    book = load_price_book((folder / "pricebook.csv").read_bytes())
    return Rates.single(book, load_tax_table((folder / "taxes.csv").read_bytes()))


def chunk_message(fields: dict[str, list[str | None]], first_row: int, repeat_of: dict[int, int]) -> dict[str, Any]:
    """A task's argument: a chunk's fields as read (``RAW_COLUMNS``), the number of its first data row, and
    for the rows whose transaction id repeats an earlier row's, that row (by position in the chunk)."""
    return {"fields": fields, "first_row": first_row, "repeat_of": [[at, row] for at, row in repeat_of.items()]}


@app.task(name=TASK)  # type: ignore[untyped-decorator]
def rate_chunk(chunk: dict[str, Any]) -> dict[str, Any]:
    """Validate and rate a chunk: its partial aggregates, its rejected rows (row, reason) and its otherwise
    valid rows that repeat an earlier id, each rated on its own (for the client to tell duplicates)."""
    size = len(chunk["fields"][RAW_COLUMNS[0]])
    first = int(chunk["first_row"])
    repeat_of = [0] * size
    for at, row in chunk["repeat_of"]:
        repeat_of[at] = row
    rows = pa.table(
        {name: pa.array(chunk["fields"][name], pa.string()) for name in RAW_COLUMNS}
        | {
            "row": pa.array(range(first, first + size), pa.int64()),
            "raw": pa.nulls(size, pa.string()),  # rejected rows are counted, not kept: no raw text needed
            "repeat_of": pa.array(repeat_of, pa.int64()),
        }
    )
    header = WorkHeader(f"chunk-{first}", "celery", pricebook_hash="", taxes_hash="", rows=size)
    result = rate_rows(header, rows, _references())
    return {
        "partials": _columns(result.partials),
        "rejects": [result.rejects.column("row").to_pylist(), result.rejects.column("reason").to_pylist()],
        "held": _columns(result.held.drop_columns(["raw"])),
    }


def _columns(table: pa.Table) -> dict[str, list[Any]]:
    """A table as JSON-ready columns: money as integers, quantity as its exact decimal text."""
    columns: dict[str, list[Any]] = {}
    for name in table.column_names:
        values = table.column(name).to_pylist()
        if name in MONEY:
            values = [int(value) for value in values]
        elif name == "quantity":
            values = [str(value) for value in values]
        columns[name] = values
    return columns
