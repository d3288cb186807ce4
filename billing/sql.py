"""The SQL store as a command opens it: batches show why they stalled, and a store that cannot be reached (a
server restarting) is waited for, within ``BILLING_STORE_PATIENCE``, saying so on stderr."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:  # SQLAlchemy and pydantic only for the commands that open the store
    from shared.settings import Settings
    from store import Store


def open_store(settings: Settings) -> Store:
    """The store of ``settings``, for a command."""
    from store import Patience, Store

    return Store(
        settings.sql_url_value,
        stalled_after=settings.stalled_after,
        patience=Patience(settings.store_patience, lambda line: click.echo(f"waiting: {line}", err=True)),
    )
