"""A store filled for report tests (queries, API, console): three batches, one of them still processing, money
past 2^63, two currencies, and a batch whose reject carries markup; built with ``support.records``."""

from __future__ import annotations

from store import Store
from support.records import manifest, partial, result

BIG = 9 * 10**18  # two of these pass 2^63
#: Raw text of a rejected row that would run as script if a page did not escape it.
HOSTILE = '<script>document.title="pwned"</script>"\'><img src=x onerror="document.title=\'pwned\'">'


def fill(store: Store) -> None:
    """Batches ``b1``, ``b2`` (complete), ``b3`` (processing: one of two work items), ``evil`` (complete, one
    reject whose raw row is :data:`HOSTILE`)."""
    store.apply(
        [
            manifest("b1"),
            manifest("b2"),
            manifest("b3", work_items=2),
            manifest("evil", rows=2),
        ],
        [
            result(
                "w1",
                partial("acct-1", day="2026-03-01", net=BIG, tax=1),
                partial("acct-1", product="GPU", day="2026-03-31", net=50, tax=5),
                partial("acct-2", day="2026-04-01", net=7, tax=0, quantity="0.000001"),
                partial("acct-3", day="2026-03-15", currency="JPY", net=1234, tax=123),
                batch_id="b1",
            ),
            result("w2", partial("acct-1", day="2026-03-01", net=BIG, tax=2, quantity="2.25"), batch_id="b2"),
            result("w3", partial("acct-1", day="2026-03-02", net=99, tax=9), batch_id="b3"),
            result(
                "e1",
                partial("acct-9", day="2026-03-02", net=1, tax=0),
                batch_id="evil",
                rejects=[{"row": 2, "reason": "invalid_account_id", "raw": HOSTILE}],
            ),
        ],
    )
