"""Fixtures of the integration tests: the store on a fresh database (``sql_url``: SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from store import Store


@pytest.fixture
def store(sql_url: str) -> Iterator[Store]:
    with Store(sql_url) as opened:
        yield opened
