"""``make test`` under every Python: the unit and SQLite integration tiers run by each Python 3.11 or later on
this machine besides the one running the rest of the suite, warnings as errors.

``python tests/support/pythons.py [PYTEST ARGS...]`` finds the interpreters (``python3.N`` on ``PATH``, and
every version pyenv installed under ``$PYENV_ROOT`` or ``~/.pyenv``), one per minor version, makes each a
virtual environment of its own once (``.billing/pythons/3.N``, the project installed editable with its test
extras, as ``make setup`` does) and runs ``pytest tests/unit tests/integration -m "not postgres"`` there with
``-W error``, but for the warnings third-party code raises of its own accord (:data:`IGNORED`). A version whose
environment cannot be installed (a dependency without a wheel for it, say) fails the run with pip's own words;
none found beside this one is said, not passed over. The exit status is the first failure's, else 0.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OLDEST = (3, 11)
#: Warnings raised by third-party code of its own accord, whatever the project does: the rest are errors.
IGNORED = (
    # aiohttp's hint at the bodies the Azure SDK sends: a blob or block over 1 MiB is one bytes object there,
    # however the project gives it (the SDK reads a stream into bytes before it sends).
    "ignore:Sending a large body directly with raw bytes:ResourceWarning",
)


def interpreters() -> dict[tuple[int, int], Path]:
    """One interpreter per minor version, 3.11 or later: ``python3.N`` on ``PATH`` first, then pyenv's."""
    found: dict[tuple[int, int], Path] = {}
    candidates = [Path(p) for minor in range(OLDEST[1], 30) if (p := shutil.which(f"python3.{minor}"))]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted(pyenv.glob("3.*/bin/python3")) if pyenv.is_dir() else []
    for candidate in candidates:
        version = _version(candidate)
        if version is not None and version >= OLDEST:
            found.setdefault(version, candidate)
    return dict(sorted(found.items()))


def _version(interpreter: Path) -> tuple[int, int] | None:
    """The interpreter's (major, minor), None where it does not run."""
    try:
        printed = subprocess.run(
            [interpreter, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.fullmatch(r"(\d+) (\d+)\s*", printed)
    return (int(match[1]), int(match[2])) if match else None


def environment(version: tuple[int, int], interpreter: Path) -> Path:
    """The virtual environment of ``version`` (made and installed once): its Python."""
    home = ROOT / ".billing" / "pythons" / f"{version[0]}.{version[1]}"
    python = home / "bin" / "python"
    if not (home / "installed").exists():
        subprocess.run([interpreter, "-m", "venv", "--clear", home], check=True)
        install = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-e", ".[test]"]
        subprocess.run(install, cwd=ROOT, check=True)
        (home / "installed").touch()
    return python


def main(argv: list[str]) -> int:
    mine = sys.version_info[:2]
    others = {version: path for version, path in interpreters().items() if version != mine}
    if not others:
        print(f"pythons: no Python {OLDEST[0]}.{OLDEST[1]} or later found beside this {mine[0]}.{mine[1]}")
        return 0
    failed = 0
    for version, interpreter in others.items():
        name = f"{version[0]}.{version[1]}"
        print(f"pythons: Python {name} ({interpreter})", flush=True)
        try:
            python = environment(version, interpreter)
        except subprocess.CalledProcessError as exc:
            print(f"pythons: Python {name}: its environment could not be installed ({exc})", flush=True)
            failed = failed or exc.returncode
            continue
        warnings = ["-W", "error", *(option for ignored in IGNORED for option in ("-W", ignored))]
        tests = [python, "-m", "pytest", "tests/unit", "tests/integration", "-m", "not postgres", *warnings, *argv]
        status = subprocess.run(tests, cwd=ROOT).returncode
        failed = failed or status
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
