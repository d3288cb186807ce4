"""What the ledger's commands (:mod:`billing.cli.ledger`) and the API share: voiding a batch in the store and the
inbox, what a close says, and a closed period's pending difference. Money in text is in the currency's own units."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shared.settings import Settings
    from store import BatchStatus, Document, Store


async def void_batch(settings: Settings, store: Store, batch_id: str) -> BatchStatus:
    """Void a batch in the store (refused with :class:`store.LedgerError`), then
    mark it voided in the inbox so that its id is refused when submitted again; also when the store had voided
    it before (a void whose inbox mark was never written). What ``billing void`` and the API do."""
    from store import AlreadyVoided

    from . import client

    try:
        voided = await asyncio.to_thread(store.void, batch_id)
    except AlreadyVoided:
        await client.mark_voided(settings, batch_id)
        raise
    await client.mark_voided(settings, batch_id)
    return voided


def closing_message(period: str, issued: list[Document]) -> str:
    """What a close says of what it issued (``billing close``, the API)."""
    if not issued:
        return f"period {period}: nothing to issue (no billed amount changed since its last close)"
    return f"period {period}: issued {len(issued)} document(s), numbers {issued[0].number} to {issued[-1].number}"


def close_summary(period: str, issued: list[Document]) -> list[str]:
    """What ``billing close`` prints: what it issued, the documents per kind, net, tax and total per currency (in
    its units), and how many accounts had no customer record."""
    from collections import Counter

    from shared.rules.reference import money
    from store import KINDS

    lines = [closing_message(period, issued)]
    if not issued:
        return lines
    kinds = Counter(doc.kind for doc in issued)
    lines.append("documents: " + ", ".join(f"{kinds[k]} {k.replace('_', ' ')}(s)" for k in KINDS if kinds[k]))
    for currency in sorted({doc.currency for doc in issued}):
        of_currency = [doc for doc in issued if doc.currency == currency]
        sums = {m: money(sum(getattr(doc, m) for doc in of_currency), currency) for m in ("net", "tax", "total")}
        lines.append(f"net {sums['net']}  tax {sums['tax']}  total {sums['total']}")
    without = sorted({doc.account_id for doc in issued if doc.customer is None})
    named = f" ({', '.join(without[:5])}{', …' if len(without) > 5 else ''})" if without else ""
    lines.append(f"accounts without a customer record: {len(without)}{named}")
    return lines


def pending_report(store: Store, period: str, accounts: tuple[str, ...], currencies: tuple[str, ...]) -> list[str]:
    """What ``billing report invoices --period P`` says of the period's documents: open; or closed, and what its
    next close would issue (the pending difference) for the accounts and currencies asked for (empty: any)."""
    from shared.rules.reference import money

    found = store.periods(period)
    if not found or not found[0].closed:
        return [f"period {period} is open: it was never closed"]
    pending = [
        d
        for d in found[0].pending
        if (not accounts or d.account_id in accounts) and (not currencies or d.currency in currencies)
    ]
    if not pending:
        return [f"period {period} is closed ({found[0].documents} document(s)); nothing pending"]
    lines = [f"period {period} is closed; pending difference (what the next close would issue):"]
    for d in pending:
        sums = d.sums
        amounts = "  ".join(f"{m} {money(getattr(sums, m), d.currency)}" for m in ("net", "tax", "total"))
        lines.append(f"  {d.kind:<10}  {d.account_id}  {amounts}")
    return lines
