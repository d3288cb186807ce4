"""The billing spec's Part 3 end to end, through the real roles: a seller and customers registered (one account
without a customer record), two price book versions (the second in force from mid-March, other prices and a
``unit`` column), one file with rows on both sides of the switch in regions taxed at different rates; March
closed; then a late March row in a batch of its own and a void; March closed again. Every document against the
reference model (kinds, ``corrects``, lines per product and price book with their unit prices, tax per rate),
its snapshots, dates and display number; the credit note's PDF read back with ``pdftotext``; the register export
of documents, lines and taxes; the credit note's page and the periods page in Chromium, saved as screenshots."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import subprocess
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, expect

from benchmarks import reference_model as model
from billing.sample import sample_price_book_bytes, sample_tax_table_bytes
from shared.rules.reference import money
from shared.settings import Settings
from support.browser import DESKTOP, console_server
from support.exact import billing, read_raw
from support.roles import Roles
from support.taxes import TaxesByRate, line_prices
from support.tools import require

HEADER = "transaction_id,account_id,timestamp,product,quantity,region\n"
FIRST, SWITCH = date(2026, 3, 1), date(2026, 3, 16)
#: The version from 16 March: other prices, and a unit per product.
NEW_BOOK = (
    "product,currency,unit_price,offpeak_unit_price,minimum_charge,unit\n"
    "compute.gpu-hour,USD,2.75,1.9,0.50,hour\n"
    "storage.gb-month,EUR,0.0215,,,GB-month\n"
    "network.egress-gb,EUR,0.095,0.052,0.01,GB\n"
)
MARCH = HEADER + (
    "m01,acct-a,2026-03-02T10:00:00Z,storage.gb-month,1200,DE\n"
    "m02,acct-a,2026-03-03T23:00:00Z,network.egress-gb,340.5,FR\n"
    "m03,acct-a,2026-03-17T10:00:00Z,storage.gb-month,800,DE\n"
    "m04,acct-a,2026-03-18T09:00:00Z,network.egress-gb,99.25,FR\n"
    "m05,acct-a,2026-03-20T12:00:00Z,compute.gpu-hour,12,US-CA\n"
    "m06,acct-b,2026-03-05T10:00:00Z,storage.gb-month,50,FR\n"
    "m07,acct-b,2026-03-25T10:00:00Z,storage.gb-month,70,GB\n"
    "m08,acct-c,2026-03-10T11:00:00Z,network.egress-gb,12.5,DE\n"
    "m09,acct-c,2026-03-28T11:00:00Z,network.egress-gb,7,\n"
    "m10,acct-c,2026-02-27T10:00:00Z,storage.gb-month,5,DE\n"  # before the first version: rejected
    "m11,acct-a,2026-03-15T23:59:59Z,storage.gb-month,10,DE\n"  # the old price book's last second
    "m12,acct-a,2026-03-16T00:00:00Z,storage.gb-month,10,DE\n"  # the new one's first
)
EXTRA = HEADER + (
    "x1,acct-b,2026-03-12T10:00:00Z,network.egress-gb,400,FR\n"
    "x2,acct-b,2026-03-19T10:00:00Z,network.egress-gb,250,DE\n"
    "x3,acct-b,2026-03-19T10:00:00Z,storage.gb-month,30,FR\n"
)
LATE = HEADER + (
    "l1,acct-a,2026-03-04T10:00:00Z,storage.gb-month,300,DE\n"  # priced by the old book, submitted after the new
    "l2,acct-a,2026-03-22T23:30:00Z,network.egress-gb,20,FR\n"
    "m01,acct-a,2026-03-02T10:00:00Z,storage.gb-month,1200,DE\n"  # counted already: rejected
    "l3,acct-d,2026-03-30T10:00:00Z,network.egress-gb,5,GB\n"
)
CUSTOMERS = (
    "account_id,name,address,country,tax_id,email\n"
    'acct-a,Globex Ltd,"1 High Street, London",GB,GB999999973,ap@globex.example\n'
    "acct-b,Initech SARL,12 rue de la Paix 75002 Paris,FR,FR40303265045,\n"
)
SELLER = ("--name", "Acme Cloud GmbH", "--country", "DE", "--tax-id", "DE123456789", "--payment-terms-days", "14")
SELLER_ADDRESSES = ("Hauptstrasse 1, 10115 Berlin", "Torstrasse 9, 10119 Berlin")


def listed(*args: str) -> list[dict[str, Any]]:
    return list(json.loads(billing("documents", "list", "--format", "json", *args).stdout))


def run_roles(roles: Roles) -> None:
    for role in ("initiator", "processor", "controller"):
        roles.burst(role)


def submit(ledger: model.Ledger, folder: Path, batch_id: str, text: str) -> list[model.Row | str]:
    path = folder / f"{batch_id}.csv"
    path.write_text(text)
    billing("submit", str(path), "--batch-id", batch_id)
    return ledger.batch(batch_id, read_raw(path))


def register(folder: Path) -> tuple[model.Ledger, dict[tuple[str, str], dict[str, str]]]:
    """Seller, customers and the two versions registered; the model with the same versions, and the prices each
    (price book, product) line must show."""
    old_book, taxes = sample_price_book_bytes().decode(), sample_tax_table_bytes().decode()
    files = {"old.csv": old_book, "new.csv": NEW_BOOK, "taxes.csv": taxes, "customers.csv": CUSTOMERS}
    for name, text in files.items():
        (folder / name).write_text(text)
    for book, effective in (("old.csv", FIRST), ("new.csv", SWITCH)):
        billing(
            "reference", "set", "--pricebook", str(folder / book), "--taxes", str(folder / "taxes.csv"),
            "--effective-from", effective.isoformat(),
        )  # fmt: skip
    billing("seller", "set", *SELLER, "--address", SELLER_ADDRESSES[0], "--prefix", "ACME-")
    assert "2 added" in billing("customers", "import", str(folder / "customers.csv")).stdout
    versions = [model.read_version(FIRST, old_book, taxes), model.read_version(SWITCH, NEW_BOOK, taxes)]
    ledger = model.Ledger(versions[0].prices, versions[0].rates, versions)
    return ledger, line_prices([old_book, NEW_BOOK])


def test_two_closes_issue_documents_an_accountant_accepts(
    settings_env: Settings, roles: Roles, browser: Browser, tmp_path: Path, artifacts: Path
) -> None:
    ledger, prices = register(tmp_path)
    taxes = TaxesByRate(ledger)
    assert "no_reference_data" in submit(ledger, tmp_path, "march", MARCH)
    submit(ledger, tmp_path, "extra", EXTRA)
    run_roles(roles)

    said = billing("close", "--period", "2026-03").stdout
    expected = ledger.close("2026-03")
    expected_taxes = taxes.close("2026-03", expected)
    assert "issued 4 document(s)" in said and "4 invoice(s)" in said, said
    assert "accounts without a customer record: 1 (acct-c)" in said, said
    first = listed()
    assert model.as_model(first, priced=True) == ledger.documents
    assert [(d["account_id"], d["currency"], d["kind"]) for d in first] == [
        ("acct-a", "EUR", "invoice"),
        ("acct-a", "USD", "invoice"),
        ("acct-b", "EUR", "invoice"),
        ("acct-c", "EUR", "invoice"),
    ]
    check_documents(first, expected_taxes, prices, seller_address=SELLER_ADDRESSES[0])
    a_eur = first[0]
    assert {(line["product"], line["pricebook"]) for line in a_eur["lines"]} == {
        (product, v.pricebook) for v in ledger.versions or [] for product in ("network.egress-gb", "storage.gb-month")
    }, "both price books rated acct-a's storage and egress"

    billing("seller", "set", *SELLER, "--address", SELLER_ADDRESSES[1], "--prefix", "ACME-")
    (tmp_path / "moved.csv").write_text(CUSTOMERS.replace("1 High Street", "2 Low Street"))
    assert "1 changed" in billing("customers", "import", str(tmp_path / "moved.csv")).stdout
    assert "duplicate_transaction_id" in submit(ledger, tmp_path, "late", LATE)
    run_roles(roles)
    billing("void", "extra")
    ledger.void("extra")
    env = {**os.environ, **settings_env.as_env()}
    with console_server(env, tmp_path / "serve.log") as url:
        screenshot_periods(
            browser, url, artifacts / "periods-pending.png", pending=("credit note", "debit note", "invoice")
        )

    said = billing("close", "--period", "2026-03").stdout
    expected = ledger.close("2026-03")
    expected_taxes = taxes.close("2026-03", expected)
    assert "issued 3 document(s)" in said and "accounts without a customer record: 1 (acct-d)" in said, said
    after = listed()
    assert [{k: v for k, v in d.items() if k != "corrected_by"} for d in after[:4]] == [
        {k: v for k, v in d.items() if k != "corrected_by"} for d in first
    ], "issued documents never change"
    assert model.as_model(after, priced=True) == ledger.documents
    notes = after[4:]
    assert [(d["account_id"], d["kind"], d["corrects"]) for d in notes] == [
        ("acct-a", "debit_note", [1]),
        ("acct-b", "credit_note", [3]),
        ("acct-d", "invoice", []),
    ]
    assert [d["corrected_by"] for d in after[:4]] == [[5], [], [6], []]
    check_documents(notes, expected_taxes, prices, seller_address=SELLER_ADDRESSES[1])
    debit, credit = notes[0], notes[1]
    assert a_eur["customer"]["address"] == "1 High Street, London", "the invoice keeps its customer"
    assert debit["customer"]["address"] == "2 Low Street, London"
    old_book = (ledger.versions or [])[0].pricebook
    assert {line["pricebook"] for line in debit["lines"] if line["product"] == "storage.gb-month"} == {old_book}, (
        "a late row is priced by the book in force on its date"
    )
    assert {b for line in credit["lines"] for b in line["batches"]} == {"extra"}

    check_pdf(credit, first[2], tmp_path, artifacts)
    check_export(after, tmp_path)
    with console_server(env, tmp_path / "serve.log") as url:
        screenshot_document(browser, url, credit, artifacts / "credit-note.png")
        screenshot_periods(browser, url, artifacts / "periods-closed.png", pending=("nothing",))
        screenshot_period(browser, url, after, artifacts / "period-2026-03.png")


def check_documents(
    docs: list[dict[str, Any]],
    taxes: list[list[dict[str, Any]]],
    prices: dict[tuple[str, str], dict[str, str]],
    *,
    seller_address: str,
) -> None:
    """Each document's display number, snapshots, dates, lines (one per product and price book, sorted, with the
    book's unit and prices) and tax per rate (the model's, adding up to the document)."""
    customers = {row["account_id"]: row for row in csv.DictReader(CUSTOMERS.splitlines())}
    for doc, want in zip(docs, taxes, strict=True):
        assert doc["display_number"] == f"ACME-{doc['number']:06d}"
        assert doc["seller"] == {
            "name": "Acme Cloud GmbH", "address": seller_address, "country": "DE", "tax_id": "DE123456789"
        }  # fmt: skip
        customer = customers.get(doc["account_id"])
        if customer is None:
            assert doc["customer"] is None, doc["account_id"]
        else:
            assert doc["customer"]["name"] == customer["name"] and doc["customer"]["tax_id"] == customer["tax_id"]
            assert (
                doc["customer"]["country"] == customer["country"]
                and doc["customer"]["account_id"] == customer["account_id"]
            )
        assert doc["service_period"] == {"from": "2026-03-01", "to": "2026-03-31"}
        issued = datetime.fromisoformat(doc["issued_at"]).date()
        assert doc["due_date"] == (issued + timedelta(days=14)).isoformat()
        keys = [(line["product"], line["pricebook"]) for line in doc["lines"]]
        assert keys == sorted(set(keys)), "one line per (product, price book), sorted"
        assert doc["pricebooks"] == sorted({line["pricebook"] for line in doc["lines"]}), "the books that rated it"
        assert doc["tax_tables"] == [hashlib.sha256(sample_tax_table_bytes()).hexdigest()]
        for line in doc["lines"]:
            shown = {k: line[k] for k in ("unit", "unit_price", "offpeak_unit_price")}
            assert shown == prices[line["pricebook"], line["product"]], line
        assert doc["taxes"] == want, doc["number"]
        assert sum(t["net"] for t in doc["taxes"]) == doc["net"]
        assert sum(t["tax"] for t in doc["taxes"]) == doc["tax"]


def check_pdf(credit: dict[str, Any], corrected: dict[str, Any], tmp_path: Path, artifacts: Path) -> None:
    """The credit note's PDF (``billing documents show --format pdf``) read back with ``pdftotext``: seller,
    buyer, title, what it corrects, a line per rate of its tax, its totals."""
    pdftotext = require("pdftotext", "reads the documents' PDF; `bash deploy/install-poppler.sh` installs it")
    out = artifacts / "credit-note.pdf"
    billing("documents", "show", str(credit["number"]), "--format", "pdf", "--output", str(out))
    text = subprocess.run([pdftotext, "-layout", str(out), "-"], capture_output=True, text=True, check=True).stdout
    flat = " ".join(text.split())
    for shown in ("Acme Cloud GmbH", SELLER_ADDRESSES[1], "DE123456789", "Initech SARL", "FR40303265045"):
        assert shown in flat, (shown, text)
    assert f"Credit note {credit['display_number']}" in flat and f"corrects {corrected['display_number']}" in flat
    assert "2026-03-01 to 2026-03-31" in flat and credit["due_date"] in flat
    assert [t["rate"] for t in credit["taxes"]] == ["0.19", "0.2"], "the void credits rows taxed 19 % and 20 %"
    for tax, percent in zip(credit["taxes"], ("19 %", "20 %"), strict=True):
        row = next((r for r in text.splitlines() if percent in r and money(tax["tax"], "EUR") in r), None)
        assert row is not None and money(tax["net"], "EUR") in row, (tax, text)
        assert all(region in row for region in tax["regions"]), (tax, row)
    for name in ("net", "tax", "total"):
        assert money(credit[name], "EUR") in flat


def check_export(docs: list[dict[str, Any]], tmp_path: Path) -> None:
    """``billing documents export`` of documents, lines and taxes as CSV: a record per document, line and rate,
    money in minor units, equal to the documents' JSON."""
    read: dict[str, list[dict[str, str]]] = {}
    for what in ("documents", "lines", "taxes"):
        out = tmp_path / f"{what}.csv"
        billing("documents", "export", "--period", "2026-03", "--what", what, "--format", "csv", "--out", str(out))
        with out.open(newline="") as file:
            read[what] = list(csv.DictReader(file))
    assert [
        (int(r["number"]), r["display_number"], r["kind"], r["account_id"], r["name"], int(r["total"]), r["corrects"])
        for r in read["documents"]
    ] == [
        (d["number"], d["display_number"], d["kind"], d["account_id"], (d["customer"] or {}).get("name", ""),
         d["total"], " ".join(str(n) for n in d["corrects"]))
        for d in docs
    ]  # fmt: skip
    assert [
        (int(r["number"]), r["product"], r["pricebook"], r["unit"], r["unit_price"], r["offpeak_unit_price"],
         int(r["net"]), int(r["tax"]))
        for r in read["lines"]
    ] == [
        (d["number"], line["product"], line["pricebook"], line["unit"], line["unit_price"],
         line["offpeak_unit_price"], line["net"], line["tax"])
        for d in docs
        for line in d["lines"]
    ]  # fmt: skip
    assert [
        (int(r["number"]), r["display_number"], r["rate"], r["regions"], int(r["net"]), int(r["tax"]))
        for r in read["taxes"]
    ] == [
        (d["number"], d["display_number"], t["rate"], " ".join(t["regions"]), t["net"], t["tax"])
        for d in docs
        for t in d["taxes"]
    ]  # fmt: skip


def screenshot_periods(browser: Browser, url: str, path: Path, *, pending: tuple[str, ...]) -> None:
    """The periods page: March closed, its pending difference labelled by kind (``pending``: what its cell
    says)."""
    page = browser.new_page(viewport=DESKTOP)
    page.goto(f"{url}/periods")
    row = page.locator('tr[data-period="2026-03"]')
    expect(row).to_have_attribute("data-state", "closed")
    for words in pending:
        expect(row.locator('[data-field="pending"]')).to_contain_text(words)
    assert "adjustment" not in row.inner_text().lower()
    page.screenshot(path=path, full_page=True)
    page.close()


def screenshot_document(browser: Browser, url: str, credit: dict[str, Any], path: Path) -> None:
    """The credit note's page in the console: title, parties, what it corrects, its lines and tax per rate."""
    page = browser.new_page(viewport=DESKTOP)
    page.goto(f"{url}/documents/{credit['number']}")
    expect(page.locator("h1")).to_have_text(f"Credit note {credit['display_number']}")
    expect(page.locator("#seller")).to_contain_text("Acme Cloud GmbH")
    expect(page.locator("#buyer")).to_contain_text("Initech SARL")
    expect(page.locator('[data-fact="corrects"]')).to_have_text("ACME-000003")
    expect(page.locator("table.lines tbody tr")).to_have_count(len(credit["lines"]))
    expect(page.locator("#taxes tbody tr")).to_have_count(len(credit["taxes"]))
    expect(page.locator('[data-total="total"]')).to_have_text(money(credit["total"], "EUR"))
    hidden = page.locator("table.lines").evaluate("t => t.parentElement.scrollWidth - t.parentElement.clientWidth")
    assert hidden <= 0, "on a desktop the lines, split per price book, show every column without scrolling"
    page.screenshot(path=path, full_page=True)
    page.close()


def screenshot_period(browser: Browser, url: str, docs: list[dict[str, Any]], path: Path) -> None:
    """March's page: its documents by display number and kind, nothing pending."""
    page = browser.new_page(viewport=DESKTOP)
    page.goto(f"{url}/periods/2026-03")
    expect(page.locator("#state")).to_have_text("closed")
    rows = page.locator("#documents tbody tr")
    expect(rows).to_have_count(len(docs))
    kinds = {"invoice": "invoice", "credit_note": "credit note", "debit_note": "debit note"}
    for doc in docs:
        row = page.locator(f'#documents tr[data-number="{doc["number"]}"]')
        expect(row.locator("a")).to_have_text(doc["display_number"])
        expect(row).to_contain_text(kinds[doc["kind"]], ignore_case=True)
        expect(row.locator("td[data-minor]")).to_have_text(money(doc["total"], doc["currency"]))
    page.screenshot(path=path, full_page=True)
    page.close()
