"""A fault-injecting HTTP proxy between the Azure SDK and Azurite, for the tests and ``billing soak``.

It listens on one loopback port per service (blob, queue) and forwards each request to Azurite
byte for byte (the SDK's signature stays valid), except that a share of the requests (``rate``) —
or every request during an outage window (to some paths or queries only, if it names one) — gets a fault
instead:

- ``503``: 503 Server Busy (what Azure Storage answers when it throttles);
- ``500``: 500 Internal Error;
- ``reset``: the connection is dropped without an answer;
- ``timeout``: no answer until the client gives up (the proxy hangs for ``hang`` seconds, then drops);
- ``lost_reply``: the request *is* done by Azurite, but the client gets a 500, so its retry repeats
  it (what a request whose answer was lost on the way looks like);
- ``slow`` (not among :data:`KINDS`; name it in ``kinds``): the request is held ``hang`` seconds, then
  forwarded and answered as usual;
- ``garbled`` (not among :data:`KINDS` either): the request is forwarded with one byte of its body changed (its
  signature covers the headers, not the body, so it stays valid): what the service sees of data damaged on the way.

Faults apply per service; the proxy counts, per service, what it forwarded (by method) and what it
injected (by kind). It runs its own event loop in a thread. Point a role at it through
:attr:`FaultProxy.connection_string`.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType

import aiohttp
from aiohttp import web
from yarl import URL

KINDS = ("503", "500", "reset", "timeout", "lost_reply")
SLOW = "slow"
GARBLED = "garbled"
SERVICES = ("blob", "queue")
# Set per hop by each side; everything else (signed headers included) is passed on as it came.
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "host"}


class FaultProxy:
    """Use as ``with FaultProxy(azurite_connection_string, rate=0.1) as proxy``."""

    def __init__(
        self,
        connection_string: str,
        *,
        rate: float = 0.0,
        kinds: Iterable[str] = KINDS,
        services: Iterable[str] = SERVICES,
        hang: float = 5.0,
        seed: int = 0,
    ) -> None:
        self.upstream = connection_string
        self.kinds = tuple(kinds)
        self.hang = hang
        self._rates = {service: rate if service in set(services) else 0.0 for service in SERVICES}
        self._outages: dict[str, tuple[float, str, str]] = {}  # service -> (until, kind, path)
        self._armed: list[_Outage] = []
        self._lock = threading.Lock()
        #: Set when an outage starts.
        self.outage_began = threading.Event()
        self._rng = random.Random(seed)
        self.forwarded: dict[str, Counter[str]] = {service: Counter() for service in SERVICES}
        self.injected: dict[str, Counter[str]] = {service: Counter() for service in SERVICES}
        self._targets = {service: _endpoint(connection_string, service) for service in SERVICES}
        self._ports: dict[str, int] = {}
        self._runners: list[web.AppRunner] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    @property
    def connection_string(self) -> str:
        """The upstream connection string with its blob and queue endpoints on the proxy."""
        text = self.upstream
        for service, target in self._targets.items():
            text = text.replace(target, f"http://127.0.0.1:{self._ports[service]}")
        return text

    def set_rate(self, rate: float, services: Iterable[str] = SERVICES) -> None:
        """Inject faults into ``rate`` of the requests to ``services`` from now on."""
        for service in services:
            self._rates[service] = rate

    def outage(
        self,
        seconds: float,
        *,
        kind: str = "reset",
        services: Iterable[str] = SERVICES,
        after: int = 0,
        method: str = "",
        path: str = "",
    ) -> None:
        """Fail every request to ``services`` with ``kind`` for ``seconds`` (only those whose path and query hold
        ``path``, if given): from now, or once ``after`` more requests (with ``method``, if given) have been
        forwarded to them."""
        self._armed.append(_Outage(seconds, kind, tuple(services), after, method, path))
        self._fire()

    def restore(self) -> None:
        """End every outage now (and drop those armed but not started)."""
        with self._lock:
            self._armed.clear()
            self._outages.clear()

    def _fire(self, service: str = "", method: str = "") -> None:
        """Count one forwarded request against the armed outages; start those that are due."""
        with self._lock:  # the test's thread arms outages, the proxy's thread counts
            for armed in list(self._armed):
                if service in armed.services and armed.method in ("", method):
                    armed.after -= 1
                if armed.after <= 0:
                    self._armed.remove(armed)
                    for name in armed.services:
                        self._outages[name] = (time.monotonic() + armed.seconds, armed.kind, armed.path)
                    self.outage_began.set()

    def total(self, counts: dict[str, Counter[str]], key: str | None = None) -> int:
        """Sum of :attr:`forwarded` or :attr:`injected` over the services (of one ``key`` only)."""
        return sum(c[key] if key is not None else c.total() for c in counts.values())

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=120))
        for service in SERVICES:
            app = web.Application(client_max_size=256 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handler(service))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self._ports[service] = runner.addresses[0][1]
            self._runners.append(runner)

    async def _stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        await self._session.close()

    def _fault(self, service: str, path: str) -> str | None:
        until, kind, only = self._outages.get(service, (0.0, "", ""))
        if time.monotonic() < until and only in path:
            return kind
        if self._rng.random() < self._rates[service]:
            return self._rng.choice(self.kinds)
        return None

    def _handler(self, service: str):  # type: ignore[no-untyped-def]
        target = self._targets[service]

        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            fault = self._fault(service, request.path_qs)
            if fault is not None:
                self.injected[service][fault] += 1
            if fault in ("503", "500"):
                code = "ServerBusy" if fault == "503" else "InternalError"
                return web.Response(status=int(fault), headers={"x-ms-error-code": code}, text=f"{code} (injected)")
            if fault in ("reset", "timeout"):
                if fault == "timeout":
                    await asyncio.sleep(self.hang)
                if request.transport is not None:  # None: the client gave up and closed it already
                    request.transport.abort()
                return web.Response(status=500)  # never reaches the client
            if fault == SLOW:
                await asyncio.sleep(self.hang)
            if fault == GARBLED and body:
                body = bytes([body[0] ^ 0xFF]) + body[1:]
            headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
            try:
                async with self._session.request(
                    request.method,
                    URL(target + request.raw_path, encoded=True),  # exactly as the client signed it
                    headers=headers,
                    data=body or None,
                    skip_auto_headers=("Content-Type", "Accept-Encoding", "User-Agent"),  # would break the signature
                ) as answer:
                    payload = await answer.read()
            except aiohttp.ClientError as exc:  # Azurite dropped the connection (e.g. a keep-alive it closed)
                return web.Response(status=500, text=f"upstream failed: {exc}")
            self.forwarded[service][request.method] += 1
            self._fire(service, request.method)
            if fault == "lost_reply":
                return web.Response(
                    status=500, headers={"x-ms-error-code": "InternalError"}, text="reply lost (injected)"
                )
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_HEADERS}
            return web.Response(status=answer.status, headers=kept, body=payload)

        return handle


@dataclass
class _Outage:
    seconds: float
    kind: str
    services: tuple[str, ...]
    after: int
    method: str
    path: str


def _endpoint(connection_string: str, service: str) -> str:
    """``http://host:port`` of one service's endpoint in a connection string."""
    found = re.search(rf"{service}Endpoint=(https?://[^/;]+)", connection_string, re.IGNORECASE)
    if found is None:
        raise ValueError(f"the connection string has no {service} endpoint")
    return found.group(1)
