"""The engine a store runs on: SQLite or PostgreSQL, the Microsoft Entra login, write transactions.

Concurrency: every write locks the rows it changes first (``SELECT ... FOR UPDATE`` on PostgreSQL;
``BEGIN IMMEDIATE`` on SQLite, which serialises writers), so read-modify-write never loses an update.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa

from shared.errors import ConfigurationError, InfrastructureError

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

#: Azure Database for PostgreSQL server names; their Microsoft Entra login takes a token for this scope.
AZURE_POSTGRES = ".postgres.database.azure.com"
ENTRA_POSTGRES_SCOPE = "https://ossrdbms-aad.database.windows.net/.default"
#: The execution option that makes a SQLite transaction ``BEGIN IMMEDIATE`` (see :func:`writing`).
IMMEDIATE = "billing_sqlite_immediate"
#: How long a SQLite connection waits for another's lock before it fails.
SQLITE_BUSY_TIMEOUT_S = 30
#: The page size of a new SQLite database: larger than SQLite's 4 KiB, for cheaper bulk inserts (the ledger's ids, a
#: batch's aggregates; docs/performance.md). A database keeps the size it was made with.
SQLITE_PAGE_BYTES = 16384
T = TypeVar("T")
#: Rows written (or ids looked up) per statement.
CHUNK = 1000


class Patience:
    """How long a command waits for the SQL store to answer (``seconds``): a failure to reach it (the server down,
    restarting) is tried again, with back-off, until that long after the first failure in a row; ``notify`` is told
    once per such wait, in a line."""

    def __init__(self, seconds: float, notify: Callable[[str], None]) -> None:
        self.seconds = seconds
        self._notify = notify

    def retry(self, attempt: Callable[[], T], unreachable: tuple[type[BaseException], ...] = ()) -> T:
        """``attempt()`` until it succeeds: a failure to reach the store (``unreachable``, and SQLAlchemy's and this
        project's own errors for it) tried again within the bound, any other failure raised at once."""
        gave_up_at: float | None = None
        failures = 0
        caught: tuple[type[BaseException], ...] = (*unreachable, sa.exc.OperationalError, InfrastructureError)
        while True:
            try:
                return attempt()
            except caught as exc:
                now = time.monotonic()
                if gave_up_at is None:
                    gave_up_at = now + self.seconds
                    self._notify(
                        f"the SQL store does not answer ({_first_line(exc)}): trying again for {self.seconds:.0f} s"
                    )
                if now >= gave_up_at:
                    raise InfrastructureError(
                        f"the SQL store did not answer for {self.seconds:.0f} s: {_first_line(exc)}"
                    ) from exc
                failures += 1
                time.sleep(min(0.25 * 2 ** (failures - 1), 5.0, max(gave_up_at - now, 0.0)))


def _first_line(exc: BaseException) -> str:
    """An exception's message, its first line."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def open_engine(
    url: str, credential: TokenCredential | None = None, patience: Patience | None = None
) -> tuple[sa.URL, sa.Engine]:
    """The parsed URL and an engine for it. PostgreSQL logs in with a Microsoft Entra token from
    ``credential`` when one is given, or from ``DefaultAzureCredential`` when the URL names an Azure
    Database for PostgreSQL server and no password (the keyless way on Azure); with ``patience``, a new connection
    that cannot be made is tried again within its bound."""
    parsed = normalise_url(url)
    if credential is None and is_azure_postgres(parsed):
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    return parsed, create_engine(parsed, credential, patience)


def normalise_url(url: str) -> sa.URL:
    """Parse the URL; plain ``postgresql://`` means psycopg 3 (the driver this project installs)."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise ConfigurationError(f"invalid SQL URL: {exc}") from exc
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ConfigurationError(f"unsupported SQL backend {parsed.get_backend_name()!r} (sqlite or postgresql)")
    return parsed


def is_azure_postgres(url: sa.URL) -> bool:
    """Whether ``url`` names an Azure Database for PostgreSQL server and no password."""
    return url.get_backend_name() == "postgresql" and url.password is None and (url.host or "").endswith(AZURE_POSTGRES)


def create_engine(
    url: sa.URL, credential: TokenCredential | None = None, patience: Patience | None = None
) -> sa.Engine:
    """PostgreSQL with pre-ping (and, with ``credential``, an Entra token as each new connection's
    password; with ``patience``, connections tried again while the server cannot be reached); SQLite in WAL mode,
    pages of :data:`SQLITE_PAGE_BYTES` for a new database, 30 s busy timeout, transactions begun explicitly."""
    if url.get_backend_name() == "postgresql":
        engine = sa.create_engine(url, pool_pre_ping=True)
        if credential is not None:

            @sa.event.listens_for(engine, "do_connect")
            def _with_token(_dialect: Any, _record: Any, _args: Any, params: dict[str, Any]) -> None:
                params["password"] = credential.get_token(ENTRA_POSTGRES_SCOPE).token  # cached until near expiry

        if patience is not None:

            @sa.event.listens_for(engine, "do_connect")
            def _patiently(dialect: Any, _record: Any, args: list[Any], params: dict[str, Any]) -> Any:
                unreachable = (dialect.loaded_dbapi.OperationalError,)
                return patience.retry(lambda: dialect.connect(*args, **params), unreachable)

        return engine
    if url.database and url.database != ":memory:" and not url.database.startswith("file:"):
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # pysqlite must not BEGIN on its own; see _on_begin
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_S * 1000}")
        cursor.execute(f"PRAGMA page_size = {SQLITE_PAGE_BYTES}")  # before WAL: only a new database takes it
        _use_wal(cursor)
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(IMMEDIATE) else "BEGIN")

    return engine


def _use_wal(cursor: Any) -> None:
    """Switch the database to WAL (kept in the file, so once per database; an in-memory one stays as it is).
    The switch needs the only lock on the file, and SQLite answers "database is locked" at once, without its
    busy timeout, while another connection opens a new database: it is tried again until that timeout."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while cursor.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@contextmanager
def writing(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A write transaction (``BEGIN IMMEDIATE`` on SQLite); connection failures become InfrastructureError."""
    try:
        with engine.connect() as conn:
            conn.execution_options(**{IMMEDIATE: True})
            with conn.begin():
                yield conn
    except sa.exc.OperationalError as exc:
        raise InfrastructureError(f"SQL store unavailable: {exc}") from exc


def index_plans(conn: sa.Connection) -> None:
    """Have the rest of this transaction read tables by their indexes whatever the statistics say: on PostgreSQL the
    ledger's ids, loaded in bulk or grown much since they were last analysed, can look few enough to read whole
    (docs/performance.md, "The id ledger"). SQLite plans by its indexes anyway."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` as lists of at most ``size``, taken as they come (an iterator is never held whole)."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk
