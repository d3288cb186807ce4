"""The SQL store, a library of its own: the controller role writes it, the CLI, the API and the console read it.

- :mod:`store.engine`: the engine (SQLite or PostgreSQL), the Microsoft Entra login, write transactions;
- :mod:`store.schema` and :mod:`store.migrate` (Alembic scripts in ``store/migrations``): the tables, and
  how an existing store upgrades in place;
- :mod:`store.batches`: batches and their states (:class:`BatchState`);
- :mod:`store.fold`: exact Arrow arithmetic on aggregates; :mod:`store.cache`: the SQLite fold cache;
- :mod:`store.items`: work items, rejects and held rows;
- :mod:`store.core`: :class:`Store`, which records results in one transaction each;
- :mod:`store.queries` and :mod:`store.reports`: reads across batches, and reports of them.
"""

from .batches import FINAL_STATES, ApplyOutcome, BatchState, BatchStatus
from .core import Store
from .engine import ENTRA_POSTGRES_SCOPE, Patience
from .migrate import MIGRATIONS, SCHEMA_REVISION

__all__ = [
    "ENTRA_POSTGRES_SCOPE",
    "FINAL_STATES",
    "MIGRATIONS",
    "SCHEMA_REVISION",
    "ApplyOutcome",
    "BatchState",
    "BatchStatus",
    "Patience",
    "Store",
]
