"""The SQL store, a library of its own: the controller role writes it, the CLI, the API and the console read it,
all through :class:`Store` and the types named here (no caller imports a module of the package).

- :mod:`store.engine`: the engine (SQLite or PostgreSQL), the Microsoft Entra login, write transactions;
- :mod:`store.schema` and :mod:`store.migrate` (Alembic scripts in ``store/migrations``): the tables, and
  how an existing store upgrades in place;
- :mod:`store.batches`: batches and their states (:class:`BatchState`);
- :mod:`store.items`, :mod:`store.partials`, :mod:`store.fold`: work items, rejects and held rows; each work
  item's partial aggregates, and the exact Arrow arithmetic that folds them when a batch settles;
- :mod:`store.recording`: recording results, in one transaction each;
- :mod:`store.pricebooks`: the rows of the price books batches were rated with;
- :mod:`store.ledger`: what is kept across batches (ids, numbers and voids, periods, parties, documents);
- :mod:`store.queries`: reads across batches;
- :mod:`store.core`: :class:`Store`, the face of all of it.
"""

from .batches import FINAL_STATES, ApplyOutcome, BatchState, BatchStatus
from .core import Store
from .engine import ENTRA_POSTGRES_SCOPE, Patience
from .ledger.documents import KINDS, Difference, Document, Period
from .ledger.lines import Line, Tax, quantity_text
from .ledger.numbers import AlreadyVoided, LedgerError
from .ledger.parties import Customer, Imported, Seller
from .migrate import MIGRATIONS, SCHEMA_REVISION
from .pricebooks import PriceRow, price_rows_of
from .queries import DIMENSIONS, MONEY_COLUMNS, PERIOD_PATTERN, BatchRef, Dimension, Filters, Result

__all__ = [
    "DIMENSIONS",
    "ENTRA_POSTGRES_SCOPE",
    "FINAL_STATES",
    "KINDS",
    "MIGRATIONS",
    "MONEY_COLUMNS",
    "PERIOD_PATTERN",
    "SCHEMA_REVISION",
    "AlreadyVoided",
    "ApplyOutcome",
    "BatchRef",
    "BatchState",
    "BatchStatus",
    "Customer",
    "Difference",
    "Dimension",
    "Document",
    "Filters",
    "Imported",
    "LedgerError",
    "Line",
    "Patience",
    "Period",
    "PriceRow",
    "Result",
    "Seller",
    "Store",
    "Tax",
    "price_rows_of",
    "quantity_text",
]
