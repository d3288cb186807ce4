"""A Part 3 document's page in Debian's headless chromium (the file ``billing documents show --format html`` writes,
the console's template): a credit note with its seller and buyer, what it corrects, its lines split by price book
and its tax per rate, on a desktop, on a phone and as printed; screenshots saved for a person to look at."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Browser, expect

from billing.console import invoice
from shared.rules.reference import money
from support.browser import DESKTOP, PHONE
from support.documents import CORRECTED, CREDIT


def test_a_credit_note_page_reads_on_a_desktop_a_phone_and_in_print(
    browser: Browser, tmp_path: Path, artifacts: Path
) -> None:
    out = tmp_path / "credit.html"
    out.write_text(invoice.html(CREDIT, standalone=True), encoding="utf-8")
    for name, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        page = browser.new_page(viewport=viewport)
        page.goto(out.as_uri())
        expect(page.locator("h1")).to_have_text("Credit note ACME-000007")
        expect(page.locator("#seller")).to_contain_text("Acme Cloud GmbH")
        expect(page.locator("#seller")).to_contain_text("tax id DE123")
        expect(page.locator("#buyer")).to_contain_text("Globex Ltd")
        expect(page.locator('[data-fact="corrects"]')).to_have_text("ACME-000001, ACME-000004")
        expect(page.locator('[data-fact="due"]')).to_have_text("2026-05-02")
        expect(page.locator('[data-fact="service period"]')).to_have_text("2026-03-01 to 2026-03-31")
        expect(page.locator("table.lines tbody tr")).to_have_count(3)
        expect(page.locator("#taxes tbody tr")).to_have_count(2)
        expect(page.locator('#taxes tr[data-rate="20 %"]')).to_contain_text(money(-1_974, "EUR"))
        expect(page.locator('[data-total="total"]')).to_have_text(money(CREDIT["total"], "EUR"))
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"{name}: the page scrolls sideways (the tables scroll inside their box)"
        page.screenshot(path=artifacts / f"credit-{name}.png", full_page=True)
        if name == "desktop":
            page.emulate_media(media="print")
            assert page.locator("#seller").is_visible() and page.locator("#taxes").is_visible()
            page.screenshot(path=artifacts / "credit-print.png", full_page=True)
        page.close()

    corrected = tmp_path / "invoice.html"
    corrected.write_text(invoice.html(CORRECTED, standalone=True), encoding="utf-8")
    page = browser.new_page(viewport=DESKTOP)
    page.goto(corrected.as_uri())
    expect(page.locator("h1")).to_have_text("Invoice ACME-000001")
    expect(page.locator('[data-fact="corrected by"]')).to_have_text("ACME-000004, ACME-000007")
    expect(page.locator("#buyer strong")).to_have_text("acct-0001")
    expect(page.locator("#buyer")).not_to_contain_text("Globex")
    page.screenshot(path=artifacts / "invoice-corrected.png", full_page=True)
