"""All settings in one object, read from ``BILLING_*`` environment variables and CLI flags."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .cpus import available_cpus

#: Visibility timeouts a batch ``processing`` may go unchanged before it shows as stalled.
STALLED_LEASES = 3


def _default_home() -> Path:
    return Path(os.environ.get("BILLING_HOME", ".billing")).resolve()


class Settings(BaseSettings):
    """Pipeline settings. Every field can be set as ``BILLING_<NAME>`` (case-insensitive)."""

    model_config = SettingsConfigDict(env_prefix="BILLING_", extra="ignore", frozen=True)

    # Where the local stack keeps its data (Azurite, SQLite file, pid files).
    home: Path = Field(default_factory=_default_home)

    # Storage: a connection string, or an account URL used with DefaultAzureCredential.
    storage_connection_string: SecretStr | None = None
    storage_account_url: str | None = None

    # Send availability: an optional secondary account takes sends a failing primary cannot.
    secondary_storage_connection_string: SecretStr | None = None
    secondary_storage_account_url: str | None = None
    failover_interval: float = Field(default=10.0, ge=0)  # failing this long before failing over; 0 = at once
    failover_probe_interval: float = Field(default=5.0, gt=0)  # while failed over, try the primary this often
    backlog_queue_count: int = Field(default=10, ge=1, le=100)
    enable_syphon: bool = True  # the controller forwards backlog messages to the primary once it answers
    syphon_idle_interval: float = Field(default=60.0, gt=0)  # longest sleep between empty polls of a backlog queue

    # SQL store; default a SQLite file under ``home``.
    sql_url: SecretStr | None = None

    # Queues and containers.
    queue_prefix: str = "billing"
    partitions: int = Field(default=4, ge=1, le=64)
    inbox_container: str = "billing-inbox"
    work_container: str = "billing-work"
    reference_container: str = "billing-reference"

    # Work items.
    # Rows per work item: a text file's are runs of whole frames of its inbox blob holding at least this
    # many (the last one fewer), a Parquet file's at most this many (docs/performance.md).
    work_item_size: int = Field(default=40_000, ge=1, le=100_000)
    # Where a text file's work items have their rows: "inbox" names frames of the inbox blob, which the
    # processor reads (a message of a few hundred bytes); "message" carries the rows as read in the message,
    # as a Parquet file's do (the naive design's way: benchmark only).
    work_item_rows: Literal["inbox", "message"] = "inbox"
    # Ids per ids part: the initiator sends a batch's ids to the controller in parts of this many as it cuts
    # (the rest with the manifest), so that they are recorded while the file is still being cut. Like the work
    # item size, the same on every initiator (one cutting a file again sends the same parts).
    ids_part_rows: int = Field(default=300_000, ge=1)
    # The ledger's id filter (initiator/id_filter.py): its size in bits, a power of two, fixed when the
    # filter is first written; 12 bits an id keep false candidates near 1 % (docs/configuration.md).
    ledger_filter_bits: int = Field(default=1 << 24, ge=64)
    max_message_bytes: int = Field(default=64 * 1024, ge=1024)
    max_file_bytes: int = Field(default=50 * 1024**3, ge=1)  # a batch file larger than this is refused
    # A complete batch's claim-check blobs are deleted this long after it completed (the controller
    # sweeps); keep it above the visibility timeout so a late duplicate still finds its blob.
    claim_check_retention: float = Field(default=24 * 3600.0, ge=0)

    # Requests that vanish (docs/operations.md, "A file that sits unbilled"). `billing submit --wait` sends
    # again a request no initiator took within this many seconds, at most this many times.
    request_take_timeout: float = Field(default=60.0, gt=0)
    request_resends: int = Field(default=3, ge=0)
    # The controller sends again, looking this often, the request of an inbox file this old that no batch
    # accounts for and no initiator took; 0 = never.
    unbilled_resend_age: float = Field(default=1800.0, ge=0)

    # Listener (names follow the whitepaper; docs/configuration.md maps them to host.json).
    dequeue_batch_size: int = Field(default=32, ge=1, le=32)
    dequeue_tasks: int = Field(default=2, ge=1, le=256)
    visibility_timeout: int = Field(default=60, ge=1, le=7 * 24 * 3600)
    # How long a command (`billing submit --wait`, `status`, reports) waits for a SQL store it cannot reach.
    store_patience: float = Field(default=120.0, ge=0)
    min_idle_interval: float = Field(default=0.0, ge=0)
    max_idle_interval: float = Field(default=10.0, gt=0)
    backoff_delta: float = Field(default=0.1, gt=0)
    max_dequeue_count: int = Field(default=5, ge=1)
    scale_rule: Literal["drain", "whitepaper"] = "drain"
    target_drain_seconds: float = Field(default=10.0, gt=0)
    safety_poll_interval: float = Field(default=300.0, gt=0)
    # Push mode: while a queue holds messages leased by others (maybe a receiver that died), look this often.
    recovery_poll_interval: float = Field(default=5.0, gt=0)
    delete_on_receive: bool = False  # the naive design's early acknowledgement; benchmark only

    # Triggers: "work detected" hints. ``auto`` = Service Bus when configured, else the local bus.
    trigger_backend: Literal["auto", "local", "servicebus", "none"] = "auto"
    servicebus_connection_string: SecretStr | None = None
    servicebus_namespace: str | None = None  # fully qualified; used with DefaultAzureCredential
    secondary_servicebus_connection_string: SecretStr | None = None  # publishing fails over to it
    secondary_servicebus_namespace: str | None = None
    trigger_topic: str = "billing-triggers"
    trigger_subscription: str | None = None  # default: one per instance
    trigger_create_subscription: bool = True
    trigger_auto_delete_on_idle: float = Field(default=600.0, ge=300)
    trigger_container: str = "billing-triggers"

    # Storage SDK retry policy.
    retry_total: int = Field(default=5, ge=0)
    retry_backoff: float = Field(default=0.5, gt=0)
    request_timeout: float = Field(default=30.0, gt=0)

    # Health and metrics for orchestrators: /healthz, /readyz, /metrics on this port (0: any free one,
    # written to the role's state file); off when unset.
    health_port: int | None = Field(default=None, ge=0, le=65535)
    health_host: str = "0.0.0.0"  # a pod's probes and scrapes come from outside it

    # `billing serve`: poison replay and purge in the console need this token; without it the console is read-only.
    console_token: SecretStr | None = None

    # Graceful stop: how long in-flight work may take after SIGTERM/SIGINT.
    shutdown_deadline: float = Field(default=30.0, gt=0)

    # Concurrency.
    max_concurrent_sends: int = Field(default=32, ge=1)
    cpu_workers: int = Field(default_factory=available_cpus, ge=1)
    # How much lower than its processor the rating workers run in CPU priority (nice): on a machine they share with
    # the roles a batch waits on one at a time (controller, initiator), those go first; on their own it changes nothing.
    rating_niceness: int = Field(default=5, ge=0, le=19)
    # Work items a processor holds beyond those its workers are rating: this many per worker, read and
    # ready to start; the rest of the queue stays visible to other processors.
    prefetch_per_worker: int = Field(default=1, ge=0, le=8)

    @field_validator("console_token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: object) -> object:
        """An empty token would let an empty form value through: the console stays read-only instead."""
        return None if value == "" else value

    def as_env(self) -> dict[str, str]:
        """Every setting given explicitly, as ``BILLING_*`` variables for a child process (secrets
        included: hand them to processes, never print them)."""
        env = {"BILLING_HOME": str(self.home), "BILLING_SQL_URL": self.sql_url_value}
        for name in self.model_fields_set - {"home", "sql_url"}:
            value = getattr(self, name)
            if value is not None:
                env[f"BILLING_{name.upper()}"] = str(
                    value.get_secret_value() if isinstance(value, SecretStr) else value
                )
        return env

    @property
    def input_queues(self) -> list[str]:
        """The partitioned input queues, ``<prefix>-input-0..N-1``."""
        return [f"{self.queue_prefix}-input-{i}" for i in range(self.partitions)]

    @property
    def stalled_after(self) -> timedelta:
        """How long a batch ``processing`` may go unchanged before it shows as stalled: :data:`STALLED_LEASES`
        visibility timeouts (what a dead role's messages take to come back, and more)."""
        return timedelta(seconds=STALLED_LEASES * self.visibility_timeout)

    @property
    def results_queue(self) -> str:
        return f"{self.queue_prefix}-results"

    @property
    def requests_queue(self) -> str:
        """Batch requests from ``billing submit`` to the initiator."""
        return f"{self.queue_prefix}-requests"

    @property
    def all_queues(self) -> list[str]:
        return [self.requests_queue, *self.input_queues, self.results_queue]

    @property
    def backlog_queues(self) -> list[str]:
        """The secondary account's backlog queues, ``<prefix>-backlog-0..N-1``."""
        return [f"{self.queue_prefix}-backlog-{i}" for i in range(self.backlog_queue_count)]

    @property
    def has_secondary(self) -> bool:
        return self.secondary_storage_connection_string is not None or bool(self.secondary_storage_account_url)

    @property
    def poison_queues(self) -> list[str]:
        """The poison queue beside each queue."""
        return [poison_queue_name(queue) for queue in self.all_queues]

    @property
    def all_containers(self) -> list[str]:
        return [self.inbox_container, self.work_container, self.reference_container]

    @property
    def trigger_mode(self) -> Literal["local", "servicebus", "none"]:
        """The trigger backend in effect."""
        if self.trigger_backend != "auto":
            return self.trigger_backend
        return "servicebus" if self.servicebus_connection_string or self.servicebus_namespace else "local"

    @property
    def sql_url_value(self) -> str:
        """The SQL URL to connect to (SQLite under ``home`` unless configured)."""
        if self.sql_url is not None:
            return self.sql_url.get_secret_value()
        return f"sqlite:///{self.home / 'billing.db'}"


def poison_queue_name(queue: str) -> str:
    """``<queue>-poison``: where the messages of ``queue`` that can never be processed go."""
    return f"{queue}-poison"
