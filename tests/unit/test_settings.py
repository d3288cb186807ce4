"""Settings read from the environment."""

from __future__ import annotations

import pytest

from shared.settings import Settings


def test_an_empty_console_token_leaves_the_console_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BILLING_CONSOLE_TOKEN", "")
    assert Settings().console_token is None
    monkeypatch.setenv("BILLING_CONSOLE_TOKEN", "s3cret")
    token = Settings().console_token
    assert token is not None and token.get_secret_value() == "s3cret"
