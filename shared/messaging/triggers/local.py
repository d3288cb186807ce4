"""The local trigger bus: loopback UDP datagrams between processes on one machine, no server.

Each subscriber binds a UDP socket on loopback and registers it as the blob
``subscribers/<instance_id>`` in a container of the storage account the pipeline already uses
(content and metadata: ``host``, ``port``, ``pid``, ``machine``, ``registered_at``, ``refresh``)
and deletes it on close. A publisher lists the registrations (one list request, cached for
``cache_ttl`` seconds), drops those whose process is gone (its pid says so on the same machine) or,
when the subscriber re-registers every ``refresh`` seconds, that missed three refreshes, and sends
each live subscriber the event as one datagram. Loopback does not cross machines (nor network
namespaces): a subscriber registered from another one (see
:func:`~shared.messaging.processes.machine_identity`) is left alone and gets nothing, and the
publisher warns once per such subscriber, since that role then wakes only at its safety poll
(roles on several hosts need the Service Bus backend). An idle subscriber makes no request at all
unless ``refresh`` is set. Datagrams may be lost: these are at-most-once hints, and the listener's safety
poll covers a loss.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable

from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError

from ...errors import BillingError, ConfigurationError, InfrastructureError, is_transient
from ..processes import machine_identity, pid_alive
from ..storage import Storage
from .base import TriggerBus, TriggerEvent, TriggerHandler

_LOGGER = logging.getLogger(__name__)

_PREFIX = "subscribers/"
_STALE_PERIODS = 3


def _storage_failed(what: str, exc: AzureError) -> BillingError:
    """The pipeline's error for a failed storage request: transient or not, by the one rule."""
    if is_transient(exc):
        return InfrastructureError(f"{what}: {exc}")
    return ConfigurationError(f"{what}: storage refused the request: {exc}")


class _Receiver(asyncio.DatagramProtocol):
    """Turns each datagram into a :class:`TriggerEvent` for the bus."""

    def __init__(self, bus: LocalTriggerBus) -> None:
        self._bus = bus

    def datagram_received(self, data: bytes, addr: tuple[str | int, int]) -> None:
        try:
            event = TriggerEvent.from_json(data)
        except ValueError:
            _LOGGER.debug("ignoring a datagram that is no trigger event from %s", addr)
            return
        self._bus._dispatch(event)

    def error_received(self, exc: Exception) -> None:
        _LOGGER.debug("trigger socket error: %s", exc)


class _Sender(asyncio.DatagramProtocol):
    def error_received(self, exc: Exception) -> None:
        # Loopback reports a datagram to a closed port (a subscriber that just went away) here.
        _LOGGER.debug("trigger datagram not delivered: %s", exc)


class LocalTriggerBus(TriggerBus):
    """Trigger bus between processes of one machine over loopback UDP, registered in blob storage.

    A bus with no handler at :meth:`start` only publishes; subscribing (before or after start)
    binds the socket and registers the instance.
    """

    def __init__(
        self,
        *,
        storage: Storage,
        container: str = "billing-triggers",
        instance_id: str | None = None,
        host: str = "127.0.0.1",
        refresh: float | None = None,
        cache_ttl: float = 5.0,
    ) -> None:
        super().__init__()
        if refresh is not None and refresh <= 0:
            raise ValueError("refresh must be positive (or None for no re-registration)")
        self._storage = storage
        self._container = storage.container(container)
        self.instance_id = instance_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._host = host
        self._refresh = refresh
        self._cache_ttl = cache_ttl
        self._started = False
        self._closed = False
        self._receiving = False
        self._registered = False
        self._recv_transport: asyncio.DatagramTransport | None = None
        self._send_transport: asyncio.DatagramTransport | None = None
        self._peers: list[tuple[str, int]] = []
        self._peers_at = float("-inf")
        self._peers_lock = asyncio.Lock()
        self._machine = machine_identity()
        self._elsewhere: set[str] = set()  # subscribers seen on other machines (warned about once)

    @property
    def blob_name(self) -> str:
        """The registration blob of this instance."""
        return _PREFIX + self.instance_id

    @property
    def address(self) -> tuple[str, int] | None:
        """The bound UDP address while subscribed, else ``None``."""
        if self._recv_transport is None:
            return None
        host, port = self._recv_transport.get_extra_info("sockname")[:2]
        return host, port

    async def start(self) -> None:
        """Create the container if missing; with handlers, bind the socket and register.

        Raises :class:`InfrastructureError` when storage cannot be reached (start may be retried),
        :class:`ConfigurationError` when it refuses the request.
        """
        if self._started:
            return
        try:
            await self._container.create_container()
        except ResourceExistsError:
            pass
        except AzureError as exc:
            raise _storage_failed("cannot create trigger container", exc) from exc
        if self._handlers:
            await self._begin_receiving()
        self._started = True

    def subscribe(self, handler: TriggerHandler) -> None:
        super().subscribe(handler)
        if self._started and not self._receiving and not self._closed:
            self._spawn(self._begin_receiving(), f"local-trigger-subscribe-{self.instance_id}")

    async def _begin_receiving(self) -> None:
        if self._receiving:
            return
        self._receiving = True
        loop = asyncio.get_running_loop()
        self._recv_transport, _ = await loop.create_datagram_endpoint(
            lambda: _Receiver(self), local_addr=(self._host, 0)
        )
        try:
            await self._register()
        except AzureError as exc:
            self._recv_transport.close()
            self._recv_transport, self._receiving = None, False
            raise _storage_failed("cannot register trigger subscriber", exc) from exc
        if self._refresh is not None:
            self._spawn(self._refresh_loop(), f"local-trigger-refresh-{self.instance_id}")

    async def _register(self) -> None:
        address = self.address
        assert address is not None
        record = {
            "host": address[0],
            "port": address[1],
            "pid": os.getpid(),
            "machine": self._machine,
            "registered_at": time.time(),
            "refresh": self._refresh or 0,
        }
        await self._container.upload_blob(
            self.blob_name,
            json.dumps(record).encode(),
            overwrite=True,
            metadata={key: str(value) for key, value in record.items()},
        )
        self._registered = True

    async def _refresh_loop(self) -> None:
        assert self._refresh is not None
        while True:
            await asyncio.sleep(self._refresh)
            try:
                await self._register()
            except AzureError as exc:
                _LOGGER.warning("trigger subscriber %s: re-registration failed: %s", self.instance_id, exc)

    async def publish(self, event: TriggerEvent) -> None:
        """Send ``event`` as one datagram to every live subscriber."""
        await self.publish_many([event])

    async def publish_many(self, events: Iterable[TriggerEvent]) -> None:
        """Send each event as one datagram to every live subscriber (one subscriber lookup)."""
        payloads = [event.to_json().encode() for event in events]
        if not payloads or self._closed:
            return
        try:
            peers = await self._subscribers()
        except AzureError as exc:
            _LOGGER.warning("trigger not published: cannot list subscribers: %s", exc)
            return
        transport = await self._sender()
        for peer in peers:
            for payload in payloads:
                try:
                    transport.sendto(payload, peer)
                except OSError as exc:
                    _LOGGER.debug("trigger datagram to %s failed: %s", peer, exc)

    async def _sender(self) -> asyncio.DatagramTransport:
        if self._send_transport is None:
            loop = asyncio.get_running_loop()
            self._send_transport, _ = await loop.create_datagram_endpoint(_Sender, local_addr=(self._host, 0))
        return self._send_transport

    async def _subscribers(self) -> list[tuple[str, int]]:
        """The live subscribers' addresses, from a listing at most ``cache_ttl`` seconds old."""
        async with self._peers_lock:
            if time.monotonic() - self._peers_at < self._cache_ttl:
                return self._peers
            peers: list[tuple[str, int]] = []
            stale: list[str] = []
            now = time.time()
            async for blob in self._container.list_blobs(name_starts_with=_PREFIX, include=["metadata"]):
                try:
                    meta = blob.metadata or {}
                    if meta.get("machine", self._machine) != self._machine:
                        self._warn_elsewhere(blob.name)
                        continue
                    refresh = float(meta.get("refresh") or 0)
                    missed = refresh > 0 and now - float(meta["registered_at"]) > _STALE_PERIODS * refresh
                    if missed or not pid_alive(int(meta["pid"])):
                        stale.append(blob.name)
                        continue
                    peers.append((meta["host"], int(meta["port"])))
                except (KeyError, ValueError):
                    _LOGGER.debug("ignoring malformed trigger registration %s", blob.name)
            self._peers, self._peers_at = peers, time.monotonic()
        for name in stale:
            await self._delete(name)
        return peers

    def _warn_elsewhere(self, name: str) -> None:
        if name not in self._elsewhere:
            self._elsewhere.add(name)
            _LOGGER.warning(
                "trigger subscriber %s is on another host: the local trigger bus reaches this host only, so it "
                "wakes at its safety poll alone; for roles on several hosts use Service Bus "
                "(BILLING_SERVICEBUS_CONNECTION_STRING or BILLING_SERVICEBUS_NAMESPACE)",
                name.removeprefix(_PREFIX),
            )

    async def _delete(self, name: str) -> None:
        try:
            await self._container.delete_blob(name)
        except ResourceNotFoundError:
            pass
        except AzureError as exc:
            _LOGGER.debug("cannot delete trigger registration %s: %s", name, exc)

    async def close(self) -> None:
        """Stop the refresh task, delete the registration and close the sockets."""
        if self._closed:
            return
        self._closed = True
        await self._stop_tasks()
        if self._registered:
            await self._delete(self.blob_name)
            self._registered = False
        for transport in (self._recv_transport, self._send_transport):
            if transport is not None:
                transport.close()
        self._recv_transport = self._send_transport = None
