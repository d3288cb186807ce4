"""Reports across batches through the whole pipeline: three batches of the same month run by the roles as
processes, then ``billing report invoices --period`` compared with the sum of the reference model's invoices of
each batch, to the minor unit; the HTML report of the same figures shows them in currency units."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from billing.console.render import money
from billing.sample import generate
from shared.settings import Settings
from support.exact import billing, expected, read_raw
from support.references import sample_flags
from support.roles import Roles

ROWS = 2_000


def test_period_invoices_over_three_batches_equal_the_reference(
    settings_env: Settings, roles: Roles, tmp_path: Path
) -> None:
    reference: Counter[tuple[str, str, str]] = Counter()
    files = {}
    for seed, fmt in enumerate(("csv", "jsonl", "parquet"), start=21):
        path = tmp_path / f"march-{seed}.{fmt}"
        generate(ROWS, path, seed=seed, fmt=fmt, reject_rate=0.01)
        files[f"march-{seed}"] = path
        for invoice in expected(read_raw(path))[1]:
            reference[(invoice["account_id"], invoice["billing_period"], invoice["currency"])] += invoice["total"]

    with roles.running(settings_env):
        for batch_id, path in files.items():
            billing("submit", str(path), "--batch-id", batch_id, *sample_flags(tmp_path / "ref"))
        for batch_id, path in files.items():
            billing(
                "submit", str(path), "--batch-id", batch_id, "--wait", *sample_flags(tmp_path / "ref")
            )  # non-zero unless complete

    done = billing("report", "invoices", "--period", "2026-03", "--format", "json")
    got = json.loads(done.stdout)
    assert {(r["account_id"], r["billing_period"], r["currency"]): r["total"] for r in got} == dict(reference)
    assert all(type(r["total"]) is int for r in got)
    assert {batch for r in got for batch in r["batches"].split()} == set(files)
    assert f"batches included: {', '.join(sorted(files))}" in done.stderr and "excluded" not in done.stderr

    one = got[0]
    html = tmp_path / "march.html"
    billing(
        "report",
        "invoices",
        "--period",
        "2026-03",
        "--account",
        one["account_id"],
        "--format",
        "html",
        "--output",
        str(html),
    )
    page = html.read_text()
    assert money(one["total"], one["currency"]) in page and "<svg" in page and f">{one['account_id']}<" in page
