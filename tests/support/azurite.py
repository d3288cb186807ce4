"""Azurite for tests: the session's shared one (``azurite`` fixture) and any a test needs of its own
(to stop and restart it, to read its debug log, to give it an account of its own), all
:class:`billing.stack.AzuriteStack`, the product's own local stack."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from billing.stack import AzuriteStack


@contextmanager
def running_azurite(home: Path, *, persist: bool = True, debug_log: Path | None = None) -> Iterator[AzuriteStack]:
    """An Azurite of its own under ``home``, started for the block (``stack.connection_string()``)
    and stopped after it. ``persist`` keeps its data on disk across ``stack.restart()``."""
    stack = AzuriteStack(home=home, persist=persist, debug_log=debug_log)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()
