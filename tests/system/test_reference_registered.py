"""Reference data registered, not implied: ``billing reference set`` registers the price book and tax table a batch
submitted without its own is rated with, from a date on; with none registered ``billing submit`` refuses."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from billing.sample import sample_price_book_bytes, sample_tax_table_bytes
from shared.settings import Settings
from support.roles import Roles

HEADER = "transaction_id,account_id,timestamp,product,quantity,region\n"


def billing(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "billing", *args], capture_output=True, text=True, env=os.environ, timeout=120
    )


def _batch(path: Path) -> Path:
    product = sample_price_book_bytes().decode().splitlines()[1].split(",")[0]
    path.write_text(HEADER + f"t1,acct-1,2026-03-02T09:15:00Z,{product},2,\n")
    return path


def _status(batch_id: str) -> dict[str, object]:
    done = billing("status", batch_id, "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_submit_without_reference_data_refuses_until_a_set_is_registered_then_rates_with_it(
    settings_env: Settings, roles: Roles, tmp_path: Path
) -> None:
    batch = _batch(tmp_path / "batch.csv")
    refused = billing("submit", str(batch), "--batch-id", "first")
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert "no reference data registered" in refused.stderr and "billing reference set" in refused.stderr
    shown = billing("reference", "list")
    assert shown.returncode == 1 and "no reference data registered" in shown.stderr

    # A price book of its own (the sample's, one price changed): not the sample's hash.
    lines = sample_price_book_bytes().decode().splitlines()
    cells = lines[1].split(",")
    cells[2] = "7.25"
    pricebook, taxes = tmp_path / "prices.csv", tmp_path / "taxes.csv"
    pricebook.write_text("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
    taxes.write_bytes(sample_tax_table_bytes())
    done = billing(
        "reference", "set", "--pricebook", str(pricebook), "--taxes", str(taxes), "--effective-from", "2026-03-01"
    )
    assert done.returncode == 0, done.stderr
    book_hash = hashlib.sha256(pricebook.read_bytes()).hexdigest()
    taxes_hash = hashlib.sha256(taxes.read_bytes()).hexdigest()
    listed = json.loads(billing("reference", "list", "--json").stdout)
    assert [(v["effective_from"], v["pricebook"], v["taxes"]) for v in listed] == [
        ("2026-03-01", book_hash, taxes_hash)
    ]

    assert billing("submit", str(batch), "--batch-id", "registered").returncode == 0
    sample = tmp_path / "sample.csv"
    sample.write_bytes(sample_price_book_bytes())
    assert billing("submit", str(batch), "--batch-id", "own-book", "--pricebook", str(sample)).returncode == 0
    for role in ("initiator", "processor", "controller"):
        roles.burst(role)
    registered, own = _status("registered"), _status("own-book")
    assert (registered["state"], registered["pricebook_hash"], registered["taxes_hash"]) == (
        "complete",
        book_hash,
        taxes_hash,
    )
    sample_hash = hashlib.sha256(sample_price_book_bytes()).hexdigest()
    assert (own["state"], own["pricebook_hash"], own["taxes_hash"]) == ("complete", sample_hash, taxes_hash)
    assert billing("status", "first", "--json").returncode != 0, "the refused submission left nothing"


def test_invalid_reference_data_is_never_registered(settings_env: Settings, tmp_path: Path) -> None:
    assert billing("reference", "set", "--sample").returncode == 0
    before = billing("reference", "list", "--json").stdout
    pricebook, taxes = tmp_path / "prices.csv", tmp_path / "taxes.csv"
    pricebook.write_bytes(sample_price_book_bytes())
    taxes.write_text("region,tax_rate\nDE,0.19\n")  # no default `*` row
    refused = billing("reference", "set", "--pricebook", str(pricebook), "--taxes", str(taxes))
    assert refused.returncode == 2 and "*" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert billing("reference", "list", "--json").stdout == before
    for args in (("--pricebook", str(pricebook)), ("--sample", "--taxes", str(taxes)), ()):
        usage = billing("reference", "set", *args)
        assert usage.returncode == 2 and "--pricebook and --taxes, or --sample" in usage.stderr
