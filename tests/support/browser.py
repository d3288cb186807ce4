"""The console in a real browser: ``billing serve`` as a process, and Debian's headless ``chromium`` driven by
Playwright through its own executable (Playwright's browser download is never used)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx
from playwright.sync_api import Browser, sync_playwright

from shared.localstack import free_ports
from support.tools import require
from support.waiting import wait_until

CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update", "--no-first-run"]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


@contextmanager
def chromium() -> Iterator[Browser]:
    """Headless Debian chromium (skips the test, or fails it under CI, when it is not installed)."""
    executable = require("chromium", "the console's browser tests; `bash deploy/install-chromium.sh` installs it")
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def console_server(env: Mapping[str, str], log: Path) -> Iterator[str]:
    """``billing serve`` on a free loopback port with ``env``; yields its base URL once it answers."""
    port = free_ports(1)[0]
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "billing", "serve", "--port", str(port)], env=dict(env), stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _answers(url) or process.poll() is not None, 60, interval=0.2)
        assert process.poll() is None, log.read_text(errors="replace")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/batches", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
