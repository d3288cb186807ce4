"""The roles start without the command line: ``python -m <role>`` runs the role through :mod:`shared.roles`,
and ``billing`` depends on the roles, never the reverse; ``benchmarks`` depends on the product, never the reverse
(but that ``billing`` adds their commands where they are installed); the command line and the console read the
store library, never the controller role's service module; the rating workers' fork server and the store load no
storage client."""

from __future__ import annotations

import ast
import base64
import json
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from billing.sample import generate, sample_price_book_bytes, sample_tax_table_bytes
from processor.pool import PRELOAD
from shared import inbox
from shared.messages import REPEATS_SCHEMA, IdsPart, WorkHeader
from shared.roles import BUILDERS, ROLES
from shared.rules.schemas import IDS_SCHEMA
from shared.tables import encode_table
from shared.wire import ids_envelope, manifest_envelope, results_envelope
from support.modules import loaded_of
from support.records import manifest, partial, result
from support.references import sample_files

ROOT = Path(__file__).resolve().parents[2]
#: The packages a role process may load: never ``billing``.
BELOW_BILLING = ("shared", "store", "initiator", "processor", "controller")
#: The product: what ``benchmarks`` may import, and what never imports ``benchmarks`` (but to add its commands).
PRODUCT = ("billing", *BELOW_BILLING)

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


def _printed(code: str) -> Any:
    """What ``code``, run in a fresh interpreter, printed last (JSON)."""
    probed = _python("-c", code)
    assert probed.returncode == 0, probed.stderr
    return json.loads(probed.stdout.splitlines()[-1])


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


def _names_of_benchmarks(path: Path) -> list[str]:
    """The strings in ``path``'s code (f-strings' literal parts too) that name a module of ``benchmarks``: what a
    loader by name (``importlib.import_module``, a lazy group's table) would be handed."""
    tree = ast.parse(path.read_text(), str(path))
    return sorted(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("benchmarks.")
    )


def test_the_product_imports_the_benchmarks_only_where_billing_adds_their_commands() -> None:
    """``benchmarks`` imports the product, never the reverse: the one import of it is the command line's, of
    :mod:`benchmarks.cli` (which loads no benchmark), to add its commands to ``billing``."""
    imported = {
        str(path.relative_to(ROOT)): sorted(
            n for n in _imports(path) if n == "benchmarks" or n.startswith("benchmarks.")
        )
        for path in _sources(*PRODUCT)
    }
    assert {path: names for path, names in imported.items() if names} == {
        "billing/cli/__init__.py": ["benchmarks.cli", "benchmarks.cli.COMMANDS"]
    }
    named = {str(path.relative_to(ROOT)): _names_of_benchmarks(path) for path in _sources(*PRODUCT)}
    assert {path: names for path, names in named.items() if names} == {}, "a benchmark loaded by name"


#: Runs ``billing --help`` with the ``benchmarks`` package absent (as an installation without it), then prints its
#: output and the ``benchmarks`` commands' names.
WITHOUT_BENCHMARKS = """
import json, sys
from click.testing import CliRunner


class Absent:
    def find_spec(self, name, path=None, target=None):
        if name == "benchmarks":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, Absent())
from billing.cli import cli
print(json.dumps(CliRunner().invoke(cli, ["--help"]).output))
"""


def test_billing_lists_the_benchmarks_commands_only_where_the_benchmarks_are_installed() -> None:
    from benchmarks.cli import COMMANDS
    from billing.cli import cli

    benchmarks = {command.name for command in COMMANDS}
    assert benchmarks >= {"bench", "soak"}
    assert benchmarks <= set(cli.commands)
    shown = _printed(WITHOUT_BENCHMARKS)
    assert "submit" in shown
    listed = {line.split()[0] for line in shown.split("Commands:")[1].splitlines() if line.strip()}
    assert listed & benchmarks == set()
    assert listed == set(cli.commands) - benchmarks


def test_callers_reach_the_store_through_its_face() -> None:
    """Outside ``store/``, the product imports the package's names (:class:`store.Store` and its types), never a
    module of it, and asks the store, never its engine."""
    modules = {
        path.stem for path in (ROOT / "store").iterdir() if path.suffix == ".py" or (path / "__init__.py").exists()
    }
    offending = {}
    for path in _sources("billing", "controller", "initiator", "processor", "shared"):
        names = {n for n in _imports(path) if n.startswith("store.") and n.split(".")[1] in modules}
        tree = ast.parse(path.read_text(), str(path))
        names |= {
            f".{node.attr}" for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "engine"
        }
        if names:
            offending[str(path.relative_to(ROOT))] = sorted(names)
    assert offending == {}


def test_the_rating_workers_preload_no_storage_client_or_settings() -> None:
    """What the fork server imports for every rating worker is what rating uses: messages are decoded there,
    never sent or fetched, so the storage SDK, its HTTP client and the settings stay out of it."""
    imports = "; ".join(f"import {module}" for module in PRELOAD)
    probe = f"import json, sys; {imports}; print(json.dumps(sorted(sys.modules)))"
    loaded = _printed(probe)
    heavy = ("azure.storage", "aiohttp", "pydantic", "shared.settings", "shared.messaging.storage")
    assert loaded_of(loaded, heavy) == []
    assert "shared.rules.rating" in loaded


def test_the_store_records_messages_without_the_storage_sdk_and_is_read_without_arrow() -> None:
    """The store records the message types (:mod:`shared.messages`) without the storage SDK that their wire format
    (:mod:`shared.wire`) loads; a command that only reads the store loads neither, nor Arrow."""
    probe = "import json, sys; import {}; print(json.dumps(sorted(sys.modules)))"
    read, recorded = _printed(probe.format("store")), _printed(probe.format("store.recording"))
    assert loaded_of(read, ("azure", "aiohttp", "pyarrow", "numpy", "shared.messages")) == []
    assert "shared.messages" in recorded
    assert loaded_of(recorded, ("azure", "aiohttp", "shared.wire", "shared.messaging")) == []


def test_the_controllers_first_apply_imports_nothing_once_it_warmed_up(tmp_path: Path) -> None:
    """Once the controller has warmed up (``shared.wire.warm_up``, ``Store.warm_up``), recording a batch whole
    (its manifest, an ids part, its results) imports no module: its first results do not wait on the SQL thread for
    an import.
    The messages are decoded from their bytes, as the controller gets them; the test builds them in its own process
    (building a table from Python objects imports pandas)."""
    ids = pa.table({"row": [1, 2], "transaction_id": ["t-1", "t-2"]}, schema=IDS_SCHEMA)
    envelopes = [
        manifest_envelope(replace(manifest("b1", rows=2), id_parts=1)),
        ids_envelope(IdsPart("b1", 0, ids)),
        results_envelope([result("b1:0", partial(transactions=2))]),
    ]
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps([[e.kind, e.headers, base64.b64encode(e.payload).decode()] for e in envelopes]))
    probe = f"""
import base64, json, sys
from shared.messaging.envelope import Envelope
from shared.wire import parse_ids, parse_manifest, parse_results, warm_up
from store import Store
warm_up()
store = Store("sqlite:///{tmp_path / "store.db"}")
store.warm_up()
sent = json.loads(open({str(messages)!r}).read())
manifest, part, results = (Envelope(kind, headers, base64.b64decode(payload)) for kind, headers, payload in sent)
before = set(sys.modules)
outcome = store.apply([parse_manifest(manifest)], parse_results(results), ids=[parse_ids(part)])
print(json.dumps([outcome.completed_batches, sorted(set(sys.modules) - before)]))
"""
    assert _printed(probe) == [["b1"], []]


def test_a_rating_workers_first_work_item_imports_nothing_the_fork_server_did_not(tmp_path: Path) -> None:
    """After what the fork server preloads, rating a work item (its part of a messy CSV file read, validated, rated
    against a price book read for it, its results encoded) imports nothing: a worker's first item does not wait
    for an import."""
    batch = tmp_path / "batch.csv"
    generate(200, batch, messy=True, reject_rate=0.1)
    data = batch.read_bytes()
    part = inbox.Part("b1/batch.csv", "csv", 0, len(data), len(data), "", 0, 0)
    header = WorkHeader("b1:0", "b1", pricebook_hash="pb", taxes_hash="tx", rows=200, part=part)
    references = {"pb": sample_price_book_bytes(), "tx": sample_tax_table_bytes()}
    job = tmp_path / "job.pickle"
    job.write_bytes(
        pickle.dumps(([(header, encode_table(REPEATS_SCHEMA.empty_table()), inbox.compress(data))], references, [{}]))
    )
    imports = "; ".join(f"import {module}" for module in PRELOAD)
    probe = f"""
import json, pickle, sys; {imports}
from processor.jobs import rate_work_items
items, references, traces = pickle.loads(open({str(job)!r}, "rb").read())
before = set(sys.modules)
envelope, poisoned = rate_work_items(items, references, traces)
print(json.dumps([envelope.kind, poisoned, sorted(set(sys.modules) - before)]))
"""
    assert _printed(probe) == ["results", {}, []]


def test_an_initiators_first_batch_imports_nothing_once_it_warmed_up(tmp_path: Path) -> None:
    """Once the initiator has warmed up (``shared.wire.warm_up``), its first batch (the references read, the
    messy CSV file cut with its repeats and ids, an ids part encoded) imports nothing while the submitter waits."""
    batch = tmp_path / "batch.csv"
    generate(500, batch, messy=True)
    sample_files(tmp_path)
    probe = f"""
import io, json, sys
from initiator.debatch import Debatch
from shared import inbox
from shared.messages import IdsPart
from shared.wire import ids_envelope, warm_up
from shared.rules.bloom import IdFilter
from shared.rules.reference import load_price_book, load_tax_table
warm_up()
with open({str(batch)!r}, "rb") as file:
    data, frames = inbox.in_memory(file, 4096)
before = set(sys.modules)
load_price_book(open({str(tmp_path / "pricebook.csv")!r}, "rb").read())
load_tax_table(open({str(tmp_path / "taxes.csv")!r}, "rb").read())
debatch = Debatch(work_item_size=100, id_filter=IdFilter(1 << 10))
cuts = list(debatch.parts("b1/batch.csv", "csv", frames, io.BytesIO(data)))
ids_envelope(IdsPart("b1", 0, debatch.ids()))
print(json.dumps([sum(cut.rows for cut in cuts), sorted(set(sys.modules) - before)]))
"""
    assert _printed(probe) == [500, []]
