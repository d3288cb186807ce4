"""Schema migrations (Alembic, ``store/migrations``): a store upgrades itself in place when it opens."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from shared.errors import InfrastructureError

from .engine import writing

MIGRATIONS = Path(__file__).with_name("migrations")
#: The newest migration's revision (a test checks it is Alembic's head): a store already there opens
#: without loading Alembic (CPU time of every `billing submit --wait` and role start).
SCHEMA_REVISION = "0017"

_MIGRATION_LOCK = 0x62696C6C  # PostgreSQL advisory lock key ("bill")


def revision(engine: sa.Engine) -> str | None:
    """The schema revision the database is at (None before the first migration)."""
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one_or_none()
    except sa.exc.ProgrammingError:  # PostgreSQL: no such table yet
        return None
    except sa.exc.OperationalError as exc:
        if "no such table" in str(exc):  # SQLite
            return None
        raise InfrastructureError(f"SQL store unavailable: {exc}") from exc


def migrate(engine: sa.Engine, url: sa.URL) -> None:
    """Upgrade the schema to Alembic ``head``; a no-op when current, safe when run by several processes."""
    if revision(engine) == SCHEMA_REVISION:
        return
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.render_as_string(hide_password=False).replace("%", "%%"))
    with writing(engine) as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_MIGRATION_LOCK)))
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
