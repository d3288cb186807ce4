"""The store library stays walkable: one job a module, no module over 500 lines, no function over 60."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

STORE = Path(__file__).resolve().parents[2] / "store"
MODULES = sorted(STORE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(STORE)))
def test_store_modules_and_functions_stay_short(path: Path) -> None:
    source = path.read_text()
    assert len(source.splitlines()) <= 500
    long = {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 60
    }
    assert long == {}


def test_the_store_package_holds_its_migrations() -> None:
    assert (STORE / "migrations" / "env.py").is_file()
    assert sorted(path.name[:4] for path in (STORE / "migrations" / "versions").glob("0*.py"))[0] == "0001"
