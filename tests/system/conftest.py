"""Fixtures of the system tests that drive the console: the browser, and a folder for what a test saves."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from support.browser import chromium


@pytest.fixture
def browser() -> Iterator[Browser]:
    with chromium() as opened:
        yield opened


@pytest.fixture
def artifacts(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """Where a test saves screenshots and files: ``$TEST_ARTIFACTS/<module without test_>``, else ``tmp_path``."""
    folder = Path(os.environ.get("TEST_ARTIFACTS", tmp_path)) / Path(request.path).stem.removeprefix("test_")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
