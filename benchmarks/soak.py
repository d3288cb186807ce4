"""``billing soak``: the pipeline under sustained load while faults overlap, then checked to the minor unit.

A fresh local stack (Azurite persisted on disk; SQLite, or a PostgreSQL server of its own), the three
roles (two processors) reaching storage through the fault proxy (:mod:`benchmarks.fault_proxy`). For
``minutes`` minutes batches of mixed sizes, formats (CSV, JSON Lines, Parquet), reject rates and billing
periods (some reusing an earlier batch's transaction ids, every one with repeated ids inside) are
submitted back to back, two to three in flight, while a fault is injected every few seconds at random:
a role SIGKILLed (started again after a random pause), two roles at once, storage frozen (SIGSTOP, then
SIGCONT, of the Azurite process group), the proxy failing a share of the roles' requests (errors and
lost replies, resets and hangs, slow responses), and PostgreSQL restarted when it is the store.

Then every fault is undone, every batch is waited for, and checked: complete, each work item counted
once, the accepted and rejected counts and the aggregates equal to :mod:`benchmarks.expected` (computed
from the file alone); every queue drained and every poison queue empty (an entry that is a late copy of
work already counted, ``missing_claim_check``, is listed as accounted for); every role stopped cleanly.
A batch the ledger refused for sharing ids with a batch debatched at the same time (``docs/architecture.md``,
"Transaction ids across batches") is submitted again under a new id, as its refusal asks; it must have
counted nothing, and the new batch must be exact.
Each role's RSS and open file descriptors are sampled every few seconds (``/proc``), and the storage
requests per 1,000 transactions are counted by the roles and clients and, separately, by the proxy.
Prints a summary, writes JSON (``output``) and a PNG of RSS and file descriptors over time.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import pyarrow.compute as pc
import pyarrow.parquet as pq
from azure.storage.queue import QueueClient
from pydantic import SecretStr
from rich.console import Console
from rich.table import Table

from billing import poison, reports
from billing.demo import role_processes, start_role
from billing.sample import generate, sample_price_book_bytes, sample_tax_table_bytes
from shared.localstack import AzuriteStack
from shared.settings import Settings
from store import FINAL_STATES, BatchStatus, Store

from .expected import Expected, expected
from .fault_proxy import SLOW, FaultProxy
from .postgres import PostgresServer

StoreKind = Literal["sqlite", "postgresql"]
#: The roles' settings for the soak: small work items (many messages in flight when a fault hits), small ids
#: parts (a batch of more than 10,000 ids sends some), a short lease (what a killed role held comes back soon),
#: and room for the redeliveries the faults cause.
KNOBS: dict[str, Any] = {
    "work_item_size": 4000,
    "ids_part_rows": 10_000,
    "visibility_timeout": 10,
    "max_dequeue_count": 50,
}
PROCESSORS = 2
SLOTS = ("initiator", *(f"processor-{n}" for n in range(1, PROCESSORS + 1)), "controller")
FAULT_GAP = (2.0, 6.0)  # seconds between one injection and the next
RESTART_AFTER = (0.5, 5.0)  # seconds a killed role stays down
FREEZE = (2.0, 8.0)  # seconds storage stays frozen
PROXY_FAULT = (3.0, 10.0)  # seconds the proxy fails requests
POSTGRES_DOWN = (1.0, 4.0)
SAMPLE_INTERVAL = 3.0  # seconds between two looks at each role's RSS and file descriptors
IN_FLIGHT = (2, 3)
ROWS = (1_000, 60_000)  # a batch's rows, drawn log-uniformly
FORMATS = ("csv", "jsonl", "parquet")
REJECT_RATES = (0.002, 0.01, 0.05)
REUSE_IDS = 0.2  # share of batches that reuse an earlier batch's transaction ids
SETTLE_TIMEOUT = 600.0  # seconds, after the faults, for every batch to end
DRAIN_TIMEOUT = 120.0  # seconds, after that, for every queue to be empty
#: Poison reasons of a message whose work is counted already (a late copy).
ACCOUNTED_POISON = frozenset({"missing_claim_check"})
#: What the ledger's refusal of a batch debatched at the same time as an earlier one says (:mod:`store.ledger.ids`).
SUBMIT_AGAIN = "debatched at the same time"
#: How much longer than its minutes a soak may go on to submit its ``min_batches``.
OVERTIME = 3.0


@dataclass
class SoakBatch:
    batch_id: str
    format: str
    rows: int
    period: str
    reject_rate: float
    seed: int
    submitted_seconds: float  # since the soak began
    submit_requests: int = 0
    finished_seconds: float | None = None
    state: str = "submitted"
    work_items: int | None = None
    completed_items: int = 0
    poisoned_items: int = 0
    accepted: int = 0
    rejected: int = 0
    transactions_recorded: int = 0
    expected_accepted: int | None = None
    expected_rejected: int | None = None
    counted_once: bool = False
    exact: bool = False
    mismatches: int = 0  # aggregate keys whose figures differ from the expected ones
    error: str = ""
    refused_reason: str = ""
    submitted_again_as: str = ""  # the batch id it was submitted again under, after a refusal that asks so


@dataclass(frozen=True)
class Fault:
    at_seconds: float
    kind: str
    target: str
    seconds: float  # how long it lasted (down, frozen, failing)


@dataclass(frozen=True)
class Sample:
    at_seconds: float
    slot: str
    pid: int
    rss_mib: float
    fds: int


@dataclass
class SoakReport:
    ok: bool
    problems: list[str]
    minutes: float
    min_batches: int
    batches_per_minute: float | None  # None: back to back
    store: str
    seed: int
    started_at: str
    wall_seconds: float
    load_average: list[float]
    settings: dict[str, Any]
    batches: list[SoakBatch]
    faults: list[Fault]  # one per role for "kill two"
    faults_by_kind: dict[str, int]  # injections
    transactions: int  # accepted, over every batch
    storage_requests: dict[str, Any]
    queues_left: dict[str, int]
    poison: list[dict[str, Any]]
    roles: dict[str, dict[str, Any]]
    exits: dict[str, int | None]
    samples: list[Sample] = field(default_factory=list)


class Soak:
    """One soak: :meth:`run` does it all and returns the report."""

    def __init__(
        self,
        *,
        minutes: float,
        store: StoreKind,
        seed: int,
        console: Console,
        min_batches: int = 0,
        batches_per_minute: float | None = None,
    ) -> None:
        self.minutes, self.store_kind, self.seed, self.console = minutes, store, seed, console
        self.min_batches, self.batches_per_minute = min_batches, batches_per_minute
        self.rng = random.Random(seed)  # the faults (what happens when depends on timing)
        self.plan = random.Random(f"batches-{seed}")  # the batches: the same sequence for the same seed
        self.batches: list[SoakBatch] = []
        self.files: dict[str, Path] = {}  # each batch's file, for what it must bill (computed in seq order at the end)
        self.faults: list[Fault] = []
        self.samples: list[Sample] = []
        self.problems: list[str] = []
        self.lock = threading.Lock()
        self.submitting = threading.Event()
        self.clock = time.monotonic()
        self.price_book, self.tax_table = sample_price_book_bytes().decode(), sample_tax_table_bytes().decode()

    def now(self) -> float:
        return time.monotonic() - self.clock

    def run(self) -> SoakReport:
        started_at, load = datetime.now(UTC), [round(x, 2) for x in os.getloadavg()]
        with contextlib.ExitStack() as scope:
            home = Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="billing-soak-")))
            self.home = home
            azurite = AzuriteStack(home=home, persist=True)
            scope.callback(azurite.stop)
            connection = azurite.start()
            self.azurite = azurite
            self.postgres: PostgresServer | None = None
            sql: dict[str, Any] = {}
            if self.store_kind == "postgresql":
                # Its own temporary folder: as root the server runs as `postgres`, which must enter it.
                self.postgres = PostgresServer(
                    data_dir=Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="soak-pg-")))
                )
                sql["sql_url"] = SecretStr(self.postgres.start())
                scope.callback(self.postgres.stop)
            self.settings = Settings(home=home, storage_connection_string=SecretStr(connection), **KNOBS, **sql)
            proxy = scope.enter_context(FaultProxy(connection, seed=self.seed))
            self.proxy = proxy
            roles = self.settings.model_copy(update={"storage_connection_string": SecretStr(proxy.connection_string)})
            self.role_env = {**os.environ, **roles.as_env()}
            self.env = {**os.environ, **self.settings.as_env()}
            (home / "ref").mkdir()
            (home / "ref" / "pricebook.csv").write_text(self.price_book)
            (home / "ref" / "taxes.csv").write_text(self.tax_table)
            with role_processes(roles, home / "logs", processors=PROCESSORS) as processes:
                self.processes = processes
                self._wait_up(timeout=120)
                submitter = threading.Thread(target=self._submit_loop, name="soak-submitter", daemon=True)
                self.submitting.set()
                submitter.start()
                self._inject_until(self.minutes * 60)
                self.submitting.clear()
                submitter.join(timeout=600)
                if len(self.batches) < self.min_batches:
                    submitted = f"{len(self.batches)} batches submitted in {self.now() / 60:.1f} minutes"
                    self.problems.append(f"{submitted}, not the {self.min_batches} asked for")
                self.console.print(f"{self.now():.0f} s: faults over; waiting for {len(self.batches)} batches")
                self._wait_up(timeout=120)
                self._settle()
                queues_left = self._drain()
                found = self._poison()
                self._check_batches()
            exits = {slot: process.returncode for slot, process in zip(SLOTS, processes, strict=True)}
            for slot, code in exits.items():
                if code != 0:
                    self.problems.append(f"{slot} exited {code} when stopped at the end")
            requests = self._requests()
            if self.problems and (kept := self._keep_logs()) is not None:
                self.problems.append(f"the roles' logs are kept in {kept}")
        return self._report(started_at, load, queues_left, found, exits, requests)

    # -- load ------------------------------------------------------------------------------------------------

    def _submit_loop(self) -> None:
        """Keep two to three batches in flight while the faults go on, a new one no sooner than
        :attr:`batches_per_minute` allows."""
        target, due = self.plan.choice(IN_FLIGHT), 0.0
        try:
            while self.submitting.is_set():
                if self._in_flight() < target and self.now() >= due:
                    batch = self._submit_one()
                    if self.batches_per_minute:
                        due = batch.submitted_seconds + 60 / self.batches_per_minute
                    target = self.plan.choice(IN_FLIGHT)
                else:
                    time.sleep(0.5)
        except Exception as exc:  # the soak's own failure: say so rather than pass on fewer batches
            self.problems.append(f"the submitter stopped: {exc!r}")

    def _in_flight(self) -> int:
        """The batches not finished yet; a batch refused with :data:`SUBMIT_AGAIN` is submitted again."""
        waiting = [b for b in self.batches if b.finished_seconds is None]
        again = []
        for batch, status in zip(waiting, self._statuses([b.batch_id for b in waiting]), strict=True):
            if status is not None and status.state in FINAL_STATES:
                batch.finished_seconds = round(self.now(), 2)
                batch.refused_reason = status.refused_reason or ""
                if SUBMIT_AGAIN in batch.refused_reason:
                    again.append(batch)
        for batch in again:
            self._submit_one(again=batch)
        return sum(b.finished_seconds is None for b in self.batches)

    def _submit_one(self, again: SoakBatch | None = None) -> SoakBatch:
        """Write and submit the next batch, or submit ``again``'s file once more under a new id."""
        if again is None:
            number = len(self.batches) + 1
            reuse = self.batches and self.plan.random() < REUSE_IDS
            seed = self.plan.choice(self.batches).seed if reuse else self.seed * 10_000 + number
            rows = round(10 ** self.plan.uniform(math.log10(ROWS[0]), math.log10(ROWS[1])))
            fmt = self.plan.choice(FORMATS)
            month = self.plan.randint(1, 6)
            batch = SoakBatch(
                batch_id=f"soak-{self.seed}-{number:04d}",
                format=fmt,
                rows=rows,
                period=f"2026-{month:02d}",
                reject_rate=self.plan.choice(REJECT_RATES),
                seed=seed,
                submitted_seconds=0.0,
            )
            path = self.home / "batches" / f"soak-{number:04d}.{fmt}"
            write_batch(path, rows=rows, fmt=fmt, seed=seed, reject_rate=batch.reject_rate, month=month)
        else:
            batch = SoakBatch(
                batch_id=f"{again.batch_id}-again",
                **{key: getattr(again, key) for key in ("format", "rows", "period", "reject_rate", "seed")},
                submitted_seconds=0.0,
            )
            again.submitted_again_as = batch.batch_id
            path = self.files[again.batch_id]
        ref = self.home / "ref"
        command = [sys.executable, "-m", "billing", "submit", str(path), "--batch-id", batch.batch_id]
        command += ["--pricebook", str(ref / "pricebook.csv"), "--taxes", str(ref / "taxes.csv")]
        batch.submitted_seconds = round(self.now(), 2)
        with self.lock:
            self.batches.append(batch)
        try:
            done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=600, check=False)
        except subprocess.TimeoutExpired:
            batch.error = "billing submit did not return within 600 s"
        else:
            found = re.search(r"^batch \S+ submitted \(\w+; (\d+) storage requests\)", done.stdout, re.MULTILINE)
            batch.submit_requests = int(found.group(1)) if found else 0
            if done.returncode != 0:
                batch.error = f"billing submit exited {done.returncode}: {done.stderr.strip()[-500:]}"
        if batch.error:
            batch.finished_seconds = round(self.now(), 2)  # nothing to wait for
        self.files[batch.batch_id] = path
        return batch

    def _statuses(self, batch_ids: list[str]) -> list[BatchStatus | None]:
        """The batches' stored status (None where unknown, or while the store cannot be read)."""
        if not batch_ids:
            return []
        try:
            with Store(self.settings.sql_url_value, migrate=False) as store:
                return [store.batch(batch_id) for batch_id in batch_ids]
        except Exception:  # the store restarting, or not created yet
            return [None] * len(batch_ids)

    # -- faults ----------------------------------------------------------------------------------------------

    def _inject_until(self, seconds: float) -> None:
        """Inject faults until ``seconds`` after the start, and on until :attr:`min_batches` were submitted (at
        most :data:`OVERTIME` times as long), sampling the roles meanwhile; then undo them all."""
        undo: list[tuple[float, Callable[[], None]]] = []
        next_fault, next_sample = self.now() + self.rng.uniform(*FAULT_GAP), 0.0
        self.down: set[int] = set()
        self.frozen = self.proxy_failing = self.postgres_down = False
        try:
            while self.now() < seconds or (len(self.batches) < self.min_batches and self.now() < seconds * OVERTIME):
                for due, action in sorted(undo, key=lambda pair: pair[0]):
                    if due <= self.now():
                        undo.remove((due, action))
                        action()
                if self.now() >= next_sample:
                    self._sample()
                    next_sample = self.now() + SAMPLE_INTERVAL
                if self.now() >= next_fault:
                    undo.extend(self._inject())
                    next_fault = self.now() + self.rng.uniform(*FAULT_GAP)
                time.sleep(0.2)
        finally:
            for _, action in sorted(undo, key=lambda pair: pair[0]):
                action()
        self._sample()

    def _inject(self) -> list[tuple[float, Callable[[], None]]]:
        """One fault drawn at random among those that can happen now; what undoes it, and when."""
        up = [index for index in range(len(SLOTS)) if index not in self.down]
        kinds = ["kill"] * 3 if up else []
        kinds += ["kill two"] if len(up) >= 2 else []
        kinds += ["storage frozen"] if not self.frozen else []
        kinds += ["proxy errors", "proxy resets", "proxy slow"] if not self.proxy_failing else []
        kinds += ["postgresql restart"] if self.postgres is not None and not self.postgres_down else []
        if not kinds:
            return []
        kind, at = self.rng.choice(kinds), round(self.now(), 2)
        if kind in ("kill", "kill two"):
            undo = []
            for index in self.rng.sample(up, 1 if kind == "kill" else 2):
                pause = self.rng.uniform(*RESTART_AFTER)
                self.processes[index].kill()
                self.processes[index].wait()
                self.down.add(index)
                self.faults.append(Fault(at, kind, SLOTS[index], round(pause, 2)))
                undo.append((self.now() + pause, self._restarter(index)))
            return undo
        if kind == "storage frozen":
            pid, seconds = self.azurite.pid, self.rng.uniform(*FREEZE)
            if pid is None:
                return []
            os.killpg(pid, signal.SIGSTOP)
            self.frozen = True
            self.faults.append(Fault(at, kind, "azurite", round(seconds, 2)))

            def thaw() -> None:
                os.killpg(pid, signal.SIGCONT)
                self.frozen = False

            return [(self.now() + seconds, thaw)]
        if kind == "postgresql restart":
            assert self.postgres is not None
            postgres, seconds = self.postgres, self.rng.uniform(*POSTGRES_DOWN)
            postgres.stop()
            self.postgres_down = True
            self.faults.append(Fault(at, kind, "postgresql", round(seconds, 2)))

            def start() -> None:
                postgres.start()
                self.postgres_down = False

            return [(self.now() + seconds, start)]
        seconds = self.rng.uniform(*PROXY_FAULT)
        self.proxy.kinds, rate = {
            "proxy errors": (("503", "500", "lost_reply"), 0.3),
            "proxy resets": (("reset", "timeout"), 0.2),
            "proxy slow": ((SLOW,), 0.5),
        }[kind]
        self.proxy.hang = self.rng.uniform(0.5, 3.0)
        self.proxy.set_rate(rate)
        self.proxy_failing = True
        self.faults.append(Fault(at, kind, "storage requests of the roles", round(seconds, 2)))

        def heal() -> None:
            self.proxy.set_rate(0.0)
            self.proxy_failing = False

        return [(self.now() + seconds, heal)]

    def _restarter(self, index: int) -> Callable[[], None]:
        def restart() -> None:
            role = SLOTS[index].split("-")[0]
            self.processes[index] = start_role(role, self.role_env, self.home / "logs" / f"{role}-{index}.log")
            self.down.discard(index)

        return restart

    def _wait_up(self, *, timeout: float) -> None:
        """Wait until every role has reached storage (its state file is there)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self._is_up(slot, p.pid) for slot, p in zip(SLOTS, self.processes, strict=True)):
                return
            time.sleep(0.5)
        self.problems.append(f"not every role was up within {timeout:.0f} s")

    def _sample(self) -> None:
        """Each role's RSS and open file descriptors, once it is up (a role starting is not measured)."""
        at = round(self.now(), 1)
        for slot, process in zip(SLOTS, self.processes, strict=True):
            if process.poll() is not None or not self._is_up(slot, process.pid):
                continue
            with contextlib.suppress(OSError, ValueError):
                status = Path(f"/proc/{process.pid}/status").read_text()
                found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
                fds = len(os.listdir(f"/proc/{process.pid}/fd"))
                if found:
                    self.samples.append(Sample(at, slot, process.pid, round(int(found.group(1)) / 1024, 1), fds))

    def _is_up(self, slot: str, pid: int) -> bool:
        """Whether the role has reached storage and serves (it keeps a state file named after its pid)."""
        return (self.home / "state" / f"{slot.split('-')[0]}-{pid}.json").exists()

    # -- the end -----------------------------------------------------------------------------------------------

    def _settle(self) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        next_sample = 0.0
        while self._in_flight() and time.monotonic() < deadline:
            if self.now() >= next_sample:
                self._sample()
                next_sample = self.now() + SAMPLE_INTERVAL
            time.sleep(1.0)
        if left := [b.batch_id for b in self.batches if b.finished_seconds is None]:
            self.problems.append(f"{len(left)} batches not finished {SETTLE_TIMEOUT:.0f} s after the faults: {left}")

    def _drain(self) -> dict[str, int]:
        """Wait (bounded) until every pipeline queue is empty (late copies absorbed); what is left."""
        connection = self.env["BILLING_STORAGE_CONNECTION_STRING"]
        clients = [QueueClient.from_connection_string(connection, q) for q in self.settings.all_queues]
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while True:
            left = {c.queue_name: c.get_queue_properties().approximate_message_count or 0 for c in clients}
            if not any(left.values()) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        if any(left.values()):
            self.problems.append(f"messages left in the queues {DRAIN_TIMEOUT:.0f} s after the last batch: {left}")
        return left

    def _poison(self) -> list[dict[str, Any]]:
        import asyncio

        found = []
        for queue, count, entries in asyncio.run(poison.overview(self.settings)):
            for entry in entries:
                accounted = entry.reason in ACCOUNTED_POISON
                found.append(
                    {"queue": queue, "reason": entry.reason, "message_id": entry.message_id, "accounted": accounted}
                )
                if not accounted:
                    self.problems.append(f"poisoned in {queue}: {entry.reason} ({entry.message_id})")
            if count > len(entries):
                self.problems.append(f"{queue}: about {count - len(entries)} more poisoned messages than listed")
        return found

    def _expected(self, statuses: list[BatchStatus | None]) -> dict[str, Expected]:
        """What each batch must bill, taken in sequence order: an id an earlier complete batch counted is a
        duplicate in a later one."""
        taken: set[str] = set()
        wants = {}
        numbered = [(s.seq, b.batch_id, s.state) for b, s in zip(self.batches, statuses, strict=True) if s and s.seq]
        for _, batch_id, state in sorted(numbered):
            wants[batch_id] = expected(self.files[batch_id], self.price_book, self.tax_table, taken)
            if state == "complete":
                taken |= wants[batch_id].ids
        return wants

    def _check_batches(self) -> None:
        """Each batch complete, each work item counted once, its counts and aggregates as expected."""
        statuses = self._statuses([b.batch_id for b in self.batches])
        wants = self._expected(statuses)
        for batch, status in zip(self.batches, statuses, strict=True):
            want = wants.get(batch.batch_id)
            if status is not None:
                batch.state = status.state.value
                batch.work_items, batch.completed_items = status.work_items, status.completed_items
                batch.poisoned_items, batch.accepted, batch.rejected = (
                    status.poisoned_items,
                    status.accepted,
                    status.rejected,
                )
                batch.transactions_recorded = status.transactions_recorded
                batch.counted_once = (
                    batch.state == "complete"
                    and status.completed_items == status.work_items
                    and status.poisoned_items == 0
                    and status.transactions_recorded == status.accepted
                )
            if want is not None:
                batch.expected_accepted, batch.expected_rejected = want.accepted, want.rejected
            if batch.counted_once and want is not None:
                with Store(self.settings.sql_url_value, migrate=False) as store:
                    got = stored_aggregates(store, batch.batch_id)
                batch.mismatches = sum(got.get(k) != v for k, v in want.aggregates.items()) + len(
                    got.keys() - want.aggregates.keys()
                )
                batch.exact = (batch.accepted, batch.rejected) == (
                    want.accepted,
                    want.rejected,
                ) and not batch.mismatches
            if batch.submitted_again_as and status is not None and status.accepted == status.rejected == 0:
                continue  # refused whole, as it should be; the batch it was submitted again as is checked
            if not batch.exact:
                why = batch.error or (
                    f"state {batch.state}, {batch.completed_items}/{batch.work_items} items, "
                    f"{batch.poisoned_items} poisoned, {batch.transactions_recorded} of {batch.accepted} recorded, "
                    f"accepted/rejected {batch.accepted}/{batch.rejected} (expected {batch.expected_accepted}/"
                    f"{batch.expected_rejected}), {batch.mismatches} aggregates differ"
                )
                self.problems.append(f"batch {batch.batch_id} not exact: {why}")

    def _requests(self) -> dict[str, Any]:
        """Storage requests: the roles' own counters (their last state files) plus the clients', and what
        the proxy forwarded to Azurite for the roles; per 1,000 accepted transactions."""
        roles = 0
        for path in (self.home / "state").glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                roles += int(json.loads(path.read_text())["requests"]["total"])
        clients = sum(b.submit_requests for b in self.batches)
        accepted = max(1, sum(b.accepted for b in self.batches))
        forwarded = self.proxy.total(self.proxy.forwarded)
        injected: Counter[str] = Counter()
        for counts in self.proxy.injected.values():
            injected.update(counts)
        return {
            "roles": roles,
            "clients": clients,
            "per_1000": round(1000 * (roles + clients) / accepted, 2),
            "proxy_forwarded": forwarded,
            "proxy_forwarded_per_1000": round(1000 * forwarded / accepted, 2),
            "proxy_injected": dict(injected),
        }

    def _keep_logs(self) -> Path | None:
        """Copy the roles' logs out of the scratch folder (for a soak that found problems)."""
        kept = Path(tempfile.mkdtemp(prefix="billing-soak-logs-"))
        with contextlib.suppress(OSError):
            shutil.copytree(self.home / "logs", kept, dirs_exist_ok=True)
            return kept
        return None

    def _report(
        self,
        started_at: datetime,
        load: list[float],
        queues_left: dict[str, int],
        found: list[dict[str, Any]],
        exits: dict[str, int | None],
        requests: dict[str, Any],
    ) -> SoakReport:
        roles: dict[str, dict[str, Any]] = {}
        for slot in SLOTS:
            mine = [s for s in self.samples if s.slot == slot]
            lives = {pid: [s for s in mine if s.pid == pid] for pid in {s.pid for s in mine}}
            longest = max(lives.values(), key=lambda life: life[-1].at_seconds - life[0].at_seconds, default=[])
            roles[slot] = {
                "restarts": sum(f.target == slot for f in self.faults),
                "pids": len(lives),
                "rss_mib": _spread([s.rss_mib for s in mine]),
                "fds": _spread([s.fds for s in mine]),
                # the process that lived longest: what grows within one life shows here
                "longest_life": {
                    "pid": longest[0].pid,
                    "seconds": round(longest[-1].at_seconds - longest[0].at_seconds, 1),
                    "rss_mib": _spread([s.rss_mib for s in longest]),
                    "fds": _spread([s.fds for s in longest]),
                }
                if longest
                else {},
            }
        return SoakReport(
            ok=not self.problems,
            problems=self.problems,
            minutes=self.minutes,
            min_batches=self.min_batches,
            batches_per_minute=self.batches_per_minute,
            store=self.store_kind,
            seed=self.seed,
            started_at=started_at.isoformat(),
            wall_seconds=round(self.now(), 1),
            load_average=load,
            settings={**KNOBS, "processors": PROCESSORS, "partitions": self.settings.partitions},
            batches=self.batches,
            faults=self.faults,
            faults_by_kind=dict(Counter(kind for _, kind in {(f.at_seconds, f.kind) for f in self.faults})),
            transactions=sum(b.accepted for b in self.batches),
            storage_requests=requests,
            queues_left=queues_left,
            poison=found,
            roles=roles,
            exits=exits,
            samples=self.samples,
        )


def write_batch(path: Path, *, rows: int, fmt: str, seed: int, reject_rate: float, month: int) -> None:
    """A sample batch (:func:`billing.sample.generate`) moved to billing period 2026-``month``: its
    week of March 2026 written as the same days of that month."""
    path.parent.mkdir(parents=True, exist_ok=True)
    generate(rows, path, seed=seed, fmt=fmt, reject_rate=reject_rate)
    if month == 3:
        return
    old, new = "2026-03-", f"2026-{month:02d}-"
    if fmt == "parquet":
        table = pq.read_table(path)
        index = table.schema.get_field_index("timestamp")
        table = table.set_column(index, "timestamp", pc.replace_substring(table.column("timestamp"), old, new))
        pq.write_table(table, path, compression="zstd")
    else:
        path.write_bytes(path.read_bytes().replace(old.encode(), new.encode()))


def stored_aggregates(store: Store, batch_id: str) -> dict[tuple[str, str, str, str], list[Any]]:
    """The batch's aggregates as the store reports them, keyed as :mod:`benchmarks.expected` keys them."""
    records = reports.aggregates(store, batch_id).to_dict("records")
    return {
        (str(r["account_id"]), str(r["product"]), str(r["billing_day"]), str(r["currency"])): [
            int(r["transactions"]),
            Decimal(str(r["quantity"])),
            int(r["net"]),
            int(r["tax"]),
            int(r["total"]),
        ]
        for r in records
    }


def _spread(values: list[float] | list[int]) -> dict[str, float]:
    if not values:
        return {}
    return {"first": values[0], "peak": max(values), "last": values[-1]}


def _three(spread: dict[str, float]) -> str:
    return " / ".join(f"{spread.get(key, 0):.0f}" for key in ("first", "peak", "last"))


def _chart(report: SoakReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rss, fds) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    for slot in SLOTS:
        mine = [s for s in report.samples if s.slot == slot]
        minutes = [s.at_seconds / 60 for s in mine]
        rss.plot(minutes, [s.rss_mib for s in mine], ".", markersize=3, label=slot)
        fds.plot(minutes, [s.fds for s in mine], ".", markersize=3, label=slot)
    for fault in report.faults:
        if fault.kind.startswith("kill"):
            rss.axvline(fault.at_seconds / 60, color="grey", linewidth=0.3)
    rss.set_ylabel("RSS MiB")
    rss.set_title(f"billing soak: {report.minutes:g} min on {report.store} (grey: a role killed)")
    rss.legend(loc="upper left", fontsize="small")
    fds.set_ylabel("open file descriptors")
    fds.set_xlabel("minutes")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _print(report: SoakReport, console: Console) -> None:
    done = [b for b in report.batches if b.exact]
    summary = Table(title=f"Soak: {report.minutes:g} min on {report.store}, seed {report.seed}", show_header=False)
    summary.add_row("verdict", "[green]exact, nothing lost[/green]" if report.ok else "[red]PROBLEMS[/red]")
    summary.add_row("batches exact / submitted", f"{len(done)} / {len(report.batches)}")
    pace = report.batches_per_minute
    summary.add_row("new batches", f"at most {pace:g} a minute" if pace else "back to back")
    if again := [b for b in report.batches if b.submitted_again_as]:
        summary.add_row(f"refused ({SUBMIT_AGAIN}), submitted again", ", ".join(b.batch_id for b in again))
    summary.add_row("transactions accepted", f"{report.transactions:,}")
    summary.add_row("faults", ", ".join(f"{kind} {n}" for kind, n in sorted(report.faults_by_kind.items())))
    requests = report.storage_requests
    summary.add_row(
        "storage requests / 1,000 tx", f"{requests['per_1000']} (proxy saw {requests['proxy_forwarded_per_1000']})"
    )
    summary.add_row("queues left", str(sum(report.queues_left.values())))
    summary.add_row("poison entries", f"{len(report.poison)} ({sum(p['accounted'] for p in report.poison)} accounted)")
    summary.add_row("wall time", f"{report.wall_seconds:.0f} s")
    console.print(summary)
    roles = Table(title="Per role over the soak (first / peak / last)")
    for column in ("role", "killed", "RSS MiB", "open fds", "longest life", "its RSS MiB", "its fds"):
        roles.add_column(column, justify="right")
    for slot, figures in report.roles.items():
        life = figures["longest_life"]
        roles.add_row(
            slot,
            str(figures["restarts"]),
            _three(figures["rss_mib"]),
            _three(figures["fds"]),
            f"{life.get('seconds', 0):.0f} s",
            _three(life.get("rss_mib", {})),
            _three(life.get("fds", {})),
        )
    console.print(roles)
    for problem in report.problems:
        console.print(f"[red]problem:[/red] {problem}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run(
    *,
    minutes: float,
    store: StoreKind,
    seed: int,
    output: Path,
    console: Console,
    min_batches: int = 0,
    batches_per_minute: float | None = None,
) -> SoakReport:
    """The soak; prints the summary, writes ``output`` (JSON) and ``<output>.png``. Exit status is the caller's."""
    signal.signal(signal.SIGTERM, _interrupt)  # stop as on Ctrl-C: roles stopped, storage thawed and stopped
    soak = Soak(
        minutes=minutes,
        store=store,
        seed=seed,
        console=console,
        min_batches=min_batches,
        batches_per_minute=batches_per_minute,
    )
    report = soak.run()
    _print(report, console)
    output.write_text(json.dumps(asdict(report), indent=2))
    chart = output.with_suffix(".png")
    _chart(report, chart)
    console.print(f"wrote {output} and {chart}")
    return report
