"""An HTTPS proxy (HTTP ``CONNECT``) on 127.0.0.1 that knows a fixed set of host names.

Where a test has no DNS (a loopback-only network namespace) but the code under test must use an
account's real endpoint names (``https://<account>.blob.core.windows.net``), point ``HTTPS_PROXY``
at this proxy: the Azure SDK (aiohttp) then asks it to ``CONNECT <name>:443`` and the proxy joins
the tunnel to the local port that stands for the name. It relays bytes and never sees inside TLS,
so certificates are checked end to end against the name. A name it does not know is refused
(403) and recorded: :attr:`TunnelProxy.asked` is every ``host:port`` asked for, known or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter
from collections.abc import Mapping
from types import TracebackType

from support.background import BackgroundLoop


class TunnelProxy:
    """Use as ``with TunnelProxy({"acct.blob.core.windows.net:443": blob_port}) as proxy``; then
    ``HTTPS_PROXY=proxy.url``. Its socket is bound when entered, in the entering thread's namespace."""

    def __init__(self, routes: Mapping[str, int]) -> None:
        self.routes = dict(routes)  # "host:port" -> port on 127.0.0.1
        self.asked: Counter[str] = Counter()
        self._background = BackgroundLoop("tunnel-proxy")
        self._server: asyncio.Server | None = None
        self._sock = socket.socket()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def __enter__(self) -> TunnelProxy:
        self._sock.bind(("127.0.0.1", 0))
        self._background.__enter__()
        self._server = self._background.run(self._start())
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                self._background.run(self._server.wait_closed(), timeout=5)
        self._background.__exit__(exc_type, exc, tb)

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._tunnel, sock=self._sock)

    async def _tunnel(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            head = await client_reader.readuntil(b"\r\n\r\n")
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            self.asked[target] += 1
            port = self.routes.get(target) if method == "CONNECT" else None
            if port is None:
                client_writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
            client_writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await asyncio.gather(
                _relay(client_reader, upstream_writer), _relay(upstream_reader, client_writer), return_exceptions=True
            )
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass  # a client that went away, or spoke no HTTP
        finally:
            client_writer.close()


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
