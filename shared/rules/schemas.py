"""The tables the billing rules produce: rated partial aggregates, rejected rows, rows held as possible duplicates,
a batch's transaction ids for the ledger."""

from __future__ import annotations

import pyarrow as pa

#: A rated work item's partial aggregates: one row per key (account_id, product, billing_day, region, pricebook).
#: The tax rate follows from the key (a day's version names the tax table, the region its rate).
PARTIAL_SCHEMA = pa.schema(
    [
        ("account_id", pa.string()),
        ("product", pa.string()),
        ("billing_day", pa.string()),  # YYYY-MM-DD, UTC
        ("region", pa.string()),  # the resolved tax region, "*" for none
        ("pricebook", pa.string()),  # the content hash of the price book that rated the rows
        ("currency", pa.string()),
        ("tax_rate", pa.string()),  # the rows' tax rate as normalised decimal text ("0.2", "0")
        ("transactions", pa.int64()),
        ("quantity", pa.decimal128(38, 6)),
        ("net", pa.decimal128(38, 0)),  # minor units of `currency`
        ("tax", pa.decimal128(38, 0)),
        ("total", pa.decimal128(38, 0)),
    ]
)

#: Rejected rows: 1-based data row number, stable reason code, the raw row as JSON text.
REJECT_SCHEMA = pa.schema([("row", pa.int64()), ("reason", pa.string()), ("raw", pa.string())])

#: A work item's rejected rows as its results carry them: ``REJECT_SCHEMA`` and, for a row that is its id's first
#: occurrence in the batch (the ledger records its id until the batch completes), the id's hash; null otherwise.
REJECTED_SCHEMA = pa.schema([*REJECT_SCHEMA, ("id_hash", pa.int64())])

#: Otherwise valid rows whose transaction id repeats an earlier row's (see :mod:`shared.rules.duplicates`),
#: each rated on its own and held until every row of the batch is validated: the 1-based data row
#: number, that of the id's first occurrence, the raw row, its id (stripped) and the id's hash as the ledger keeps
#: it, and the row's partial aggregates.
HELD_SCHEMA = pa.schema(
    [
        ("row", pa.int64()),
        ("repeat_of", pa.int64()),
        ("raw", pa.string()),
        ("transaction_id", pa.string()),
        ("id_hash", pa.int64()),
        *PARTIAL_SCHEMA,
    ]
)

#: A batch's transaction ids for the ledger: each id's first occurrence (1-based data row) and the id, stripped.
IDS_SCHEMA = pa.schema([("row", pa.int64()), ("transaction_id", pa.string())])
