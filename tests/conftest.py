"""Fixtures for every test folder: real Azurite and a real PostgreSQL server once per session, a
fresh database, per-test settings (queue prefix and containers of the test's own) and real role
processes. The helpers behind them live in ``support/``."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from benchmarks.postgres import PostgresNotInstalled, PostgresServer
from shared.messaging.storage import Storage
from shared.settings import Settings
from support.azurite import running_azurite
from support.databases import copy_sqlite, migrated, postgres_database
from support.roles import Roles

#: Folders in the order a worker is handed their tests: the longest first, so that no worker is left with a
#: long run to finish alone while the others have nothing more to take.
FOLDER_ORDER = ("system", "deploy", "integration", "unit")
#: pytest-xdist workers per core (``-n auto``): most of a system test is waiting (leases, outages, idle polls),
#: its role processes using well under a core together.
WORKERS_PER_CORE = 2


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """The workers ``-n auto`` starts: :data:`WORKERS_PER_CORE` for each core of this machine."""
    return WORKERS_PER_CORE * (os.cpu_count() or 1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the slow runs first, then the folders in :data:`FOLDER_ORDER` (a stable
    sort: within each, the order of collection). Each worker sorts alike, as xdist requires."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return

    def rank(item: pytest.Item) -> tuple[bool, int]:
        folder = item.path.parent.name
        return item.get_closest_marker("slow") is None, FOLDER_ORDER.index(folder) if folder in FOLDER_ORDER else 0

    items.sort(key=rank)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A persistent Azurite on free loopback ports for the whole session; yields its connection string."""
    with running_azurite(tmp_path_factory.mktemp("azurite"), persist=True) as stack:
        yield stack.connection_string() or ""


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A running PostgreSQL server for the whole session (tests may stop and start it again).

    Missing PostgreSQL binaries fail the run under CI (``CI`` set) and skip the test elsewhere.
    """
    # Not tmp_path_factory: as root the server runs as `postgres`, which cannot enter pytest's 0700 dirs.
    with tempfile.TemporaryDirectory(prefix="billing-pg-") as scratch:
        server = PostgresServer(data_dir=Path(scratch))
        try:
            server.start()
        except PostgresNotInstalled as exc:
            message = f"{exc} (needed by the PostgreSQL tests)"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """The SQLAlchemy URL of the session server's ``postgres`` database."""
    return postgres_server.url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite store migrated to the newest revision once per test process, copied by ``migrated_url``."""
    path = tmp_path_factory.mktemp("template") / "billing.db"
    migrated(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def postgres_template(postgres_url: str) -> Iterator[str]:
    """The name of a database on the session's PostgreSQL migrated to the newest revision once per test process,
    copied by ``migrated_url``."""
    with postgres_database(postgres_url) as url:
        yield str(sa.make_url(migrated(url)).database)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database for one test: a SQLite file, or a new database on the session's PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'billing.db'}"
        return
    with postgres_database(request.getfixturevalue("postgres_url")) as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def migrated_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database for one test, migrated to the newest revision: a copy of the process's template."""
    if request.param == "sqlite":
        yield copy_sqlite(request.getfixturevalue("sqlite_template"), tmp_path / "billing.db")
        return
    template = request.getfixturevalue("postgres_template")
    with postgres_database(request.getfixturevalue("postgres_url"), template) as url:
        yield url


@pytest.fixture
def settings_env(
    azurite: str, sqlite_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Settings]:
    """``BILLING_*`` set for one test (session Azurite, a migrated SQLite store under ``tmp_path``, a queue prefix
    of its own, containers of its own; any other ``BILLING_*`` from the caller's environment removed);
    yields the matching ``Settings``."""
    for key in [k for k in os.environ if k.upper().startswith("BILLING_")]:
        monkeypatch.delenv(key)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("BILLING_STORAGE_CONNECTION_STRING", azurite)
    monkeypatch.setenv("BILLING_HOME", str(home))
    monkeypatch.setenv("BILLING_SQL_URL", copy_sqlite(sqlite_template, tmp_path / "billing.db"))
    prefix = f"t{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("BILLING_QUEUE_PREFIX", prefix)
    for name in ("inbox", "work", "reference", "trigger"):
        monkeypatch.setenv(f"BILLING_{name.upper()}_CONTAINER", f"{prefix}-{name}")
    yield Settings()


@pytest.fixture
async def storage(settings_env: Settings) -> AsyncIterator[Storage]:
    """A :class:`Storage` on the test's own queues and containers, all created."""
    async with Storage(settings_env) as storage:
        await storage.ensure_all()
        yield storage


@pytest.fixture
def roles(settings_env: Settings, tmp_path: Path) -> Iterator[Roles]:
    """Real role processes for one test (``with roles.running(settings): ...``), logging under
    ``tmp_path / "logs"``; whatever a failed test left running is killed afterwards."""
    started = Roles(tmp_path / "logs")
    try:
        yield started
    finally:
        started.close()
