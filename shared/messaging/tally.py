"""Requests attributed to the work they serve.

A listener opens a :class:`Tally` for each batch of messages it receives; every storage and Service
Bus request made in that context (tasks it starts included) is counted in it. Each message sent
from the context is stamped with what the tally has gathered since the previous stamp, its own send
included, and the receiver adds the stamps it reads to its own tally. Cost thus travels with the
data to the controller, which records it per billing batch. Requests made outside any tally (empty
polls, depth reads, lease renewals, set-up) serve no batch and are not attributed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

#: The ``counts`` key of requests stamped on received messages (made upstream).
INHERITED = "inherited"


class Tally:
    """Requests made in one context, by kind, and how many of them were stamped on messages."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._promised: Counter[str] = Counter()  # charged ahead, not made yet
        self._due = 0  # made or charged ahead
        self._stamped = 0

    def add(self, kind: str, requests: int = 1) -> None:
        """Count ``requests`` made of ``kind`` (those charged ahead are not due twice)."""
        self.counts[kind] += requests
        covered = min(requests, self._promised[kind])
        self._promised[kind] -= covered
        self._due += requests - covered

    def charge_ahead(self, kind: str, requests: int) -> None:
        """Let the next stamp include ``requests`` of ``kind`` still to be made (a message's own
        send, the deletes after the handler)."""
        self._promised[kind] += requests
        self._due += requests

    def stamp(self, *, ahead: str | None = None) -> int:
        """Requests due since the last stamp, with one of kind ``ahead`` about to be made (the
        send this stamp travels with); they count as stamped from now."""
        if ahead is not None:
            self.charge_ahead(ahead, 1)
        stamp, self._stamped = self._due - self._stamped, self._due
        return stamp


_CURRENT: ContextVar[Tally | None] = ContextVar("tally", default=None)


@contextmanager
def tallying(tally: Tally) -> Iterator[Tally]:
    """Count every request made in this context, until the block ends, in ``tally``."""
    token = _CURRENT.set(tally)
    try:
        yield tally
    finally:
        _CURRENT.reset(token)


def current() -> Tally | None:
    """The tally of this context, if one is open."""
    return _CURRENT.get()


def take() -> int:
    """What this context's tally gathered since its last stamp, now counted as stamped (0 outside one)."""
    tally = _CURRENT.get()
    return 0 if tally is None else tally.stamp()


def record(kind: str, requests: int = 1) -> bool:
    """Count ``requests`` of ``kind`` in this context's tally; False outside one."""
    tally = _CURRENT.get()
    if tally is not None:
        tally.add(kind, requests)
    return tally is not None


def spread(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (equally if they are all 0), in whole
    requests that add up to ``total`` (largest remainders get the odd ones)."""
    if not weights:
        return []
    if not any(weights):
        weights = [1] * len(weights)
    whole = sum(weights)
    shares = [total * w // whole for w in weights]
    by_remainder = sorted(range(len(weights)), key=lambda i: -(total * weights[i] % whole))
    for i in by_remainder[: total - sum(shares)]:
        shares[i] += 1
    return shares
