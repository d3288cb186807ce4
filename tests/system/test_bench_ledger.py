"""`billing bench-ledger`'s runs at a CI-sized scale: the ledger it loads before the roles start is the one they
check against. A batch that repeats some of the loaded ids gets exactly those rows rejected as duplicates through
the real roles (Azurite, SQLite, role processes), and not on an empty ledger."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pv
import pytest
from rich.console import Console

from benchmarks.ledger import run_ledger
from benchmarks.pipeline import _batch_file
from billing.sample import generate

pytestmark = pytest.mark.slow

ROWS = 3000
LEDGER_IDS = 4000
#: Rows of the batch given a loaded id (``ledger-N``, as :func:`benchmarks.ledger.load_ledger` names them).
REPEATED = range(0, ROWS, 100)


def _repeat_loaded_ids(source: Path) -> int:
    """Rewrite the batch the bench uses: no invalid rows, and the rows of :data:`REPEATED` carrying loaded ids."""
    generate(ROWS, source, seed=42, messy=True, reject_rate=0.0)
    table = pv.read_csv(source, convert_options=pv.ConvertOptions(strings_can_be_null=False, column_types={}))
    table = table.cast(pa.schema([(name, pa.string()) for name in table.column_names]))
    ids = table["transaction_id"].to_pylist()
    for number, row in enumerate(REPEATED):
        ids[row] = f"ledger-{number * 37}"
    table = table.set_column(table.column_names.index("transaction_id"), "transaction_id", pa.array(ids))
    pv.write_csv(table, source)
    return len(REPEATED)


def test_loaded_ledger_ids_are_duplicates_through_the_roles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BILLING_MAX_IDLE_INTERVAL", "3")  # the runs wait for idle roles: they get there sooner
    data, console = tmp_path / "data", Console(quiet=True)
    repeated = _repeat_loaded_ids(_batch_file(ROWS, data, console, messy=True))
    empty, loaded = (
        run_ledger("sqlite", rows=ROWS, ledger_ids=size, bits=1 << 16, data_dir=data, console=console)
        for size in (0, LEDGER_IDS)
    )
    assert empty.pipeline.rows == loaded.pipeline.rows == ROWS
    assert empty.pipeline.rejected == 0 and empty.pipeline.accepted == ROWS
    assert loaded.pipeline.rejected == repeated and loaded.pipeline.accepted == ROWS - repeated
    assert loaded.marked_rows >= empty.marked_rows + repeated  # the filter written before the roles started
    for run in (empty, loaded):
        assert {"initiator", "processor", "controller"} <= run.pipeline.peak_rss_mib.keys()
        assert run.load_rss_mib > 0 and run.filter_rss_mib > 0 and run.load_average
    assert loaded.store_bytes > empty.store_bytes > 0
