"""Databases for tests, each test its own: a SQLite file or a database on the session's PostgreSQL, empty or already
migrated. A migrated one is a copy of a template migrated once per test process (the file copied with SQLite's backup;
PostgreSQL's ``CREATE DATABASE … TEMPLATE``), so that the store's migrations run once per process, not once per
test; the tests of the migrations themselves take an empty one."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import sqlalchemy as sa

from store import Store


def migrated(url: str) -> str:
    """The store at ``url``, migrated to the newest revision (a template); its URL."""
    Store(url).close()
    return url


def copy_sqlite(template: Path, path: Path) -> str:
    """A copy of the SQLite ``template`` at ``path``, unless a store is there already (a test's store and the
    settings of its commands share one file); its URL."""
    if not path.exists():
        with closing(sqlite3.connect(template)) as source, closing(sqlite3.connect(path)) as target:
            source.backup(target)
    return f"sqlite:///{path}"


@contextmanager
def postgres_database(server_url: str, template: str | None = None) -> Iterator[str]:
    """A new database on the PostgreSQL server of ``server_url`` for the block, empty or a copy of the database
    ``template``; its URL. It is dropped afterwards, whoever is still connected."""
    server = sa.make_url(server_url)
    name = f"test_{uuid.uuid4().hex[:16]}"
    copied = f' TEMPLATE "{template}"' if template else ""
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", pool_pre_ping=True)  # the server may restart
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"{copied}'))
        yield server.set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
