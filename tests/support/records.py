"""Small builders of what the controller's store is given: partial aggregates, work item results,
manifests (tests of the store build them by hand, with nothing from a running pipeline)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa

from shared.messages import Manifest, WorkItemResult
from shared.rules.duplicates import id_hashes
from shared.rules.schemas import HELD_SCHEMA, PARTIAL_SCHEMA, REJECTED_SCHEMA
from store import Store


def partial(
    account: str = "acct-1",
    *,
    product: str = "CPU",
    day: str = "2026-03-02",
    currency: str = "USD",
    transactions: int = 1,
    quantity: Decimal | str = "1.5",
    net: int = 100,
    tax: int = 20,
    region: str = "*",
    pricebook: str = "pb",
    tax_rate: str = "0.2",
) -> dict[str, Any]:
    """One row of partial aggregates (``PARTIAL_SCHEMA``); total = net + tax."""
    return {
        "account_id": account,
        "product": product,
        "billing_day": day,
        "region": region,
        "pricebook": pricebook,
        "currency": currency,
        "tax_rate": tax_rate,
        "transactions": transactions,
        "quantity": Decimal(quantity),
        "net": Decimal(net),
        "tax": Decimal(tax),
        "total": Decimal(net + tax),
    }


def result(
    work_item_id: str,
    *rows: dict[str, Any],
    batch_id: str = "b1",
    transactions: int | None = None,
    rejects: list[dict[str, Any]] | None = None,
    held: list[dict[str, Any]] | None = None,
) -> WorkItemResult:
    """A work item's result from partial rows (one default row if none; none at all when ``rejects`` or
    ``held`` are given), its rejects (``REJECT_SCHEMA`` rows, and the hash of their id where given) and held rows
    (:func:`held_row`); its transactions are the partial rows' unless given."""
    rows = rows or (() if rejects or held else (partial(),))
    table = pa.Table.from_pylist(list(rows), schema=PARTIAL_SCHEMA)
    count = sum(int(r["transactions"]) for r in rows) if transactions is None else transactions
    return WorkItemResult(
        work_item_id,
        batch_id,
        count,
        table,
        pa.Table.from_pylist([{"id_hash": None, **r} for r in rejects or []], schema=REJECTED_SCHEMA),
        pa.Table.from_pylist(held or [], schema=HELD_SCHEMA),
    )


def held_row(row: int, repeat_of: int, account: str = "acct-1", **amounts: Any) -> dict[str, Any]:
    """An otherwise valid row that repeats the id of row ``repeat_of`` (``t<repeat_of>``), rated on its own (see
    :func:`partial`)."""
    transaction_id = f"t{repeat_of}"
    return {
        "row": row,
        "repeat_of": repeat_of,
        "raw": f'{{"row": {row}}}',
        "transaction_id": transaction_id,
        "id_hash": int(id_hashes(pa.array([transaction_id]))[0]),
        **partial(account, **amounts),
    }


def manifest(
    batch_id: str = "b1",
    *,
    work_items: int = 1,
    rows: int = 1,
    refused: str | None = None,
    accepted_at: datetime | None = None,
    **phases: datetime | None,
) -> Manifest:
    """A batch's manifest: ``rows`` rows in ``work_items`` work items, accepted two seconds ago unless
    ``accepted_at`` says when; ``phases`` are its phase times (``uploaded_at``, ...)."""
    return Manifest(
        batch_id=batch_id,
        source="batch.csv",
        rows=rows,
        work_items=work_items,
        pricebook_hash="pb",
        taxes_hash="tx",
        accepted_at=accepted_at or datetime.now(UTC) - timedelta(seconds=2),
        refused=refused,
        **phases,
    )


def complete(store: Store, batch_id: str, *rows: dict[str, Any], accepted_at: datetime | None = None) -> None:
    """Record batch ``batch_id`` whole (its manifest and one work item of ``rows``, partials as :func:`partial`
    makes them) and check that it completed."""
    outcome = store.apply(
        [manifest(batch_id, accepted_at=accepted_at)], [result(f"{batch_id}-w1", *rows, batch_id=batch_id)]
    )
    assert outcome.completed_batches == [batch_id]
