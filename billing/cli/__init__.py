"""``billing``: the command line over the pipeline (thin: parse, then delegate).

The root group lives here; each module beside it holds one group of commands: :mod:`.stack` (the local stack,
the roles, the server, the demo), :mod:`.batches`, :mod:`.reports`, :mod:`.poison`, :mod:`.cost`, :mod:`.ledger`
and :mod:`.parties`. The benchmarks' commands (:mod:`benchmarks.cli`) are added where that package is installed.

Defining the commands imports only click, rich and light modules: each command imports what it needs (the
storage SDKs, Arrow, SQLAlchemy, the roles, pandas, FastAPI) when it runs. ``billing --help`` and a refused
argument answer at once, and ``billing submit`` loads only what submitting uses
(``tests/unit/test_cli_imports.py`` holds this)."""

from __future__ import annotations

import gc
import sys

import click

from shared.errors import BillingError
from shared.logs import configure_logging, redact

from . import batches, cost, ledger, parties, poison, reports, stack
from .output import print_error

try:
    from benchmarks.cli import COMMANDS as BENCHMARKS
except ModuleNotFoundError as missing:  # installed without the benchmarks: tools, not the product
    if missing.name != "benchmarks":
        raise
    BENCHMARKS = ()


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def cli(verbose: bool) -> None:
    """A queue-based billing pipeline on Azure Storage (Azurite locally) and SQL."""
    configure_logging(verbose)


for _command in (
    *stack.COMMANDS,
    *batches.COMMANDS,
    *reports.COMMANDS,
    *poison.COMMANDS,
    *cost.COMMANDS,
    *ledger.COMMANDS,
    *parties.COMMANDS,
    *BENCHMARKS,
):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="billing", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except BillingError as exc:
        print_error(redact(str(exc)))  # one line, as written
        sys.exit(2)
    finally:
        # Done: spare the interpreter's last collection a walk over every object the imports made (part of
        # what the user waits for `billing submit --wait` to return).
        gc.freeze()
