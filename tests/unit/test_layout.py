"""The product packages stay walkable: one job a module, no module over 500 lines, no function over 60."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The packages pyproject.toml installs, but the benchmarks (tools, not the product).
PACKAGES = sorted(
    name.removesuffix("*")
    for name in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"][
        "include"
    ]
    if name != "benchmarks*"
)
MODULES = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(ROOT)))
def test_modules_and_functions_stay_short(path: Path) -> None:
    source = path.read_text()
    lines = len(source.splitlines())
    assert lines <= 500, f"{lines} lines"
    long = {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 60
    }
    assert long == {}


def test_the_store_package_holds_its_migrations() -> None:
    store = ROOT / "store"
    assert (store / "migrations" / "env.py").is_file()
    assert sorted(path.name[:4] for path in (store / "migrations" / "versions").glob("0*.py"))[0] == "0001"
