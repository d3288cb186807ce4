"""The image's dependency locks (deploy/lock.sh): every runtime dependency of pyproject.toml pinned, at a
version its specifier allows, with hashes; the roles' lock without the console's dependencies, the
console's lock the roles' pins plus those; the Dockerfile installs both with ``--require-hashes`` and its
build context holds them. The roles' image may leave the console's dependencies out because no module
the roles, the store or the CLI import needs them (checked by importing every one with them blocked).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from support.tools import ROOT

DEPLOY = ROOT / "deploy"
ROLES_LOCK, CONSOLE_LOCK = DEPLOY / "requirements.lock", DEPLOY / "console.lock"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)(?:\s*;[^\\]*)?\s*\\?$")


def pins(lock: Path) -> dict[str, tuple[Version, int]]:
    """name -> (pinned version, number of hashes) of each requirement in a lock."""
    found: dict[str, tuple[Version, int]] = {}
    current = None
    for line in lock.read_text().splitlines():
        if match := _PIN.match(line):
            current = canonicalize_name(match.group(1))
            found[current] = (Version(match.group(2)), 0)
        elif current and line.strip().startswith("--hash=sha256:"):
            version, hashes = found[current]
            found[current] = (version, hashes + 1)
        elif line.strip() and not line.strip().startswith("#"):
            current = None
    return found


def requirements(*groups: list[str]) -> list[Requirement]:
    return [Requirement(r) for group in groups for r in group]


CONSOLE_ONLY = {canonicalize_name(r.name) for r in requirements(EXTRAS["console"])}


def test_the_roles_lock_covers_the_runtime_dependencies_but_the_consoles() -> None:
    locked = pins(ROLES_LOCK)
    wanted = [
        r
        for r in requirements(PROJECT["dependencies"], EXTRAS["azure-monitor"])
        if canonicalize_name(r.name) not in CONSOLE_ONLY
    ]
    assert len(wanted) > 10
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{name} is not in {ROLES_LOCK.name}: run deploy/lock.sh"
        version = locked[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (name, version, requirement.specifier)
        for extra in requirement.extras:  # psycopg[binary]: the extra's package pinned too
            assert canonicalize_name(f"{name}-{extra}") in locked, (name, extra)
    assert all(hashes > 0 for _, hashes in locked.values()), "a pin without its hashes"
    assert not CONSOLE_ONLY & set(locked), "the roles' image takes none of the console's dependencies"


def test_the_console_lock_is_the_roles_pins_and_the_console_extra() -> None:
    roles, console = pins(ROLES_LOCK), pins(CONSOLE_LOCK)
    assert {name: version for name, (version, _) in roles.items()} == {name: console[name][0] for name in roles}, (
        "the two images pin the same versions"
    )
    for requirement in requirements(PROJECT["dependencies"], EXTRAS["azure-monitor"], EXTRAS["console"]):
        name = canonicalize_name(requirement.name)
        assert name in console, f"{name} is not in {CONSOLE_LOCK.name}: run deploy/lock.sh"
        assert requirement.specifier.contains(console[name][0], prereleases=True), (name, requirement.specifier)
    assert all(hashes > 0 for _, hashes in console.values())
    # Every one of pyproject's runtime dependencies is in the console extra or the roles' lock.
    core = {canonicalize_name(r.name) for r in requirements(PROJECT["dependencies"])}
    assert core <= set(roles) | CONSOLE_ONLY


def test_the_dockerfile_installs_the_locks_with_hashes_only() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    installs = re.findall(r"pip install [^\n]*-r (\S+)", dockerfile)
    assert sorted(installs) == ["console.lock", "requirements.lock"]
    for line in re.findall(r"pip install [^\n]*-r \S+", dockerfile):
        assert "--require-hashes" in line and "--no-deps" in line, line
    assert re.search(r"COPY deploy/requirements\.lock deploy/console\.lock", dockerfile)
    context = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    assert {"!deploy/requirements.lock", "!deploy/console.lock", "!store/"} <= set(context)
    # The base's security updates are applied in the build.
    assert re.search(r"apt-get update\s*\\\s*&& .*apt-get upgrade", dockerfile)


#: Imports every module of the roles, the store and the CLI with the console's dependencies made
#: unimportable; prints the modules that failed.
BLOCKED_IMPORT = """
import importlib, importlib.abc, pkgutil, sys
blocked = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{name} is left out of the roles' image")
sys.meta_path.insert(0, Block())
failed = []
for package in ("shared", "store", "initiator", "processor", "controller", "billing"):
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        if info.name.startswith("billing.console") or info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as error:
            failed.append(f"{info.name}: {error}")
from billing.cli import cli
for role in ("initiator", "processor", "controller"):
    try:
        cli([role, "--help"], standalone_mode=False)
    except ImportError as error:
        failed.append(f"billing {role}: {error}")
try:  # the blocker works: the console itself cannot be imported
    importlib.import_module("billing.console.app")
except ImportError:
    print("CONSOLE-BLOCKED")
print("".join(f"IMPORT-FAILED {line}\\n" for line in failed))
"""


def test_the_roles_import_nothing_of_the_consoles_dependencies() -> None:
    modules = {"fastapi", "uvicorn", "multipart", "python_multipart", "jinja2", "matplotlib", "starlette", "reportlab"}
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORT, ",".join(sorted(modules))],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "CONSOLE-BLOCKED" in done.stdout.splitlines()
    assert [line for line in done.stdout.splitlines() if line.startswith("IMPORT-FAILED")] == []


@pytest.mark.parametrize("lock", [ROLES_LOCK, CONSOLE_LOCK], ids=lambda p: p.name)
def test_the_locks_name_no_machine_specific_index(lock: Path) -> None:
    text = lock.read_text()
    assert "--index-url" not in text and "--extra-index-url" not in text and "--find-links" not in text
    assert "file://" not in text
