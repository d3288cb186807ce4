"""Documents as their JSON (``store.Document.to_json_dict``) for the rendering tests: a full Part 3 credit note
(seller and buyer, corrects, a product split by price book, off-peak prices, two tax rates), an invoice without a
customer record that notes correct, and a document as printed before Part 3."""

from __future__ import annotations

import copy
from typing import Any

OLD_BOOK, NEW_BOOK = "a" * 64, "b" * 64
CREDIT: dict[str, Any] = {
    "number": 7,
    "display_number": "ACME-000007",
    "kind": "credit_note",
    "period": "2026-03",
    "account_id": "acct-0001",
    "currency": "EUR",
    "issued_at": "2026-04-02T09:30:00+00:00",
    "net": -12_500,
    "tax": -2_119,
    "total": -14_619,
    "pricebooks": [OLD_BOOK, NEW_BOOK],
    "tax_tables": ["c" * 64],
    "corrects": [1, 4],
    "corrected_by": [],
    "seller": {"name": "Acme Cloud GmbH", "address": "Hauptstr. 1\n10115 Berlin", "country": "DE", "tax_id": "DE123"},
    "customer": {
        "account_id": "acct-0001",
        "name": "Globex Ltd",
        "address": "1 High Street, London",
        "country": "GB",
        "tax_id": "GB999",
    },
    "service_period": {"from": "2026-03-01", "to": "2026-03-31"},
    "due_date": "2026-05-02",
    "lines": [
        {
            "product": "compute.gpu-hour",
            "transactions": 3,
            "quantity": "-2.5",
            "net": -10_000,
            "tax": -2_000,
            "total": -12_000,
            "batches": ["late-1"],
            "unit": "hour",
            "unit_price": "40",
            "offpeak_unit_price": "32.5",
            "pricebook": OLD_BOOK,
        },
        {
            "product": "compute.gpu-hour",
            "transactions": 1,
            "quantity": "-0.5",
            "net": -2_000,
            "tax": -145,
            "total": -2_145,
            "batches": ["late-1"],
            "unit": "hour",
            "unit_price": "40",
            "offpeak_unit_price": "40",
            "pricebook": NEW_BOOK,
        },
        {
            "product": "storage.gb-month",
            "transactions": 2,
            "quantity": "-10",
            "net": -500,
            "tax": 26,
            "total": -474,
            "batches": ["late-1", "late-2"],
            "unit": "GB-month",
            "unit_price": "0.05",
            "offpeak_unit_price": "0.05",
            "pricebook": NEW_BOOK,
        },
    ],
    "taxes": [
        {"rate": "0.0725", "regions": ["US-CA"], "net": -2_000, "tax": -145},
        {"rate": "0.2", "regions": ["*", "DE"], "net": -10_500, "tax": -1_974},
    ],
}
#: An invoice that two notes correct, of an account without a customer record.
CORRECTED = {
    **copy.deepcopy(CREDIT),
    "number": 1,
    "display_number": "ACME-000001",
    "kind": "invoice",
    "net": 12_500,
    "tax": 2_500,
    "total": 15_000,
    "corrects": [],
    "corrected_by": [4, 7],
    "customer": None,
    "taxes": [{"rate": "0.2", "regions": ["DE"], "net": 12_500, "tax": 2_500}],
}
#: A document as the JSON of a ledger before Part 3 had it (kind as migration 0015 names it), no Part 3 key.
OLD = {
    key: CREDIT[key]
    for key in ("account_id", "currency", "issued_at", "period", "pricebooks", "tax_tables", "net", "tax", "total")
} | {
    "number": 2,
    "kind": "credit_note",
    "lines": [
        {
            k: v
            for k, v in CREDIT["lines"][2].items()
            if k not in ("unit", "unit_price", "offpeak_unit_price", "pricebook")
        }
    ],
}
