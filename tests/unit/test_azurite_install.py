"""``billing up`` without Azurite installed says how to install it (nothing is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.localstack import AzuriteStack, StackError


def test_missing_azurite_install_says_to_run_npm_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shared.localstack.AZURITE_BIN", tmp_path / "no-azurite")
    with pytest.raises(StackError, match="npm ci"):
        AzuriteStack(home=tmp_path).start()
