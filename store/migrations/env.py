"""Alembic environment for the SQL store; run programmatically by ``Store.migrate()``.

The caller passes an open connection (already inside a transaction that holds the migration lock) in
``config.attributes["connection"]``; offline (SQL script) mode is not supported.
"""

from __future__ import annotations

from alembic import context

from store.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise RuntimeError("store migrations run through Store.migrate() with a connection")

context.configure(connection=connection, target_metadata=metadata, render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
