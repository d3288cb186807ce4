"""A role stopped by SIGTERM releases what it holds (:meth:`Service.aclose`: a processor's rating pool, a
controller's SQL engine) even when its shutdown deadline passes while it is already winding down."""

from __future__ import annotations

import asyncio
import os
import signal

from shared.messaging.envelope import ClaimCheck
from shared.messaging.poison import PoisonQueue
from shared.messaging.service import Service, serve
from shared.messaging.storage import Storage
from shared.settings import Settings
from support.waiting import wait_until_async

#: How long a chore takes to end once cancelled: longer than the deadline below.
SLOW_TO_END = 0.5


class Holding(Service):
    """A role whose one chore is slow to end when cancelled, and that notes whether it released its resources."""

    def __init__(self, *, storage: Storage, settings: Settings) -> None:
        super().__init__(storage=storage, settings=settings)
        self.released = False
        claims = ClaimCheck(storage, container=settings.work_container, limit=settings.max_message_bytes)
        self.listen(settings.results_queue, _nothing, poison=PoisonQueue(storage, claims))
        self.repeat(None, self._hold)

    async def _hold(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(SLOW_TO_END)
            raise

    async def aclose(self) -> None:
        self.released = True


async def _nothing(messages: object) -> dict[str, str]:
    return {}


async def test_a_deadline_that_passes_while_the_role_winds_down_still_lets_it_release(
    storage: Storage, settings_env: Settings
) -> None:
    settings = settings_env.model_copy(update={"shutdown_deadline": 0.05})
    role = Holding(storage=storage, settings=settings)

    async def build() -> Service:
        return role

    async def stop_soon() -> None:
        async with asyncio.timeout(30):
            await wait_until_async(lambda: role.listeners[0].state().idle_polls)
        os.kill(os.getpid(), signal.SIGTERM)

    stopping = asyncio.create_task(stop_soon())
    await asyncio.wait_for(serve(build), timeout=30)
    await stopping
    assert role.released, "aclose runs although the deadline passed during the wind-down"
