"""Batch files for the ledger's tests, built from their transaction ids: rows of one account, CSV text, and a
manifest changed as a test needs it; the seller a close needs."""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from typing import Any

from shared.messages import Manifest
from store import Seller, Store

#: The seller the ledger's tests register before they close (a close without one is refused).
SELLER = Seller("Example Billing GmbH", "Hauptstrasse 1, 10115 Berlin", "DE", "DE123456789")
SELLER_ARGS = ("--name", SELLER.name, "--address", SELLER.address, "--country", "DE", "--tax-id", SELLER.tax_id)

HEADER = ("transaction_id", "account_id", "timestamp", "product", "quantity", "region")


def rows_of(
    ids: list[str], *, account: str = "acct-1", quantity: str = "2", bad_every: int = 0
) -> list[dict[str, str | None]]:
    """A row per id, all valid, of ``account`` at a peak hour of 2 March 2026; every ``bad_every``-th row with a
    quantity no rule accepts (rejected)."""
    return [
        {
            "transaction_id": i,
            "account_id": account,
            "timestamp": "2026-03-02T09:15:00Z",
            "product": "compute.vcpu-hour",
            "quantity": "1e3" if bad_every and n % bad_every == 0 else quantity,
            "region": "",
        }
        for n, i in enumerate(ids, start=1)
    ]


def csv_of(rows: list[dict[str, Any]], header: tuple[str, ...] = HEADER) -> bytes:
    """The rows as a CSV file (``\\n`` line ends)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().encode()


def manifest_with(manifest: Manifest, **changes: Any) -> Manifest:
    """``manifest`` with ``changes``."""
    return replace(manifest, **changes)


def with_seller(store: Store) -> Store:
    """``store`` with :data:`SELLER` registered."""
    store.set_seller(SELLER)
    return store


def as_issued(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What issuing fixed of documents' JSON: all but ``corrected_by`` (later notes add to it)."""
    return [{k: v for k, v in d.items() if k != "corrected_by"} for d in docs]
