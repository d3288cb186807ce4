"""``billing`` loads what a command uses when it runs: its help and a refused argument load no storage SDK,
Arrow, SQL or pandas; ``billing submit`` loads no SQL, pandas, web server or role machinery until it waits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.modules import loaded_of

ROOT = Path(__file__).resolve().parents[2]

#: Runs ``python -m billing ARGS...`` as ``-m`` does, then prints the top-level packages (and the ``shared``
#: and ``billing`` modules) loaded by then.
PROBE = """
import json, runpy, sys
sys.argv = ["billing", *sys.argv[1:]]
try:
    runpy.run_module("billing", run_name="__main__", alter_sys=True)
except SystemExit as stop:
    code = stop.code
else:
    code = 0
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""

#: Packages no command line needs for its help or to refuse an argument.
HEAVY = ("azure", "aiohttp", "pyarrow", "numpy", "pandas", "sqlalchemy", "pydantic", "fastapi", "opentelemetry.sdk")


def _loaded(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """The exit status of ``billing ARGS...`` and the modules it had loaded when it ended."""
    ran = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        check=False,
    )
    found = json.loads(ran.stdout.splitlines()[-1])
    return found["code"], found["modules"]


@pytest.mark.parametrize(
    "args",
    [("--help",), ("submit", "--help"), ("report", "--help"), ("status", "--help"), ("poison", "list", "--help")],
    ids=" ".join,
)
def test_help_loads_no_sdk_arrow_or_sql(args: tuple[str, ...]) -> None:
    code, modules = _loaded(*args)
    assert code == 0
    assert loaded_of(modules, HEAVY) == []


def test_a_refused_argument_loads_no_sdk_arrow_or_sql(tmp_path: Path) -> None:
    code, modules = _loaded("submit", str(tmp_path / "missing.csv"))
    assert code == 2
    assert loaded_of(modules, HEAVY) == []


def test_submit_loads_only_what_submitting_uses(tmp_path: Path) -> None:
    batch = tmp_path / "batch.csv"
    batch.write_text("transaction_id,account_id,timestamp,product,quantity,region\n")
    nowhere = "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:9/a;"
    code, modules = _loaded(
        "submit", str(batch), "--batch-id", "not/an/id", env={"BILLING_STORAGE_CONNECTION_STRING": nowhere}
    )
    assert code == 2, "refused for its batch id, by the submitting code"
    assert "billing.client" in modules
    unused = ("sqlalchemy", "pandas", "fastapi", "store", "shared.messaging.service", "billing.poison")
    assert loaded_of(modules, unused) == []
