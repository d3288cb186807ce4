"""``billing bench-recovery``: how long a batch waits when a role dies holding its messages.

For each role, on a fresh local stack (Azurite, SQLite) with the product's settings: a batch is
submitted, the role is frozen (SIGSTOP) at a moment it holds leased messages (the queue's depth, which
counts leased messages, exceeds what a peek can see) whose work it has not finished, SIGKILLed, and
started again a second later. The controller is caught with the store locked for writing, so that what
it holds is surely not recorded.
Reported per role: the messages it held, the seconds from the kill to the batch complete, the bound
(visibility timeout + 15 s), and whether every work item was counted once.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from azure.storage.queue import QueueClient
from pydantic import SecretStr
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import make_url

from billing.demo import role_processes, start_role
from shared.localstack import AzuriteStack
from shared.settings import Settings
from store import BatchStatus, Store

from .pipeline import _batch_file, _settled

RECOVERY_MARGIN = 15.0  # seconds the bound allows past the visibility timeout
RESTART_AFTER = 1.0  # seconds between the kill and the new process


@dataclass(frozen=True)
class Recovery:
    role: str
    rows: int
    held: int  # messages the role held when it was killed
    kill_to_complete_seconds: float
    bound_seconds: float
    counted_once: bool  # every work item completed, every accepted transaction recorded once


def role_queues(settings: Settings, role: str) -> list[str]:
    """The queues whose messages ``role`` holds while it works on them."""
    return {
        "initiator": [settings.requests_queue],
        "processor": settings.input_queues,
        "controller": [settings.results_queue],
    }[role]


def queue_clients(settings: Settings, role: str) -> list[QueueClient]:
    connection = settings.storage_connection_string
    if connection is None:
        raise ValueError("the recovery benchmark needs a storage connection string")
    return [QueueClient.from_connection_string(connection.get_secret_value(), q) for q in role_queues(settings, role)]


def leased(clients: Sequence[QueueClient]) -> int:
    """Messages of these queues that no receive could take now: someone holds them (a peek sees 32 at most)."""
    total = 0
    for client in clients:
        depth = client.get_queue_properties().approximate_message_count or 0
        total += max(0, depth - len(client.peek_messages(max_messages=32)))
    return total


def freeze_while_holding(pid: int, clients: Sequence[QueueClient], *, timeout: float = 120.0) -> int:
    """Wait until the process holds leased messages of ``clients``' queues and freeze it (SIGSTOP)
    while it does, so that it cannot finish them; how many it holds. Raises ``TimeoutError``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if leased(clients):
            os.kill(pid, signal.SIGSTOP)
            if held := leased(clients):
                return held
            os.kill(pid, signal.SIGCONT)  # it finished them between the two looks
        time.sleep(0.02)
    raise TimeoutError(f"process {pid} held no message within {timeout:.0f} s")


def freeze_holding_work(role: str, pid: int, settings: Settings) -> int:
    """Freeze ``role``'s process while it holds leased messages whose work it has not finished; how many."""
    clients = queue_clients(settings, role)
    if role != "controller":
        return freeze_while_holding(pid, clients)
    with store_locked(settings):  # it may receive results, but not record them
        return freeze_while_holding(pid, clients)


@contextmanager
def store_locked(settings: Settings) -> Iterator[None]:
    """The SQLite store locked for writing while the block runs."""
    url = make_url(settings.sql_url_value)
    if url.get_backend_name() != "sqlite" or not url.database:
        raise ValueError(f"the store can be locked here only when it is a SQLite file, not {url.get_backend_name()}")
    connection = sqlite3.connect(url.database, isolation_level=None, timeout=60)
    try:
        connection.execute("BEGIN EXCLUSIVE")
        yield
        connection.execute("ROLLBACK")
    finally:
        connection.close()


def measure(role: str, *, rows: int, data_dir: Path, console: Console) -> Recovery:
    """One batch of ``rows`` through a fresh stack, ``role`` killed holding its messages."""
    batch = _batch_file(rows, data_dir, console)
    with tempfile.TemporaryDirectory(prefix="billing-recovery-") as scratch:
        home = Path(scratch)
        stack = AzuriteStack(home=home, persist=False)
        settings = Settings(home=home, storage_connection_string=SecretStr(stack.start()))
        env = {**os.environ, **settings.as_env()}
        try:
            with role_processes(settings, home / "logs") as processes:
                _settled(home, roles=3, timeout=30)
                batch_id = f"recovery-{role}"
                references = ["--pricebook", str(data_dir / "pricebook.csv"), "--taxes", str(data_dir / "taxes.csv")]
                command = [sys.executable, "-m", "billing", "submit", str(batch), "--batch-id", batch_id, *references]
                subprocess.run(command, env=env, capture_output=True, check=True)
                index = [str(p.args[-1]) for p in processes].index(role)  # type: ignore[index]
                held = freeze_holding_work(role, processes[index].pid, settings)
                processes[index].kill()
                processes[index].wait()
                killed_at = datetime.now(UTC)
                time.sleep(RESTART_AFTER)
                processes[index] = start_role(role, env, home / "logs" / f"{role}-{index}.log")
                status = wait_complete(settings, batch_id, timeout=settings.visibility_timeout + 600)
        finally:
            stack.stop()
    assert status.completed_at is not None
    return Recovery(
        role=role,
        rows=rows,
        held=held,
        kill_to_complete_seconds=round((status.completed_at - killed_at).total_seconds(), 2),
        bound_seconds=settings.visibility_timeout + RECOVERY_MARGIN,
        counted_once=status.completed_items == status.work_items and status.transactions_recorded == status.accepted,
    )


def wait_complete(settings: Settings, batch_id: str, *, timeout: float) -> BatchStatus:
    """The batch's status once it is complete; ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        with Store(settings.sql_url_value, migrate=False) as store:
            status = store.batch(batch_id)
        if status is not None and status.completed_at is not None:
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} not complete within {timeout:.0f} s")
        time.sleep(0.5)


def run(*, rows: int, roles: Sequence[str], data_dir: Path, output: Path, console: Console) -> list[Recovery]:
    """Each role killed in turn; prints the table and writes ``output`` (JSON)."""
    results = []
    for role in roles:
        with console.status(f"{rows:,} transactions, the {role} killed holding its messages"):
            results.append(measure(role, rows=rows, data_dir=data_dir, console=console))
    table = Table(
        title=f"Recovery: {rows:,} transactions, one role SIGKILLed holding its messages, restarted 1 s later"
    )
    for column in ("role killed", "messages held", "kill → complete s", "bound s", "counted once"):
        table.add_column(column, justify="right")
    for result in results:
        table.add_row(
            result.role,
            str(result.held),
            f"{result.kill_to_complete_seconds:.1f}",
            f"{result.bound_seconds:.0f}",
            "yes" if result.counted_once else "NO",
        )
    console.print(table)
    output.write_text(json.dumps([asdict(result) for result in results], indent=2))
    console.print(f"wrote {output}")
    return results
