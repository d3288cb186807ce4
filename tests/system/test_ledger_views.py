"""Where people look at the ledger, through the real roles, ``billing serve`` as a process and Debian's headless
chromium: a period closed from its console page, a batch voided from a document's page, the pending difference
(console, API, ``billing report invoices``) equal to what the reference model's next close issues, and a
document that reads and prints as an invoice: the page (print media), the file of ``billing documents show
--format html`` and its PDF, read back with poppler's ``pdftotext`` and ``pdftoppm``. Money to the minor unit,
shown in the currency's own units."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
from PIL import Image
from playwright.sync_api import Browser, Page, expect

from benchmarks import reference_model as model
from billing.sample import sample_price_book_bytes, sample_tax_table_bytes
from shared.rules.reference import money
from shared.settings import Settings
from support.browser import DESKTOP, console_server
from support.exact import billing, read_raw
from support.ledger import SELLER_ARGS
from support.roles import Roles
from support.tools import require

TOKEN = "ledger-views-token"
SECONDS = 1000  # Playwright waits in milliseconds
HEADER = "transaction_id,account_id,timestamp,product,quantity,region\n"
FIRST = HEADER + (
    "a1,acct-x,2026-03-02T10:00:00Z,compute.gpu-hour,1234.5,US-CA\n"
    "a2,acct-x,2026-03-05T10:00:00Z,storage.gb-month,12,DE\n"
    "a3,acct-y,2026-03-07T12:00:00Z,transfer.jp-gb,40,JP\n"
    "a4,acct-z,2026-03-09T23:30:00Z,vm.kw-hour,3.25,\n"
    "a5,acct-x,2026-03-12T08:00:00Z,compute.vcpu-hour,0.5,US-CA\n"
)
LATER = HEADER + (
    "l1,acct-x,2026-03-20T08:00:00Z,compute.gpu-hour,2,US-CA\n"  # a closed period's row: a note
    "l2,acct-new,2026-03-21T08:00:00Z,sms.message,7,GB\n"
    "l3,acct-x,2026-04-02T08:00:00Z,compute.gpu-hour,1,\n"
)


def run_roles(roles: Roles) -> None:
    for role in ("initiator", "processor", "controller"):
        roles.burst(role)


def act(page: Page, action: str) -> None:
    """Fill the console token into the form posting to ``action`` and send it."""
    form = page.locator(f'form[action="{action}"]')
    form.locator("input[name=token]").fill(TOKEN)
    form.locator("button").click()


def test_a_period_closed_and_a_batch_voided_from_the_console_documents_read_and_print_as_invoices(
    settings_env: Settings, roles: Roles, browser: Browser, tmp_path: Path, artifacts: Path
) -> None:
    pdftotext = require("pdftotext", "reads the documents' PDF; `bash deploy/install-poppler.sh` installs it")
    pdftoppm = require("pdftoppm", "draws the documents' PDF; `bash deploy/install-poppler.sh` installs it")
    ledger = model.Ledger(
        model.read_prices(sample_price_book_bytes().decode()), model.read_rates(sample_tax_table_bytes().decode())
    )
    files = {"first": tmp_path / "first.csv", "later": tmp_path / "later.csv"}
    files["first"].write_text(FIRST)
    files["later"].write_text(LATER)
    billing("reference", "set", "--sample")
    billing("seller", "set", *SELLER_ARGS)
    billing("submit", str(files["first"]), "--batch-id", "first")
    ledger.batch("first", read_raw(files["first"]))
    run_roles(roles)

    env = {**os.environ, **settings_env.as_env(), "BILLING_CONSOLE_TOKEN": TOKEN}
    with console_server(env, tmp_path / "serve.log") as url:
        api = httpx.Client(base_url=url, timeout=60)
        page = browser.new_page(viewport=DESKTOP)
        page.set_default_timeout(60 * SECONDS)
        page.goto(f"{url}/periods")
        expect(page.locator('tr[data-period="2026-03"]')).to_have_attribute("data-state", "open")
        assert model.as_model(api.get("/api/periods/2026-03").json()["pending"], numbered=False) == model.as_model(
            copy.deepcopy(ledger).close("2026-03"), numbered=False
        ), "an open period's pending difference: everything billed"

        page.click('a[href="/periods/2026-03"]')
        act(page, "/periods/2026-03/close")
        expect(page.locator("#issued")).to_have_text("Closed: 4 document(s) issued.")
        expected = ledger.close("2026-03")
        assert model.as_model(api.get("/api/documents").json()) == expected
        shown = {
            int(number): total
            for number, total in page.locator("#documents tbody tr").evaluate_all(
                "rows => rows.map(r => [r.dataset.number, r.querySelector('td[data-minor]').innerText])"
            )
        }
        assert shown == {d["number"]: money(d["total"], d["currency"]) for d in expected}
        page.screenshot(path=artifacts / "period.png", full_page=True)

        page.click('a[href="/documents/1"]')
        invoice = expected[0]
        expect(page.locator("h1")).to_have_text("Invoice INV-000001")
        for name in ("net", "tax", "total"):
            expect(page.locator(f'[data-total="{name}"]')).to_have_text(money(invoice[name], invoice["currency"]))
        expect(page.locator('[data-fact="account"]')).to_have_text(invoice["account_id"])
        page.emulate_media(media="print")
        assert not page.locator("header").is_visible() and not page.locator("form").first.is_visible()
        assert page.locator("#document").is_visible() and page.locator("address#seller").is_visible()
        page.screenshot(path=artifacts / "document-print.png", full_page=True)
        page.emulate_media(media="screen")

        billing("submit", str(files["later"]), "--batch-id", "later")  # rows of the closed March, and April's
        ledger.batch("later", read_raw(files["later"]))
        run_roles(roles)
        _check_pending(api, ledger)

        act(page, "/batches/first/void")  # from the document's page
        expect(page.locator("#voided-notice")).to_be_visible()
        expect(page.locator("#voided")).to_contain_text("counts nowhere")
        ledger.void("first")
        pending = _check_pending(api, ledger)
        refused = page.request.post(f"{url}/api/batches/first/void", form={"token": TOKEN, "csrf": "forged"})
        assert refused.status == 403, "the CSRF value is checked"

    done = billing("close", "--period", "2026-03")
    issued = ledger.close("2026-03")
    assert model.as_model(json.loads(billing("documents", "list", "--format", "json").stdout)) == ledger.documents
    assert pending == model.as_model(issued, numbered=False) and f"issued {len(issued)} document(s)" in done.stdout
    credit = next(d for d in issued if d["total"] < 0)
    _check_pdf(credit, tmp_path, artifacts, pdftotext, pdftoppm)
    _check_html(invoice, tmp_path, browser)


def _check_pending(api: httpx.Client, ledger: model.Ledger) -> list[dict[str, Any]]:
    """The closed March's pending difference in the API and in ``billing report invoices``: the model's next
    close."""
    expected = copy.deepcopy(ledger).close("2026-03")
    pending = model.as_model(api.get("/api/periods/2026-03").json()["pending"], numbered=False)
    assert pending and pending == model.as_model(expected, numbered=False)
    said = billing("report", "invoices", "--period", "2026-03")
    assert "period 2026-03 is closed; pending difference" in said.stderr
    for doc in expected:
        total = f"total {money(doc['total'], doc['currency'])}"
        assert any(
            total in line and f" {doc['account_id']} " in line and doc["kind"] in line
            for line in said.stderr.splitlines()
        ), (doc, said.stderr)
    assert "in each row's currency units" in said.stdout
    return pending


def _check_pdf(doc: dict[str, Any], tmp_path: Path, artifacts: Path, pdftotext: str, pdftoppm: str) -> None:
    """``billing documents show --format pdf``: its text names the document and every figure in the currency's
    units; its first page draws as an A4 page with ink on it."""
    out = tmp_path / "credit.pdf"
    billing("documents", "show", str(doc["number"]), "--format", "pdf", "--output", str(out))
    text = subprocess.run([pdftotext, "-layout", str(out), "-"], capture_output=True, text=True, check=True).stdout
    assert "SELLER" in text and "BUYER" in text and "placeholder" not in text
    assert re.search(rf"Credit note \S+{doc['number']:06d}\b", text), text
    assert doc["account_id"] in text and "2026-03" in text and "negative amounts are credits" in text
    for line in doc["lines"]:
        row = next(r for r in text.splitlines() if r.strip().startswith(line["product"]))
        for name in ("net", "tax", "total"):
            assert money(line[name], doc["currency"]) in row, (row, line)
    for name in ("net", "tax", "total"):
        figure = re.escape(money(doc[name], doc["currency"]))
        assert any(re.fullmatch(rf"\s*{name}\s+{figure}\s*", r) for r in text.splitlines()), (name, text)
    drawn = artifacts / "credit"
    subprocess.run([pdftoppm, "-png", "-r", "40", "-singlefile", str(out), str(drawn)], check=True)
    with Image.open(drawn.with_suffix(".png")) as image:
        width, height = image.size
        assert abs(height / width - 297 / 210) < 0.02, "A4"
        dark = sum(image.convert("L").histogram()[:128])  # pixels darker than mid-grey
        assert dark > 500, "text drawn on the page"


def _check_html(doc: dict[str, Any], tmp_path: Path, browser: Browser) -> None:
    """``billing documents show --format html``: one file that needs nothing else, the console's template."""
    out = tmp_path / "invoice.html"
    billing("documents", "show", str(doc["number"]), "--format", "html", "--output", str(out))
    offline = browser.new_page(viewport=DESKTOP)
    requested: list[str] = []
    offline.on("request", lambda request: requested.append(request.url))
    offline.route("http*://**/*", lambda route: route.abort())
    offline.goto(out.as_uri())
    expect(offline.locator("h1")).to_have_text(f"Invoice INV-{doc['number']:06d}")
    expect(offline.locator('[data-total="total"]')).to_have_text(money(doc["total"], doc["currency"]))
    assert offline.locator("form").count() == 0 and offline.locator("header a").count() == 0
    assert requested == [out.as_uri()]
