"""The roles start without the command line: ``python -m <role>`` runs the role through :mod:`shared.roles`,
and ``billing`` depends on the roles, never the reverse; the command line and the console read the store
library, never the controller role's service module; the rating workers' fork server loads no storage client."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from processor.pool import PRELOAD
from shared.roles import BUILDERS, ROLES
from support.modules import loaded_of

ROOT = Path(__file__).resolve().parents[2]
#: The packages a role process may load: never ``billing``.
BELOW_BILLING = ("shared", "store", "initiator", "processor", "controller")

#: Runs ``python -m <role> --help`` as ``-m`` does, then builds the role's builder (importing all the role
#: runs on), and prints the ``billing`` modules loaded by then.
PROBE = """
import json, runpy, sys
import shared.roles
role = sys.argv[1]
sys.argv = [role, "--help"]
try:
    runpy.run_module(role, run_name="__main__", alter_sys=True)
except SystemExit as stop:
    assert stop.code in (0, None), stop.code
shared.roles.builder(role)
print(json.dumps(sorted(name for name in sys.modules if name == "billing" or name.startswith("billing."))))
"""


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)


@pytest.mark.parametrize("role", ROLES)
def test_python_m_role_help_lists_the_role_options(role: str) -> None:
    shown = _python("-m", role, "--help")
    assert shown.returncode == 0, shown.stderr
    assert f"python -m {role}" in shown.stdout
    assert all(option in shown.stdout for option in ("--burst", "--partitions", "--verbose"))


@pytest.mark.parametrize("role", ROLES)
def test_starting_a_role_imports_no_billing_module(role: str) -> None:
    probed = _python("-c", PROBE, role)
    assert probed.returncode == 0, probed.stderr
    assert "--burst" in probed.stdout, "the role's own --help ran"
    assert json.loads(probed.stdout.splitlines()[-1]) == []


def test_every_role_has_a_builder_where_its_entry_says() -> None:
    assert set(ROLES) <= set(BUILDERS)
    for role in ROLES:
        assert BUILDERS[role].startswith(f"{role}.service:")
        assert f'main("{role}")' in (ROOT / role / "__main__.py").read_text()


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a import b`` counts as ``a`` and ``a.b``), at any depth."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _sources(*packages: str) -> list[Path]:
    return sorted(path for package in packages for path in (ROOT / package).rglob("*.py"))


def test_nothing_under_billing_imports_the_controller_service() -> None:
    offending = {
        str(path.relative_to(ROOT)): sorted(name for name in _imports(path) if name.startswith("controller.service"))
        for path in _sources("billing")
    }
    assert {path: names for path, names in offending.items() if names} == {}


def test_the_roles_the_store_and_shared_never_import_billing() -> None:
    offending = {
        str(path.relative_to(ROOT)): sorted(n for n in _imports(path) if n == "billing" or n.startswith("billing."))
        for path in _sources(*BELOW_BILLING)
    }
    assert {path: names for path, names in offending.items() if names} == {}


def test_the_rating_workers_preload_no_storage_client_or_settings() -> None:
    """What the fork server imports for every rating worker is what rating uses: messages are decoded there,
    never sent or fetched, so the storage SDK, its HTTP client and the settings stay out of it."""
    imports = "; ".join(f"import {module}" for module in PRELOAD)
    probe = f"import json, sys; {imports}; print(json.dumps(sorted(sys.modules)))"
    probed = _python("-c", probe)
    assert probed.returncode == 0, probed.stderr
    loaded = json.loads(probed.stdout.splitlines()[-1])
    heavy = ("azure.storage", "aiohttp", "pydantic", "shared.settings", "shared.messaging.storage")
    assert loaded_of(loaded, heavy) == []
    assert "shared.rules.rating" in loaded
