"""Fixtures of the integration tests: the store on a fresh database, migrated (``migrated_url``: SQLite and
PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from store import Store


@pytest.fixture
def store(migrated_url: str) -> Iterator[Store]:
    with Store(migrated_url) as opened:
        yield opened
