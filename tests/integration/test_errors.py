"""The one rule for transient errors, and a configuration error met by a handler against Azurite:
the listener stops and hands the message back (neither poisoned nor lost), and the role's run ends
with the error."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
    ServiceBusServerBusyError,
)
from azure.storage.queue import QueueMessage

from shared.errors import (
    ConfigurationError,
    FileRefused,
    InfrastructureError,
    PoisonMessage,
    is_transient,
)
from shared.messaging.backoff import patiently
from shared.messaging.envelope import ClaimCheck
from shared.messaging.listener import QueueListener
from shared.messaging.poison import PoisonQueue, poison_queue_name
from shared.messaging.service import Service
from shared.messaging.storage import Storage
from shared.settings import Settings
from support.listeners import listener_on
from support.waiting import wait_until_async

REFUSED = "BILLING_REFERENCE_CONTAINER names a container this account may not read"


def _http(status: int) -> HttpResponseError:
    error = HttpResponseError(message=f"status {status}")
    error.status_code = status
    return error


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (InfrastructureError("SQL store unavailable"), True),
        (ServiceRequestError("connection refused"), True),
        (ServiceResponseError("connection reset"), True),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (_http(500), True),
        (_http(503), True),
        (_http(408), True),
        (_http(429), True),
        (ServiceBusConnectionError(message="link detached"), True),
        (ServiceBusServerBusyError(message="busy"), True),
        (MessagingEntityNotFoundError(message="no subscription"), True),  # the receive loop re-creates it
        (_http(400), False),
        (_http(403), False),
        (ResourceNotFoundError("gone"), False),
        (ClientAuthenticationError("bad key"), False),
        (ServiceBusAuthenticationError(message="bad key"), False),
        (ServiceBusAuthorizationError(message="no rights"), False),
        (ConfigurationError("no storage account"), False),
        (PoisonMessage("bad_envelope"), False),
        (FileRefused("not a CSV"), False),
        (ValueError("a bug"), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_is_transient_is_the_one_rule(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


async def test_patiently_retries_only_transient_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shared.messaging.backoff.pause", lambda failures: 0.0)
    attempts = 0

    async def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise _http(503)
        return "done"

    assert await patiently("storage", flaky) == "done" and attempts == 3

    async def refused() -> str:
        raise ConfigurationError(REFUSED)

    with pytest.raises(ConfigurationError):
        await patiently("storage", refused)


async def _refuse(messages: list[QueueMessage]) -> Mapping[str, str]:
    raise ConfigurationError(REFUSED)


async def _refusing(storage: Storage, settings: Settings) -> QueueListener:
    """A listener whose handler refuses with a configuration error, and one message for it. Not burst: only the
    error can end its run. A long lease: only a hand-back makes the message visible soon."""
    await storage.queue(settings.requests_queue).send_message("needs the right settings")
    return listener_on(storage, settings, _refuse, burst=False, visibility_timeout=600)


async def _stopped(listener: QueueListener, storage: Storage, settings: Settings) -> list[tuple[str, int | None]]:
    """Run ``listener`` until the configuration error stops it; then each message visible again, with its count of
    deliveries."""
    with pytest.raises(ConfigurationError, match="may not read"):
        await asyncio.wait_for(listener.run(), timeout=15)
    again = storage.queue(settings.requests_queue).receive_messages(max_messages=32)
    return [(m.content, m.dequeue_count) async for m in again]


async def test_a_configuration_error_in_the_handler_stops_the_listener_and_hands_the_message_back(
    storage: Storage, settings_env: Settings
) -> None:
    listener = await _refusing(storage, settings_env)
    assert await _stopped(listener, storage, settings_env) == [("needs the right settings", 2)]
    poison = storage.queue(poison_queue_name(settings_env.requests_queue))
    assert await poison.peek_messages(max_messages=32) == []
    state = listener.state()
    assert (state.processed, state.poisoned, state.active_tasks) == (0, 0, 0)


async def test_a_configuration_error_hands_the_batch_back_once_nothing_is_received_any_more(
    storage: Storage, settings_env: Settings
) -> None:
    """The task that received the batch already receives the next while the handler works (``prefetch``). A
    batch handed back before that receive ends would be received again, its delivery counted twice: it goes
    back when the listener has stopped receiving. The receive after the first is slowed to end after the error."""
    listener = await _refusing(storage, settings_env)
    receive, receives = listener._receive, 0

    async def late_after_the_first(count: int) -> list[QueueMessage]:
        nonlocal receives
        receives += 1
        if receives > 1:
            await asyncio.sleep(1.0)  # the handler has met the error by now
        return await receive(count)

    listener._receive = late_after_the_first  # type: ignore[method-assign]
    assert await _stopped(listener, storage, settings_env) == [("needs the right settings", 2)]
    assert receives == 2, "a second receive was in flight when the handler met the error"


async def test_other_errors_in_the_handler_keep_the_listener_going(storage: Storage, settings_env: Settings) -> None:
    queue = storage.queue(settings_env.requests_queue)
    await queue.send_message("try again")
    calls = 0

    async def flaky(messages: list[QueueMessage]) -> Mapping[str, str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise InfrastructureError("SQL store unavailable")
        return {}

    listener = listener_on(storage, settings_env, flaky, burst=False, visibility_timeout=1, max_idle_interval=0.2)
    runner = asyncio.create_task(listener.run())
    async with asyncio.timeout(20):  # redelivered
        await wait_until_async(lambda: listener.state().processed >= 1)
    listener.stop()
    await runner  # ends without an error
    assert (calls, listener.state().failed_batches) == (2, 1)


async def test_a_role_whose_listener_meets_a_configuration_error_stops_every_listener(
    storage: Storage, settings_env: Settings
) -> None:
    requests, results = settings_env.requests_queue, settings_env.results_queue
    await storage.queue(requests).send_message("needs the right settings")
    handled: list[str] = []

    async def record(messages: list[QueueMessage]) -> Mapping[str, str]:
        handled.extend(m.content for m in messages)
        return {}

    service = Service(storage=storage, settings=settings_env)
    poison = PoisonQueue(
        storage, ClaimCheck(storage, container=settings_env.work_container, limit=settings_env.max_message_bytes)
    )
    service.listen(requests, _refuse, poison=poison, visibility_timeout=600)
    service.listen(results, record, poison=poison)  # a healthy listener: it stops too
    with pytest.raises(ConfigurationError, match="may not read"):
        await asyncio.wait_for(service.run(), timeout=30)
    again = [m async for m in storage.queue(requests).receive_messages(max_messages=32)]
    assert [m.content for m in again] == ["needs the right settings"]
