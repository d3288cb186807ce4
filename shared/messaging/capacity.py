"""How much work a role may hold at once, shared by its listeners.

A processor's work item costs seconds of CPU: one that sits received but unstarted in a busy
processor is one an idle processor elsewhere could have rated. So the processor's listeners receive
no more than its rating workers can start now, plus a small prefetch (one item per worker by
default) that hides the next item's receive and read behind the current one's rating; the rest of
the queue stays visible to every other instance.
"""

from __future__ import annotations

import asyncio


class Capacity:
    """``slots`` work items held at once, across every listener given this object."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a capacity needs at least one slot, not {slots}")
        self.slots = slots
        self.taken = 0  # slots held now
        self._free = asyncio.Semaphore(slots)

    async def take(self, most: int) -> int:
        """Wait until a slot is free, then take as many as are free, at most ``most``."""
        await self._free.acquire()
        taken = 1
        while taken < most and not self._free.locked():
            await self._free.acquire()  # free: returns at once
            taken += 1
        self.taken += taken
        return taken

    def give(self, count: int = 1) -> None:
        """Give back ``count`` slots (work finished, or a receive that brought fewer messages)."""
        self.taken -= count
        for _ in range(count):
            self._free.release()
