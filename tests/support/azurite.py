"""Azurite for tests: the session's shared one (``azurite`` fixture) and any a test needs of its own
(to stop and restart it, to read its debug log, to give it an account of its own, to reach it over
HTTPS with OAuth tokens), all :class:`shared.localstack.AzuriteStack`, the product's own local stack."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shared.localstack import AzuriteStack
from support.identity import Certificates


@contextmanager
def running_azurite(
    home: Path, *, persist: bool = True, debug_log: Path | None = None, https: Certificates | None = None
) -> Iterator[AzuriteStack]:
    """An Azurite of its own under ``home``, started for the block (``stack.connection_string()``)
    and stopped after it. ``persist`` keeps its data on disk across ``stack.restart()``. With
    ``https`` it serves HTTPS with that server certificate and accepts OAuth bearer tokens too."""
    tls = None if https is None else (https.certificate, https.key)
    stack = AzuriteStack(home=home, persist=persist, debug_log=debug_log, https=tls)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def service_ports(stack: AzuriteStack) -> dict[str, int]:
    """The running stack's port by service (``blob``, ``queue``)."""
    found = re.findall(r"(Blob|Queue)Endpoint=https?://[^:/]+:(\d+)/", stack.connection_string() or "")
    return {service.lower(): int(port) for service, port in found}
