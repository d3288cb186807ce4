"""The console as a person uses it, in Debian's headless chromium (Playwright, the system browser): Azurite, the
roles as processes and ``billing serve`` as a process; batches submitted with ``billing submit``.

Screenshots of the main pages at 1280×800 and 390×844 are kept under ``$TEST_ARTIFACTS/console`` (the
test's temporary folder when unset).
"""

from __future__ import annotations

import asyncio
import csv
import io
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from billing.sample import generate, sample_price_book_bytes
from shared.messaging.envelope import content_hash
from shared.messaging.storage import Storage
from shared.refstore import PRICEBOOK, ReferenceStore
from shared.settings import Settings
from support.browser import DESKTOP, PHONE, console_server
from support.exact import billing, expected, read_raw
from support.references import sample_flags
from support.roles import Roles

TOKEN = "console-test-token"
HOSTILE_ACCOUNTS = ("<script>document.title='pwned'</script>", "\"'><img src=x onerror=\"document.title='pwned'\">")
SECONDS = 1000  # Playwright waits in milliseconds
expect.set_options(timeout=30 * SECONDS)  # a loaded 2-core machine: pages may take a while, never forever


def _server_env(settings: Settings) -> dict[str, str]:
    return {**os.environ, **settings.as_env(), "BILLING_CONSOLE_TOKEN": TOKEN}


def _hostile_batch(path: Path, rows: int, seed: int) -> None:
    """A sample batch plus two rows whose account ids are markup (rejected, their raw text kept)."""
    generate(rows, path, seed=seed, reject_rate=0.02)
    with path.open("a", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        for n, account in enumerate(HOSTILE_ACCOUNTS):
            writer.writerow([f"hostile-{n}", account, "2026-03-03T10:00:00Z", "x", "1", ""])


def _expected_invoices(path: Path) -> dict[tuple[str, str, str], int]:
    _, invoices, _ = expected(read_raw(path))
    return {(i["account_id"], i["billing_period"], i["currency"]): i["total"] for i in invoices}


def _page_invoices(page: Page) -> dict[tuple[str, str, str], int]:
    """The invoices the open invoices page shows, following its "Next" links through every page."""
    found = {}
    while True:
        for cells in page.locator("#invoices tbody tr").evaluate_all(
            "rows => rows.map(r => [r.dataset.account, r.dataset.period, r.dataset.currency,"
            " r.querySelector('td[data-minor]').dataset.minor])"
        ):
            found[(cells[0], cells[1], cells[2])] = int(cells[3])
        if not page.locator("#next").count():
            return found
        follow(page, "#next")


def follow(page: Page, link: str) -> None:
    """Click a link and wait until its page has loaded: a read right after the click could see the page before
    or a page half parsed."""
    href = page.locator(link).get_attribute("href") or ""
    page.click(link)
    page.wait_for_url(lambda url: url.endswith(href))  # and its load event


def _fits(page: Page) -> bool:
    """Whether the page needs no horizontal scrolling (wide tables scroll inside their own box)."""
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"))


def test_a_batch_watched_to_complete_its_invoices_downloads_and_escaping(
    settings_env: Settings, roles: Roles, browser: Browser, tmp_path: Path, artifacts: Path
) -> None:
    path = tmp_path / "batch.csv"
    _hostile_batch(path, 3_000, seed=5)
    with roles.running(settings_env), console_server(_server_env(settings_env), tmp_path / "serve.log") as url:
        page = browser.new_page(viewport=DESKTOP, accept_downloads=True)
        page.set_default_timeout(60 * SECONDS)
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(f"{url}/batches")
        page.evaluate("window.notReloaded = true")

        billing("submit", str(path), "--batch-id", "web-1", *sample_flags(tmp_path / "ref"))
        state = page.locator('tr[data-batch="web-1"] [data-field="state"]')
        expect(state).to_have_text("complete", timeout=180 * SECONDS)
        assert page.evaluate("window.notReloaded === true"), "the page followed the batch without a reload"
        assert page.locator('tr[data-batch="web-1"] progress').evaluate("bar => bar.value") == 1

        page.click('a[href="/batches/web-1"]')
        raw = " ".join(page.locator("td.raw").all_inner_texts())
        assert all(account.replace('"', '\\"') in raw for account in HOSTILE_ACCOUNTS), "shown as text"
        assert page.locator("img").count() == 0 and page.locator("script").count() == 0
        assert page.title() != "pwned" and dialogs == []

        follow(page, "#invoices-link")
        reference = _expected_invoices(path)
        assert _page_invoices(page) == reference
        with page.expect_download() as download:
            page.click('a[download][href*="invoices.csv"]')
        downloaded = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
        assert {(r["account_id"], r["billing_period"], r["currency"]): int(r["total"]) for r in downloaded} == reference

        account = next(iter(reference))[0]
        for size, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
            page.set_viewport_size(viewport)
            for name, where in (
                ("batches", "/batches"),
                ("batch", "/batches/web-1"),
                ("invoices", "/invoices?batch=web-1"),
                ("account", f"/accounts/{account}"),
                ("roles", "/roles"),
                ("poison", "/poison"),
            ):
                page.goto(f"{url}{where}")
                assert page.locator("h1").is_visible(), where
                if name == "roles":  # the live roles, with their request counts
                    expect(page.locator("table").first).to_contain_text("processor")
                assert _fits(page), f"{where} scrolls sideways at {viewport}"
                page.screenshot(path=artifacts / f"{name}-{size}.png", full_page=True)

    report = tmp_path / "invoices.html"
    billing("report", "invoices", "--batch", "web-1", "--format", "html", "--output", str(report))
    offline = browser.new_page(viewport=DESKTOP)
    requested: list[str] = []
    offline.on("request", lambda request: requested.append(request.url))
    offline.route("http*://**/*", lambda route: route.abort())  # offline
    offline.goto(report.as_uri())
    chart = offline.locator("svg").first
    assert (chart.bounding_box() or {}).get("width", 0) > 300, "the chart is drawn"
    assert requested == [report.as_uri()], "the report needs nothing but itself"
    assert offline.locator("tbody tr").count() == len(_expected_invoices(path))
    offline.screenshot(path=artifacts / "report-invoices.png", full_page=True)


def _set_price_book(settings: Settings, *, present: bool) -> None:
    """Delete (the cause) or store again (the fix) the sample price book. On a thread of its own: Playwright's
    synchronous API keeps an event loop running on this one."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _price_book(settings, present=present)).result()


async def _price_book(settings: Settings, *, present: bool) -> None:
    async with Storage(settings) as storage:
        if present:
            await ReferenceStore(storage, container=settings.reference_container).put(
                PRICEBOOK, sample_price_book_bytes()
            )
        else:
            name = f"{PRICEBOOK}/{content_hash(sample_price_book_bytes())}.csv"
            await storage.container(settings.reference_container).delete_blob(name)


def test_a_poisoned_work_item_replayed_from_the_console_with_the_token(
    settings_env: Settings, roles: Roles, browser: Browser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BILLING_PARTITIONS", "1")
    monkeypatch.setenv("BILLING_WORK_ITEM_SIZE", "5000")  # one work item
    settings = Settings()
    path = tmp_path / "batch.csv"
    generate(2_000, path, seed=9)
    billing("submit", str(path), "--batch-id", "web-poison", *sample_flags(tmp_path / "ref"))
    roles.burst("initiator")
    _set_price_book(settings, present=False)  # the cause
    roles.burst("processor")
    roles.burst("controller")

    with console_server(_server_env(settings), tmp_path / "serve.log") as url:
        page = browser.new_page(viewport=DESKTOP)
        page.set_default_timeout(60 * SECONDS)
        page.goto(f"{url}/batches/web-poison")
        expect(page.locator("dd.state-failed")).to_have_text("failed")
        page.goto(f"{url}/poison")
        entry = page.locator("form[action='/poison/replay']")
        expect(entry).to_have_count(1)
        entry.locator("input[name=token]").fill("not-the-token")
        entry.locator("button").click()
        expect(page.locator("body")).to_contain_text("wrong console token", timeout=60 * SECONDS)
        page.goto(f"{url}/poison")
        expect(page.locator("form[action='/poison/replay']")).to_have_count(1)  # still there

        _set_price_book(settings, present=True)  # the fix
        form = page.locator("form[action='/poison/replay']")
        form.locator("input[name=token]").fill(TOKEN)
        form.locator("button").click()
        expect(page.locator("#done")).to_have_text("replayed 1 message(s).", timeout=60 * SECONDS)
        expect(page.locator("#none")).to_be_visible()

        roles.burst("processor")
        roles.burst("controller")
        page.goto(f"{url}/invoices?batch=web-poison")
        assert _page_invoices(page) == _expected_invoices(path)
        page.goto(f"{url}/batches/web-poison")
        expect(page.locator("dd.state-complete")).to_have_text("complete")
