"""A store as older code made it: an empty database migrated to a given revision, not the newest."""

from __future__ import annotations

from alembic import command
from alembic.config import Config

from store import MIGRATIONS, Store
from store.engine import writing


def at_revision(url: str, revision: str) -> None:
    """Migrate an empty store to ``revision`` (not the newest), as a store made by that code."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with Store(url, migrate=False) as store, writing(store.engine) as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
