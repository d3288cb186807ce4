"""The Azure Service Bus trigger bus: one topic, one subscription per processor instance.

Publishing sends to the topic; subscribing runs one blocking PEEK_LOCK receive loop on
``<topic>/Subscriptions/<subscription>`` (no polling), completing each message after its
handlers ran. The SDK's own retry policy handles short faults; on top of it, ``ServerBusy``
pauses sends and receives for ``server_busy_pause`` seconds (10 s, as Service Bus asks), and the
receive loop reconnects with jittered exponential back-off after transient failures
(:func:`~shared.errors.is_transient`), e.g. while the broker restarts. Permanent ones (credentials
or rights refused) raise :class:`~shared.errors.ConfigurationError`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import socket
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver, ServiceBusSender
from azure.servicebus.aio.management import ServiceBusAdministrationClient
from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusConnectionError,
    ServiceBusServerBusyError,
)

from ...errors import ConfigurationError, is_transient
from ..storage import RequestCounter
from .base import TriggerBus, TriggerEvent, TriggerHandler

_LOGGER = logging.getLogger(__name__)

_MESSAGE_TTL = timedelta(minutes=5)  # a hint older than this is worth nothing
# One receive call waits this long on the open link (the broker pushes; no request is repeated
# meanwhile); an idle receiver only renews its link credit this often. One message per call:
# asking for more makes the SDK linger 0.2 s after the first, for the rest of a batch.
_RECEIVE_WAIT = 60.0


def default_subscription_name() -> str:
    """``proc-<host>-<pid>``, within Service Bus's 50-character limit and character set."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:32]
    return f"proc-{host}-{os.getpid()}"


class ServiceBusTriggerBus(TriggerBus):
    """Trigger bus over an Azure Service Bus topic (async SDK).

    Give either ``connection_string`` or ``namespace`` (then ``DefaultAzureCredential``). With
    ``create_subscription`` the subscription is created at start if missing (with
    ``auto_delete_on_idle``) and deleted on close if this instance created it; without it the
    subscription must be declared ahead. ``retry_*`` configure the SDK's retry policy;
    ``reconnect_*`` bound the receive loop's back-off between reconnection attempts.
    """

    def __init__(
        self,
        *,
        connection_string: str | None = None,
        namespace: str | None = None,
        topic: str = "billing-triggers",
        subscription: str | None = None,
        create_subscription: bool = True,
        auto_delete_on_idle: timedelta = timedelta(minutes=10),
        server_busy_pause: float = 10.0,
        retry_total: int = 3,
        retry_backoff_factor: float = 0.8,
        retry_backoff_max: float = 30.0,
        reconnect_initial: float = 0.5,
        reconnect_max: float = 30.0,
        start_timeout: float = 30.0,
        counter: RequestCounter | None = None,
    ) -> None:
        super().__init__()
        if (connection_string is None) == (namespace is None):
            raise ConfigurationError("give exactly one of a Service Bus connection string or namespace")
        self._connection_string = connection_string
        self._namespace = namespace
        self.topic = topic
        self.subscription = subscription or default_subscription_name()
        self._create_subscription = create_subscription
        self._auto_delete_on_idle = auto_delete_on_idle
        self._busy_pause = server_busy_pause
        self._retry: dict[str, Any] = {
            "retry_total": retry_total,
            "retry_backoff_factor": retry_backoff_factor,
            "retry_backoff_max": retry_backoff_max,
        }
        self._reconnect_initial = reconnect_initial
        self._reconnect_max = reconnect_max
        self._start_timeout = start_timeout
        self._counter = counter or RequestCounter()
        self._credential: Any = None
        self._client: ServiceBusClient | None = None
        self._sender: ServiceBusSender | None = None
        self._send_lock = asyncio.Lock()
        self._busy_until = 0.0
        self._receiving = False
        self._attached = asyncio.Event()
        self._subscription_ready = not create_subscription
        self._created_subscription = False
        self._closed = False

    @property
    def where(self) -> str:
        """``namespace/topic/subscription``, for logs (never the connection string)."""
        return f"{self._namespace or 'connection-string'}/{self.topic}/{self.subscription}"

    @property
    def paused(self) -> bool:
        """Whether a ServerBusy answer is still pausing sends and receives."""
        return time.monotonic() < self._busy_until

    async def start(self) -> None:
        """Open the client; with handlers, create the subscription and attach the receiver.

        Waits up to ``start_timeout`` for the first attach, then leaves reconnecting to the
        receive loop; raises :class:`ConfigurationError` when credentials or entities are wrong.
        """
        if self._client is not None:
            return
        if self._connection_string is not None:
            self._client = ServiceBusClient.from_connection_string(self._connection_string, **self._retry)
        else:
            from azure.identity.aio import DefaultAzureCredential

            self._credential = DefaultAzureCredential()
            self._client = ServiceBusClient(self._namespace or "", self._credential, **self._retry)
        if self._handlers:
            await self._begin_receiving()

    def subscribe(self, handler: TriggerHandler) -> None:
        super().subscribe(handler)
        if self._client is not None and not self._receiving and not self._closed:
            self._receiving = True
            self._spawn(self._receive_loop(), f"servicebus-trigger-receive-{self.subscription}")

    async def _begin_receiving(self) -> None:
        self._receiving = True
        loop_task = self._spawn(self._receive_loop(), f"servicebus-trigger-receive-{self.subscription}")
        attached = asyncio.ensure_future(self._attached.wait())
        try:
            await asyncio.wait({attached, loop_task}, timeout=self._start_timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            attached.cancel()
        if loop_task.done() and not loop_task.cancelled() and loop_task.exception() is not None:
            raise loop_task.exception()  # type: ignore[misc]
        if not self._attached.is_set():
            _LOGGER.warning("trigger subscription %s not attached yet; still trying", self.where)

    async def _pause_if_busy(self) -> None:
        remaining = self._busy_until - time.monotonic()
        if remaining > 0:
            await asyncio.sleep(remaining)

    def _server_busy(self, exc: ServiceBusServerBusyError, entity: str) -> None:
        self._busy_until = time.monotonic() + self._busy_pause
        _LOGGER.warning(
            "Service Bus is busy (%s); pausing sends and receives %.1f s (%s)", exc, self._busy_pause, entity
        )

    async def _receive_loop(self) -> None:
        """Receive until cancelled, reconnecting after transient failures; permanent ones end it."""
        assert self._client is not None
        delay = self._reconnect_initial
        while True:
            await self._pause_if_busy()
            try:
                if not self._subscription_ready:
                    await self._ensure_subscription()
                receiver: ServiceBusReceiver = self._client.get_subscription_receiver(
                    self.topic, self.subscription, receive_mode=ServiceBusReceiveMode.PEEK_LOCK
                )
                async with receiver:
                    self._attached.set()
                    delay = self._reconnect_initial
                    while True:
                        # Not ``async for``: the SDK's iterator ends silently on link errors
                        # (ServerBusy included) where receive_messages raises them.
                        self._counter.add("servicebus.receive", self.topic)
                        for message in await receiver.receive_messages(1, max_wait_time=_RECEIVE_WAIT):
                            self._handle(message)
                            await self._complete(receiver, message)
            except MessagingEntityNotFoundError as exc:
                if not self._create_subscription:
                    raise ConfigurationError(f"no Service Bus subscription {self.where}: {exc}") from exc
                self._subscription_ready = False  # auto-deleted while away: create it again
                _LOGGER.warning("trigger subscription %s vanished; re-creating it", self.where)
            except ServiceBusServerBusyError as exc:
                self._server_busy(exc, self.where)
                continue
            except (AzureError, OSError) as exc:
                if not is_transient(exc):
                    raise ConfigurationError(f"Service Bus refused {self.where}: {exc}") from exc
                _LOGGER.warning("trigger receive on %s failed (%s); reconnecting in %.1f s", self.where, exc, delay)
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self._reconnect_max)

    async def _complete(self, receiver: ServiceBusReceiver, message: Any) -> None:
        """Settle a handled message; failing that, it may come again (a harmless duplicate hint)."""
        try:
            self._counter.add("servicebus.settle", self.topic)
            await receiver.complete_message(message)
        except (AzureError, OSError) as exc:
            _LOGGER.info("trigger message not completed on %s (%s); it may be delivered again", self.where, exc)

    def _handle(self, message: Any) -> None:
        try:
            event = TriggerEvent.from_json(b"".join(message.body))
        except (ValueError, TypeError):
            _LOGGER.warning("dropping a message that is no trigger event on %s", self.where)
            return
        self._dispatch(event)

    def _admin(self) -> ServiceBusAdministrationClient:
        if self._connection_string is not None:
            return ServiceBusAdministrationClient.from_connection_string(self._connection_string)
        return ServiceBusAdministrationClient(self._namespace or "", self._credential)

    async def _ensure_subscription(self) -> None:
        async with self._admin() as admin:
            try:
                await admin.create_subscription(
                    self.topic, self.subscription, auto_delete_on_idle=self._auto_delete_on_idle
                )
                self._created_subscription = True
                _LOGGER.info("created trigger subscription %s", self.where)
            except ResourceExistsError:
                pass
            except ResourceNotFoundError as exc:
                raise ConfigurationError(f"no Service Bus topic {self.topic!r}: {exc}") from exc
        self._subscription_ready = True

    async def publish(self, event: TriggerEvent) -> None:
        """Send ``event`` to the topic; dropped (and logged) while paused or on failure."""
        await self.publish_many([event])

    async def publish_many(self, events: Iterable[TriggerEvent]) -> None:
        """Send the events to the topic in one batched transfer; dropped (and logged) on failure."""
        try:
            await self.send(events)
        except (AzureError, OSError) as exc:
            _LOGGER.warning("trigger not published to %s: %s", self.topic, exc)

    async def send(self, events: Iterable[TriggerEvent]) -> None:
        """Send the events to the topic in one batched transfer. While a ServerBusy answer pauses
        sends they are dropped; a refusal raises :class:`ConfigurationError`, other failures raise."""
        messages = [
            ServiceBusMessage(event.to_json(), content_type="application/json", time_to_live=_MESSAGE_TTL)
            for event in events
        ]
        if not messages or self._closed:
            return
        if self._client is None:
            await self.start()
        if self.paused:
            _LOGGER.info("Service Bus busy: %d trigger(s) not sent to %s", len(messages), self.topic)
            return
        assert self._client is not None
        async with self._send_lock:
            try:
                if self._sender is None:
                    self._sender = self._client.get_topic_sender(self.topic)
                self._counter.add("servicebus.send", self.topic)
                await self._sender.send_messages(messages)
            except ServiceBusServerBusyError as exc:
                self._server_busy(exc, self.topic)
            except (AzureError, OSError) as exc:
                if not is_transient(exc):
                    raise ConfigurationError(f"Service Bus refused sends to {self.topic!r}: {exc}") from exc
                if isinstance(exc, (ServiceBusConnectionError, OSError)):
                    await self._close_sender()
                raise

    async def _close_sender(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None:
            try:
                await sender.close()
            except (AzureError, OSError) as exc:
                _LOGGER.debug("closing the trigger sender failed: %s", exc)

    async def close(self) -> None:
        """Stop the receive loop, delete the subscription this instance created, close clients."""
        if self._closed:
            return
        self._closed = True
        await self._stop_tasks()
        await self._close_sender()
        if self._created_subscription:
            try:
                async with self._admin() as admin:
                    await admin.delete_subscription(self.topic, self.subscription)
            except Exception as exc:
                _LOGGER.warning("could not delete trigger subscription %s: %s", self.where, exc)
        if self._client is not None:
            await self._client.close()
        if self._credential is not None:
            await self._credential.close()
