"""A configuration error met by a real role process mid-work: the role stops at once with a non-zero
exit code and one log line naming the problem, and the message it was handling is handed back to its
queue (neither poisoned nor lost), ready for a role started with the settings fixed."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from shared.messages import WorkHeader
from shared.messaging.envelope import ClaimCheck
from shared.messaging.storage import Storage
from shared.settings import Settings
from shared.wire import work_envelope

pytestmark = pytest.mark.usefixtures("settings_env")

PROBLEM = "the reference container refused the credentials (BILLING_STORAGE_*): refused by the test"

# The processor as `python -m processor --burst` runs it, except that reading reference data meets
# the configuration error a refused credential stands for: its handler unpacks a work item, then
# cannot read the price book the item names.
REFUSING_PROCESSOR = f"""
from shared.errors import ConfigurationError
from shared.refstore import ReferenceStore

async def refused(self, kind, digest):
    raise ConfigurationError({PROBLEM!r})

ReferenceStore.get = refused

from shared.roles import main

main("processor", ["--burst"])
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)


async def _send_work(settings: Settings) -> None:
    """One work item on each of two input queues (their payload is never read)."""
    async with Storage(settings) as storage:
        await storage.ensure_all()
        claim_check = ClaimCheck(storage, container=settings.work_container, limit=settings.max_message_bytes)
        for index, queue in enumerate(settings.input_queues[:2]):
            header = WorkHeader(f"w-config-{index}", "b-config", "pb", "tx", 1)
            text = await claim_check.pack(work_envelope(header, b"payload"), queue=queue, blob_name="unused")
            await storage.queue(queue).send_message(text)


async def _queues(settings: Settings) -> dict[str, int]:
    """Messages visible now in each input, poison and results queue (peeked, not received)."""
    async with Storage(settings) as storage:
        names = [*settings.input_queues, *settings.poison_queues, settings.results_queue]
        return {name: len(await storage.queue(name).peek_messages(max_messages=32)) for name in names}


def test_a_configuration_error_in_a_handler_stops_the_role_and_hands_its_message_back(settings_env: Settings) -> None:
    asyncio.run(_send_work(settings_env))
    before = asyncio.run(_queues(settings_env))
    assert {q for q, n in before.items() if n} == set(settings_env.input_queues[:2])

    stopped = run("-c", REFUSING_PROCESSOR)

    assert stopped.returncode == 2, stopped.stderr
    said = [line for line in stopped.stderr.splitlines() if "configuration problem" in line]
    assert len(said) == 1, stopped.stderr  # one clear line, naming the problem
    assert PROBLEM in said[0] and "ERROR" in said[0]
    assert "Traceback" not in stopped.stderr
    # Handed back: visible again at once (the visibility timeout is a minute), none poisoned, none lost.
    assert asyncio.run(_queues(settings_env)) == before
