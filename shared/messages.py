"""What travels between the roles, independent of how it is encoded on the wire."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa

#: A rated work item's partial aggregates: one row per (account_id, product, billing_day).
PARTIAL_SCHEMA = pa.schema(
    [
        ("account_id", pa.string()),
        ("product", pa.string()),
        ("billing_day", pa.string()),  # YYYY-MM-DD, UTC
        ("currency", pa.string()),
        ("transactions", pa.int64()),
        ("quantity", pa.decimal128(38, 6)),
        ("net", pa.decimal128(38, 0)),  # minor units of `currency`
        ("tax", pa.decimal128(38, 0)),
        ("total", pa.decimal128(38, 0)),
    ]
)

#: Rejected rows: 1-based data row number, stable reason code, the raw row as JSON text.
REJECT_SCHEMA = pa.schema([("row", pa.int64()), ("reason", pa.string()), ("raw", pa.string())])


@dataclass(frozen=True)
class Manifest:
    """What the initiator tells the controller about a debatched (or refused) batch."""

    batch_id: str
    source: str
    rows: int
    accepted: int
    rejected: int
    work_items: int
    pricebook_hash: str
    taxes_hash: str
    accepted_at: datetime
    rejects: pa.Table  # REJECT_SCHEMA
    refused: str | None = None  # a file-level refusal reason; then nothing was enqueued


@dataclass(frozen=True)
class WorkItemResult:
    """The processor's partial aggregates for one work item."""

    work_item_id: str
    batch_id: str
    transactions: int
    partials: pa.Table  # PARTIAL_SCHEMA
