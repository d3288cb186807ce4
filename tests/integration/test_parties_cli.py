"""``billing seller``, ``billing customers``, ``billing close`` and ``billing documents list|export`` as a user
runs them on a SQLite store: what they print, what they refuse (one line, exit 2, nothing changed), and the
register exported as CSV and Parquet against the documents' JSON."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from billing.cli import cli
from store import PriceRow, Store
from support.ledger import SELLER_ARGS
from support.records import complete, partial

BIG = 9 * 10**18


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A SQLite store with March 2026 billed (three accounts, one past 2^63) that the commands use."""
    found = f"sqlite:///{tmp_path / 'billing.db'}"
    monkeypatch.setenv("BILLING_SQL_URL", found)
    with Store(found) as store:
        complete(
            store,
            "b1",
            partial("acct-1", net=BIG, tax=BIG // 5),
            partial("acct-1", product="GPU", net=3, tax=1, quantity="0.5"),
            partial("acct-2", currency="EUR", net=40, tax=4),
            partial("acct-3", net=0, tax=0),  # money-free: no document
        )
    yield found


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def process(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {"BILLING_SQL_URL": url, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "billing", *args], capture_output=True, text=True, env=env, timeout=120
    )


def documents(url: str) -> list[dict[str, object]]:
    with Store(url) as store:
        return [d.to_json_dict() for d in store.documents()]


def test_a_close_without_a_seller_is_refused_then_closes_with_a_summary(url: str, tmp_path: Path) -> None:
    refused = process("close", "--period", "2026-03", url=url)
    assert refused.returncode == 2 and "billing seller set" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and documents(url) == []
    assert run("seller", "set", *SELLER_ARGS, "--payment-terms-days", "14").exit_code == 0
    customers = tmp_path / "customers.csv"
    customers.write_text('account_id,name,address,country,tax_id,email\nacct-1,Alice Ltd,"1 High St, London",GB,,\n')
    assert "1 added" in run("customers", "import", str(customers)).output

    refusing = run("close", "--period", "2026-03", "--require-customers")
    assert refusing.exit_code == 1 and "1 account(s) to document have no customer record (acct-2)" in str(
        refusing.exception
    )
    assert documents(url) == []
    done = run("close", "--period", "2026-03", "--list")
    assert done.exit_code == 0, done.output
    assert done.output.splitlines() == [
        "period 2026-03: issued 2 document(s), numbers 1 to 2",
        "documents: 2 invoice(s)",
        "net 0.40 EUR  tax 0.04 EUR  total 0.44 EUR",
        "net 90,000,000,000,000,000.03 USD  tax 18,000,000,000,000,000.01 USD  total 108,000,000,000,000,000.04 USD",
        "accounts without a customer record: 1 (acct-2)",
        "INV-000001  invoice      2026-03  acct-1  net 90,000,000,000,000,000.03 USD  "
        "tax 18,000,000,000,000,000.01 USD  total 108,000,000,000,000,000.04 USD",
        "INV-000002  invoice      2026-03  acct-2  net 0.40 EUR  tax 0.04 EUR  total 0.44 EUR",
    ]
    first = documents(url)[0]
    assert first["due_date"] == str(datetime.fromisoformat(str(first["issued_at"])).date() + timedelta(days=14))
    shown = run("documents", "show", "1")
    assert "Invoice INV-000001 (No. 1)" in shown.output and "buyer Alice Ltd (acct-1)" in shown.output


@pytest.mark.parametrize(
    "args",
    [
        ("documents", "list", "--period", "2026-3"),
        ("close", "--period", "2026-3"),
        ("documents", "export", "--period", "26-03", "--format", "csv", "--out", "x.csv"),
        ("documents", "list", "--kind", "adjustment"),
    ],
)
def test_a_malformed_period_or_old_kind_is_refused_with_exit_code_2(url: str, args: tuple[str, ...]) -> None:
    refused = process(*args, url=url)
    assert refused.returncode == 2 and ("is not YYYY-MM" in refused.stderr or "'adjustment'" in refused.stderr)
    if "--period" in args:
        assert refused.stderr.strip() == f"error: billing period {args[args.index('--period') + 1]!r} is not YYYY-MM"


def test_a_bad_customer_file_refuses_the_whole_file_naming_the_row(url: str, tmp_path: Path) -> None:
    lines = [
        '{"account_id": "acct-1", "name": "Alice", "address": "1 High St", "country": "GB"}',
        '{"account_id": "acct-2", "name": "Bob", "address": "Weg 3", "country": "DE", "email": "b@x.de"}',
        '{"account_id": "acct 3", "name": "Carol", "address": "Rue 1", "country": "FR"}',
    ]
    bad = tmp_path / "customers.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    refused = process("customers", "import", str(bad), url=url)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "error: customers.jsonl row 3: account id 'acct 3': 1 to 64 letters, digits and . _ : -; nothing imported"
    )
    for text, words in (
        ("account_id,name,address\nacct-1,A,B\n", "no column 'country'"),
        ("account_id,name,address,country\nacct-1,A,B,XK1\n", "row 1: country 'XK1'"),
        ("account_id,name,address,country\nacct-1,,B,DE\n", "row 1: name is missing"),
        ("account_id,name,address,country,fax\nacct-1,A,B,DE,1\n", "unknown column 'fax'"),
        ("account_id,name,address,country\nacct-1,A,B,DE\nacct-1,A,C,DE\n", "row 2: account id acct-1 again (row 1)"),
    ):
        bad.with_suffix(".csv").write_text(text)
        refusal = run("customers", "import", str(bad.with_suffix(".csv")))
        assert refusal.exit_code == 1 and words in str(refusal.exception), (text, refusal.exception)
    assert json.loads(run("customers", "list", "--json").output) == [], "nothing imported"
    bad.write_text("\n".join(lines[:2]) + "\n")
    assert run("customers", "import", str(bad)).exit_code == 0
    assert [c["account_id"] for c in json.loads(run("customers", "list", "--json").output)] == ["acct-1", "acct-2"]
    assert json.loads(run("customers", "show", "acct-2", "--json").output)["email"] == "b@x.de"
    assert run("customers", "show", "acct-9").exit_code == 1


def test_the_seller_set_twice_is_a_new_version_and_a_bad_one_changes_nothing(url: str) -> None:
    assert run("seller", "show").exit_code == 1
    refused = process("seller", "set", *SELLER_ARGS[:-3], "ZZ", "--tax-id", "T", url=url)
    assert refused.returncode == 2 and "ISO 3166-1" in refused.stderr
    assert run("seller", "show").exit_code == 1, "nothing registered"
    run("seller", "set", *SELLER_ARGS)
    run("seller", "set", *SELLER_ARGS, "--prefix", "R-")
    shown = json.loads(run("seller", "show", "--json").output)
    assert (shown["version"], shown["prefix"], shown["payment_terms_days"], shown["country"]) == (2, "R-", 30, "DE")


def test_the_register_exports_documents_and_lines_as_csv_and_parquet(url: str, tmp_path: Path) -> None:
    run("seller", "set", *SELLER_ARGS)
    run("close", "--period", "2026-03")
    with Store(url) as store:
        complete(store, "b2", partial("acct-2", currency="EUR", net=-10, tax=-1))
        store.close_period("2026-03")
    issued = documents(url)
    out = tmp_path / "register.parquet"
    assert run("documents", "export", "--format", "parquet", "--out", str(out)).exit_code == 0
    rows = pq.read_table(out).to_pylist()
    assert [(r["number"], r["display_number"], r["kind"], r["corrects"], int(r["total"])) for r in rows] == [
        (d["number"], d["display_number"], d["kind"], d["corrects"], d["total"]) for d in issued
    ]
    assert (
        rows[0]["net"] == BIG + 3
        and rows[0]["name"] is None
        and rows[0]["due_date"].isoformat() == issued[0]["due_date"]
    )
    as_csv = tmp_path / "lines.csv"
    assert (
        run(
            "documents", "export", "--period", "2026-03", "--what", "lines", "--format", "csv", "--out", str(as_csv)
        ).exit_code
        == 0
    )
    with as_csv.open(newline="") as f:
        lines = list(csv.DictReader(f))
    assert [(r["number"], r["product"], r["quantity"], r["net"]) for r in lines] == [
        ("1", "CPU", "1.5", str(BIG)),
        ("1", "GPU", "0.5", "3"),
        ("2", "CPU", "1.5", "40"),
        ("3", "CPU", "1.5", "-10"),
    ]
    documents_csv = tmp_path / "documents.csv"
    run("documents", "export", "--format", "csv", "--out", str(documents_csv))
    with documents_csv.open(newline="") as f:
        assert [(r["display_number"], r["kind"], r["corrects"]) for r in csv.DictReader(f)] == [
            ("INV-000001", "invoice", ""),
            ("INV-000002", "invoice", ""),
            ("INV-000003", "credit_note", "2"),
        ]
    refused = process(
        "documents", "export", "--format", "csv", "--out", str(tmp_path / "no" / "such" / "r.csv"), url=url
    )
    assert refused.returncode == 2 and refused.stderr.startswith("error: cannot write")
    assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "no").exists()


def test_the_register_exports_the_tax_per_rate_and_lines_per_price_book_with_their_prices(
    url: str, tmp_path: Path
) -> None:
    with Store(url) as store:
        store.record_price_books([PriceRow("pb", "CPU", "USD", "hour", "0.05", "0.04", None)])
        complete(
            store,
            "b2",
            partial("acct-1", product="GPU", pricebook="pb2", region="DE", tax_rate="0.19", net=100, tax=19),
            partial("acct-2", currency="EUR", region="FR", net=10, tax=2),
        )
    run("seller", "set", *SELLER_ARGS)
    run("close", "--period", "2026-03")
    taxes_csv, taxes_parquet, lines_csv = tmp_path / "taxes.csv", tmp_path / "taxes.parquet", tmp_path / "lines.csv"
    done = run("documents", "export", "--what", "taxes", "--format", "csv", "--out", str(taxes_csv))
    assert done.exit_code == 0 and done.output == f"wrote 3 tax record(s) to {taxes_csv}\n"
    with taxes_csv.open(newline="") as f:
        assert [tuple(r.values()) for r in csv.DictReader(f)] == [
            ("1", "INV-000001", "0.19", "DE", "100", "19"),
            ("1", "INV-000001", "0.2", "*", str(BIG + 3), str(BIG // 5 + 1)),
            ("2", "INV-000002", "0.2", "* FR", "50", "6"),
        ]
    run("documents", "export", "--what", "taxes", "--format", "parquet", "--out", str(taxes_parquet))
    by_rate = [
        (r["rate"], r["regions"], int(r["net"]), int(r["tax"])) for r in pq.read_table(taxes_parquet).to_pylist()
    ]
    assert by_rate == [
        (t["rate"], t["regions"], t["net"], t["tax"])
        for d in documents(url)
        for t in d["taxes"]  # type: ignore[attr-defined]
    ]
    run("documents", "export", "--what", "lines", "--format", "csv", "--out", str(lines_csv))
    with lines_csv.open(newline="") as f:
        prices = [
            (r["number"], r["product"], r["pricebook"], r["unit"], r["unit_price"], r["offpeak_unit_price"])
            for r in csv.DictReader(f)
        ]
    assert prices == [
        ("1", "CPU", "pb", "hour", "0.05", "0.04"),
        ("1", "GPU", "pb", "", "", ""),  # the price book's rows do not list it
        ("1", "GPU", "pb2", "", "", ""),  # its rows are not recorded
        ("2", "CPU", "pb", "hour", "0.05", "0.04"),
    ]
    shown = run("documents", "show", "1").output.splitlines()
    header = next(line for line in shown if line.startswith("product"))
    assert header.split()[:6] == ["product", "price", "book", "unit", "unit", "price"]
    assert any(line.split()[:5] == ["CPU", "pb", "hour", "0.05", "0.04"] for line in shown)
    block = shown[shown.index("tax by rate") :]
    assert [line.split()[:3] for line in block[2:]] == [["19", "%", "DE"], ["20", "%", "*"]]
