"""Settings resolution and role start-up shared by the CLI commands."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from typing import Any

from pydantic import SecretStr

from shared.backoff import patiently
from shared.processes import pid_alive
from shared.service import Service, serve
from shared.settings import Settings
from shared.storage import Storage
from shared.triggers import trigger_bus

from .stack import AzuriteStack

_SECRET = re.compile(r"(AccountKey|SharedAccessKey|sig|Password)=[^;&\s]+", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(://[^/:@\s]+:)[^/@\s]+@")


def redact(text: str) -> str:
    """``text`` with account keys, SAS signatures and passwords (``Password=`` and in URLs) replaced by ``***``."""
    return _URL_PASSWORD.sub(r"\1***@", _SECRET.sub(lambda m: f"{m.group(1)}=***", text))


class RedactingFormatter(logging.Formatter):
    """Scrubs secrets from every formatted log record, tracebacks included."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def configure_logging(verbose: bool = False) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter("%(asctime)s %(processName)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], force=True)
    for noisy in ("azure", "azure.core.pipeline.policies.http_logging_policy", "alembic", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def resolve(settings: Settings | None = None, **overrides: Any) -> Settings:
    """Settings with a storage account: the configured one, or the local stack (started if needed)."""
    settings = settings or Settings()
    if overrides:
        settings = settings.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    if settings.storage_connection_string is None and not settings.storage_account_url:
        connection = AzuriteStack(home=settings.home).start()
        settings = settings.model_copy(update={"storage_connection_string": SecretStr(connection)})
    return settings


def role_states(settings: Settings) -> list[dict[str, Any]]:
    """The live state of every role process running under ``settings.home`` (listeners, requests
    made by kind, peak memory), as each keeps it in ``home/state/<role>-<pid>.json``."""
    states = []
    for path in sorted((settings.home / "state").glob("*-*.json")):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced this instant
        if pid_alive(int(state["pid"])):
            states.append(state)
    return states


async def run_role(role: str, settings: Settings, *, burst: bool) -> None:
    """Run one role until a signal (or, with ``burst``, until drained), keeping its state
    (listeners, requests made, peak memory) in ``home/state/<role>-<pid>.json``."""
    async with Storage(settings) as storage:
        await patiently("storage", storage.ensure_all)  # a role started during an outage waits for it
        # Burst runs drain and exit: nothing to wake.
        triggers = None if burst else trigger_bus(settings, storage)
        options: dict[str, Any] = {"storage": storage, "settings": settings, "triggers": triggers, "burst": burst}

        async def build() -> Service:
            if role == "initiator":
                from initiator.service import Initiator

                return Initiator(**options)
            if role == "processor":
                from processor.service import Processor

                return Processor(**options)
            if role == "syphon":
                from shared.syphon import SyphonService

                return SyphonService(**options)
            from controller.service import Controller
            from controller.store import Store

            store = await patiently("SQL store", lambda: asyncio.to_thread(Store, settings.sql_url_value))
            return Controller(store=store, **options)

        service = await serve(build, state_file=settings.home / "state" / f"{role}-{os.getpid()}.json")
    logging.getLogger(role).info("stopped; storage requests: %s", service.state()["requests"])
