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
