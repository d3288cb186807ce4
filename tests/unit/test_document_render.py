"""A document as it reads (HTML) and prints (PDF, read back with poppler's ``pdftotext``), rendered from its JSON: a
full Part 3 credit note (seller and buyer, corrects, a product split by price book, off-peak prices, two tax
rates), an invoice without a customer record that notes correct, and a document issued before Part 3."""

from __future__ import annotations

import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from billing.console import invoice
from billing.console.pdf import pdf
from shared.rules.reference import money
from support.documents import CORRECTED, CREDIT, NEW_BOOK, OLD, OLD_BOOK
from support.tools import require


class _Text(HTMLParser):
    """The text of an HTML page's ``<article>`` as its cells and lines read (a space between elements)."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = False
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.inside = self.inside or tag == "article"
        self.parts.append(" ")

    def handle_endtag(self, tag: str) -> None:
        self.inside = self.inside and tag != "article"
        self.parts.append(" ")

    def handle_data(self, data: str) -> None:
        if self.inside:
            self.parts.append(data)


def article_text(page: str) -> str:
    parser = _Text()
    parser.feed(page)
    return " ".join("".join(parser.parts).split())


def pdf_text(doc: dict[str, Any], tmp_path: Path) -> str:
    pdftotext = require("pdftotext", "reads the documents' PDF; `bash deploy/install-poppler.sh` installs it")
    path = tmp_path / "document.pdf"
    path.write_bytes(pdf(doc))
    done = subprocess.run([pdftotext, "-layout", str(path), "-"], capture_output=True, text=True, check=True)
    return done.stdout


def test_a_credit_note_shows_its_parties_dates_prices_and_tax_per_rate(tmp_path: Path) -> None:
    for text in (article_text(invoice.html(CREDIT, standalone=True)), pdf_text(CREDIT, tmp_path)):
        flat = " ".join(text.split())
        assert flat.count("ACME-000007") == 1, "the display number once"
        assert "Credit note ACME-000007" in flat and "No. 7" not in flat
        for shown in ("Acme Cloud GmbH", "Hauptstr. 1", "10115 Berlin", "DE", "tax id DE123"):
            assert shown in flat, shown
        for shown in ("Globex Ltd", "1 High Street, London", "GB", "tax id GB999", "account acct-0001"):
            assert shown in flat, shown
        assert "2026-03-01 to 2026-03-31" in flat and "2026-04-02 09:30:00 UTC" in flat and "2026-05-02" in flat
        assert "corrects ACME-000001, ACME-000004" in flat
        assert "negative amounts are credits" in flat
        assert "20 %" in flat and "7.25 %" in flat and "other regions (*), DE" in flat and "US-CA" in flat
        for name in ("net", "tax", "total"):
            assert money(CREDIT[name], "EUR") in flat
    text = pdf_text(CREDIT, tmp_path)
    rows = text.splitlines()
    split = [r for r in rows if r.strip().startswith("compute.gpu-hour")]
    assert len(split) == 2, "one line per (product, price book)"
    assert OLD_BOOK[: invoice.HASH_SHOWN] in split[0] and NEW_BOOK[: invoice.HASH_SHOWN] in split[1]
    assert re.search(r"hour\s+40\s+32\.5\s", split[0]) and re.search(r"hour\s+40\s+40\s", split[1]), split
    storage = next(r for r in rows if r.strip().startswith("storage.gb-month"))
    assert "GB-month" in storage and "0.05" in storage and NEW_BOOK[:12] not in storage, "not split: no price book"
    products = [r for r in rows if r.strip().startswith(("compute.", "storage."))]
    for line, row in zip(CREDIT["lines"], products, strict=True):
        for name in ("net", "tax", "total"):
            assert money(line[name], "EUR") in row, (name, row)
    for entry in CREDIT["taxes"]:
        tax_row = next(r for r in rows if r.strip().startswith(invoice.percent(entry["rate"])))
        assert money(entry["net"], "EUR") in tax_row and money(entry["tax"], "EUR") in tax_row, tax_row


def test_the_html_page_lays_the_lines_out_in_columns() -> None:
    shown = invoice.view(CREDIT)
    assert shown.columns == (
        "product",
        "price book",
        "transactions",
        "quantity",
        "unit",
        "unit price (EUR)",
        "off-peak price (EUR)",
        "net",
        "tax",
        "total",
    )
    assert shown.lines[2][:7] == ("storage.gb-month", "", "2", "-10", "GB-month", "0.05", "0.05")
    assert shown.taxes == (
        ("7.25 %", "US-CA", money(-2_000, "EUR"), money(-145, "EUR")),
        ("20 %", "other regions (*), DE", money(-10_500, "EUR"), money(-1_974, "EUR")),
    )
    page = invoice.html(CREDIT, standalone=True)
    assert '<address class="party" id="seller">' in page and '<address class="party" id="buyer">' in page
    assert '<tr data-rate="20 %">' in page and "<form" not in page


def test_an_invoice_names_its_corrections_and_an_account_without_customer_is_the_buyer(tmp_path: Path) -> None:
    for text in (article_text(invoice.html(CORRECTED, standalone=True)), pdf_text(CORRECTED, tmp_path)):
        flat = " ".join(text.split())
        assert "Invoice ACME-000001" in flat and "corrected by ACME-000004, ACME-000007" in flat
        assert "BUYER acct-0001" in flat.replace("Buyer", "BUYER") and "Globex" not in flat
        assert "negative amounts" not in flat


def test_a_document_issued_before_part_3_renders_with_what_it_has(tmp_path: Path) -> None:
    shown = invoice.view(OLD)
    assert shown.title == "Credit note No. 2" and shown.seller == invoice.NOT_RECORDED and shown.buyer == ("acct-0001",)
    assert shown.columns == ("product", "transactions", "quantity", "net", "tax", "total") and shown.taxes == ()
    assert [name for name, _ in shown.facts] == ["period", "issued", "account", "currency"]
    flat = " ".join(pdf_text(OLD, tmp_path).split())
    assert "Credit note No. 2" in flat and "not recorded" in flat and "Tax by rate" not in flat
    assert money(OLD["total"], "EUR") in flat


@pytest.mark.parametrize(("rate", "shown"), [("0.2", "20 %"), ("0", "0 %"), ("0.0725", "7.25 %"), ("1", "100 %")])
def test_a_rate_shows_as_a_percentage(rate: str, shown: str) -> None:
    assert invoice.percent(rate) == shown
