"""``billing close`` and ``billing documents`` as a user runs them, on batches the real roles completed: every
document equal to the reference model's to the minor unit, through closes, a void and a batch that arrives
after its period was closed; issued documents unchanged; refusals on one line."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import reference_model as model
from billing.sample import generate, sample_price_book_bytes, sample_tax_table_bytes
from shared.settings import Settings
from support.exact import billing, read_raw
from support.ledger import SELLER_ARGS, as_issued
from support.roles import Roles

HEADER = "transaction_id,account_id,timestamp,product,quantity,region\n"


def attempt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "billing", *args], capture_output=True, text=True, env=os.environ, timeout=120
    )


def listed(*args: str) -> list[dict[str, Any]]:
    return list(json.loads(billing("documents", "list", "--format", "json", *args).stdout))


def run_roles(roles: Roles) -> None:
    for role in ("initiator", "processor", "controller"):
        roles.burst(role)


def test_closes_issue_the_models_documents_through_a_void_and_a_later_batch(
    settings_env: Settings, roles: Roles, tmp_path: Path
) -> None:
    products = [line.split(",")[0] for line in sample_price_book_bytes().decode().splitlines()[1:4]]
    files = {"gen": tmp_path / "gen.csv", "small": tmp_path / "small.csv", "later": tmp_path / "later.csv"}
    generate(300, files["gen"], seed=41, reject_rate=0.05)
    files["small"].write_text(
        HEADER
        + f"s1,acct-x,2026-02-27T10:00:00Z,{products[0]},3,\n"
        + f"s2,acct-x,2026-03-02T09:30:00Z,{products[1]},1.25,\n"
        + f"s2,acct-x,2026-03-02T09:31:00Z,{products[1]},99,\n"  # a repeated id: rejected
        + f"s3,acct-x,2026-03-02T23:00:00Z,{products[2]},-1,\n"  # rejected
        + f"s4,Acct-y,2026-03-05T12:00:00Z,{products[0]},2,\n"
    )
    files["later"].write_text(
        HEADER
        + f"l1,acct-x,2026-03-20T08:00:00Z,{products[1]},4,\n"
        + f"l2,acct-new,2026-02-02T08:00:00Z,{products[2]},7,\n"
    )
    ledger = model.Ledger(
        model.read_prices(sample_price_book_bytes().decode()), model.read_rates(sample_tax_table_bytes().decode())
    )
    billing("reference", "set", "--sample")
    billing("seller", "set", *SELLER_ARGS)
    for batch_id in ("gen", "small"):
        billing("submit", str(files[batch_id]), "--batch-id", batch_id)
        ledger.batch(batch_id, read_raw(files[batch_id]))
    run_roles(roles)

    for period in ("2026-03", "2026-02"):
        done = billing("close", "--period", period)
        expected = ledger.close(period)
        assert f"issued {len(expected)} document(s)" in done.stdout
    first = listed()
    assert model.as_model(first) == ledger.documents
    assert len(first) > 100 and [d["number"] for d in first] == list(range(1, len(first) + 1))
    sample_hashes = (
        [hashlib.sha256(sample_price_book_bytes()).hexdigest()],
        [hashlib.sha256(sample_tax_table_bytes()).hexdigest()],
    )
    assert all((d["pricebooks"], d["tax_tables"]) == sample_hashes for d in first)
    assert "nothing to issue" in billing("close", "--period", "2026-03").stdout

    this_month = datetime.now(UTC).strftime("%Y-%m")
    for period, words in (
        ("2026-13", "YYYY-MM"),
        ("2999-01", "future"),
        ("March", "YYYY-MM"),
        (this_month, "not ended"),
    ):
        refused = attempt("close", "--period", period)
        assert refused.returncode == 2 and words in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr

    billing("submit", str(files["later"]), "--batch-id", "later")  # rows of both closed periods
    ledger.batch("later", read_raw(files["later"]))
    run_roles(roles)
    billing("void", "small")
    ledger.void("small")
    for period in ("2026-02", "2026-03"):
        ledger.close(period)
        billing("close", "--period", period)
    after = listed()
    assert as_issued(after[: len(first)]) == as_issued(first), "issued documents never change"
    assert model.as_model(after) == ledger.documents
    credits = listed("--kind", "credit_note")
    assert credits and all(d["kind"] == "credit_note" and d["total"] < 0 for d in credits), "the void is a credit"
    of_x = listed("--account", "acct-x", "--period", "2026-03")
    assert [d["kind"] for d in of_x] == ["invoice", "credit_note" if of_x[1]["total"] < 0 else "debit_note"]
    assert of_x[1]["corrects"] == [of_x[0]["number"]] and of_x[0]["corrected_by"] == [of_x[1]["number"]]
    assert of_x[0]["seller"]["tax_id"] == "DE123456789" and of_x[0]["customer"] is None
    assert of_x[1]["lines"] and {b for line in of_x[1]["lines"] for b in line["batches"]} == {"small", "later"}

    number = of_x[1]["number"]
    assert json.loads(billing("documents", "show", str(number), "--format", "json").stdout) == of_x[1]
    table = billing("documents", "show", str(number)).stdout
    currency_digits = model.DIGITS[of_x[1]["currency"]]
    total = of_x[1]["total"]
    units = f"{'-' if total < 0 else ''}{abs(total) // 10**currency_digits:,}"
    if currency_digits:
        units += f".{abs(total) % 10**currency_digits:0{currency_digits}d}"
    title = f"{'Credit' if total < 0 else 'Debit'} note {of_x[1]['display_number']} (No. {number})"
    totals = next(line for line in table.splitlines() if line.startswith("total "))
    assert table.startswith(title) and units in totals, table
    missing = attempt("documents", "show", "99999")
    assert missing.returncode == 1 and "no document numbered 99999" in missing.stderr
