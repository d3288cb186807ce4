"""How a role process starts, for ``python -m initiator`` (``processor``, ``controller``) and
``billing <role>`` alike: the options, the settings, the role built and run (:mod:`shared.messaging.runtime`).

A role's builder is named by where it lives and imported only in the process that runs it: ``--help``
loads no role, and no process loads a role it does not run. The roles never import the command line."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from .errors import BillingError
from .logs import configure_logging, redact

if TYPE_CHECKING:
    from .messaging.runtime import RoleFactory

#: The roles, in the order work flows through them.
ROLES = ("initiator", "processor", "controller")
#: Where each role's builder (a :class:`~shared.messaging.runtime.RoleFactory`) is, as ``module:attribute``; the
#: syphon runs inside the controller and, on demand, alone.
BUILDERS = {
    "initiator": "initiator.service:Initiator",
    "processor": "processor.service:Processor",
    "controller": "controller.service:Controller.create",
    "syphon": "shared.messaging.syphon:SyphonService",
}


def builder(role: str) -> RoleFactory:
    """The builder of ``role`` (one of :data:`BUILDERS`), imported now."""
    module, _, attribute = BUILDERS[role].partition(":")
    found: Any = importlib.import_module(module)
    for name in attribute.split("."):
        found = getattr(found, name)
    return cast("RoleFactory", found)


def start(role: str, *, burst: bool = False, partitions: int | None = None) -> None:
    """Run ``role`` until SIGINT/SIGTERM (or, with ``burst``, until drained) on the settings of the environment,
    ``partitions`` overriding ``BILLING_PARTITIONS``; with no storage account configured, on the local stack
    (:func:`shared.localstack.resolve`, started if needed)."""
    from .localstack import resolve
    from .messaging.runtime import run_role

    settings = resolve(partitions=partitions)
    asyncio.run(run_role(role, builder(role), settings, burst=burst))


def parser(role: str) -> argparse.ArgumentParser:
    """The options of ``python -m <role>`` (those of ``billing <role>``, and ``--verbose``)."""
    options = argparse.ArgumentParser(
        prog=f"python -m {role}", description=f"Run the {role} until SIGINT/SIGTERM (or drained, with --burst)."
    )
    options.add_argument("-v", "--verbose", action="store_true", help="Debug logging.")
    options.add_argument("--burst", action="store_true", help="Drain what is queued, then exit.")
    options.add_argument("--partitions", type=int, help="Number of input queues (BILLING_PARTITIONS).")
    return options


def main(role: str, argv: Sequence[str] | None = None) -> None:
    """``python -m <role>``: parse ``argv``, run the role; exit status 2 on an error of ours (said in one line,
    redacted), 130 on an interrupt that came before the role could stop gracefully."""
    options = parser(role).parse_args(argv)
    configure_logging(options.verbose)
    try:
        start(role, burst=options.burst, partitions=options.partitions)
    except KeyboardInterrupt:
        sys.exit(130)
    except BillingError as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        sys.exit(2)
