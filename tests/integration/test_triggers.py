"""Trigger buses, against real infrastructure.

- :class:`LocalTriggerBus` between separate OS processes, registered in a real Azurite.
- :class:`ServiceBusTriggerBus` driving the real ``azure-servicebus`` SDK against
  ``tests/support/servicebus_broker.py``. No Service Bus or emulator can run here: that broker stands in
  for Azure Service Bus *at the wire* (AMQP 1.0, CBS, topic → subscriptions, PEEK_LOCK), it is
  not Service Bus itself.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.messaging.failover import Health
from shared.messaging.storage import RequestCounter, Storage
from shared.messaging.triggers import LocalTriggerBus, PairedTriggerBus, ServiceBusTriggerBus, TriggerEvent
from shared.settings import Settings
from support.servicebus_broker import ServiceBusTestBroker
from support.waiting import wait_until_async

ROOT = Path(__file__).resolve().parents[2]

# A subscriber process: prints "ready <instance>" once registered, then one JSON line per event;
# closes its bus (unregistering) and prints "closed" when its stdin ends.
SUBSCRIBER = """
import asyncio, sys
from shared.settings import Settings
from shared.messaging.storage import Storage
from shared.messaging.triggers import LocalTriggerBus

async def main():
    async with Storage(Settings()) as storage:
        bus = LocalTriggerBus(storage=storage, container=sys.argv[1], instance_id=sys.argv[2])
        bus.subscribe(lambda event: print("event", event.to_json(), flush=True))
        await bus.start()
        print("ready", bus.instance_id, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await bus.close()
        print("closed", flush=True)

asyncio.run(main())
"""


def _event(queue: str = "billing-input-0", messages: int = 3, transactions: int = 3000) -> TriggerEvent:
    return TriggerEvent(account="devstoreaccount1", queue=queue, messages=messages, transactions=transactions)


# --- the local bus --------------------------------------------------------------------------


LINE_TIMEOUT = 15.0  # seconds a subscriber process has to say anything
EVENT_TIMEOUT = 5.0  # seconds for a published event to reach a subscriber


class Subscriber:
    """A subscriber process of the local bus, read line by line."""

    def __init__(self, process: asyncio.subprocess.Process, instance_id: str) -> None:
        self.process = process
        self.instance_id = instance_id

    @classmethod
    async def spawn(cls, container: str) -> Subscriber:
        instance_id = f"sub-{uuid.uuid4().hex[:8]}"
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            SUBSCRIBER,
            container,
            instance_id,
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        subscriber = cls(process, instance_id)
        assert await subscriber.line() == f"ready {instance_id}"
        return subscriber

    async def line(self) -> str:
        assert self.process.stdout is not None
        async with asyncio.timeout(LINE_TIMEOUT):
            raw = await self.process.stdout.readline()
        return raw.decode().strip()

    async def event(self) -> TriggerEvent:
        async with asyncio.timeout(EVENT_TIMEOUT):
            kind, _, payload = (await self.line()).partition(" ")
        assert kind == "event"
        return TriggerEvent.from_json(payload)

    async def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert await self.line() == "closed"
        await self.process.wait()


@pytest.fixture
def container(settings_env: Settings) -> str:
    return f"{settings_env.queue_prefix}-triggers"


async def _registrations(storage: Storage, container: str) -> set[str]:
    return {blob.name async for blob in storage.container(container).list_blobs(name_starts_with="subscribers/")}


async def test_local_bus_between_processes(storage: Storage, container: str) -> None:
    """Two subscriber processes both get one publish; a closed one is unregistered."""
    first, second = await asyncio.gather(Subscriber.spawn(container), Subscriber.spawn(container))
    try:
        assert await _registrations(storage, container) == {
            f"subscribers/{first.instance_id}",
            f"subscribers/{second.instance_id}",
        }
        async with LocalTriggerBus(storage=storage, container=container, cache_ttl=0) as publisher:
            event = _event()
            before = storage.counter.total
            await publisher.publish(event)
            assert storage.counter.total - before == 1  # one list request, nothing per subscriber
            assert await first.event() == event
            assert await second.event() == event

            await first.close()
            assert await _registrations(storage, container) == {f"subscribers/{second.instance_id}"}
            await publisher.publish(_event("billing-input-1"))
            assert (await second.event()).queue == "billing-input-1"
    finally:
        for subscriber in (first, second):
            if subscriber.process.returncode is None:
                subscriber.process.kill()
                await subscriber.process.wait()


async def test_local_bus_in_process_and_stale_registrations(storage: Storage, container: str) -> None:
    """Subscribing after start registers; a registration not refreshed for 3 × refresh, or whose
    process is gone, is skipped and deleted; the subscriber list is cached between publishes."""
    gone = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")  # its pid names no process now
    await gone.wait()
    await storage.container(container).create_container()
    for name, pid, refresh in (("missed-refreshes", os.getpid(), "60"), ("crashed", gone.pid, "0")):
        record = {"host": "127.0.0.1", "port": "9", "pid": str(pid), "registered_at": "0", "refresh": refresh}
        await storage.container(container).upload_blob(
            f"subscribers/{name}", json.dumps(record).encode(), metadata=record
        )
    got: list[TriggerEvent] = []
    async with LocalTriggerBus(storage=storage, container=container, refresh=0.2) as bus:
        bus.subscribe(got.append)

        async def registered() -> bool:
            return f"subscribers/{bus.instance_id}" in await _registrations(storage, container)

        await asyncio.wait_for(wait_until_async(registered), 5)
        await bus.publish(_event())
        assert await _registrations(storage, container) == {f"subscribers/{bus.instance_id}"}
        before = storage.counter.total
        await bus.publish_many([_event("billing-input-1"), _event("billing-input-2")])
        assert storage.counter.total == before  # served from the cached list
        await asyncio.sleep(0.5)  # a few refreshes happen meanwhile
        assert [event.queue for event in got] == ["billing-input-0", "billing-input-1", "billing-input-2"]
    assert await _registrations(storage, container) == set()


# --- the Service Bus bus, through the test broker -------------------------------------------

TOPIC = "billing-triggers"
FAST = {  # the SDK's retries and our reconnect back-off, shortened for tests
    "retry_total": 1,
    "retry_backoff_factor": 0.1,
    "retry_backoff_max": 1.0,
    "reconnect_initial": 0.2,
    "reconnect_max": 1.0,
    "create_subscription": False,  # the administration client speaks HTTPS only: declared ahead
}


#: For a test connected to a broker that cuts its connections (stopped, or refusing as busy): the SDK leaves their
#: sockets and transports to the garbage collector, unclosed. The test collects them as it ends (``collected``),
#: where their warnings, and only theirs, are ignored, so that no later test reports them.
cuts_connections = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <(socket.socket|function (StreamWriter|_SelectorTransport).__del__)"
    ":pytest.PytestUnraisableExceptionWarning"
)


@pytest.fixture
def collected(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Collects, as the test ends, what the SDK left to the garbage collector. The test's log records are dropped
    first: a reconnect's warning holds its exception, whose traceback holds the connection's socket, and pytest
    keeps the records until after the test's teardown (the socket would then be collected in a later test)."""
    yield
    for when in ("setup", "call"):
        caplog.get_records(when).clear()
    caplog.clear()
    gc.collect()


@pytest.fixture
def broker(collected: None) -> Iterator[ServiceBusTestBroker]:
    """A broker for the test; what its clients left is collected once it has stopped."""
    with ServiceBusTestBroker(topic=TOPIC, subscriptions=["a", "b"]) as broker:
        yield broker


WAIT = 10.0  # seconds for anything the broker or a bus does to show


class Inbox:
    """Events one bus received."""

    def __init__(self) -> None:
        self.events: list[TriggerEvent] = []

    def __call__(self, event: TriggerEvent) -> None:
        self.events.append(event)

    async def received(self, count: int) -> list[TriggerEvent]:
        """Every event so far, once there are at least ``count``."""
        await asyncio.wait_for(wait_until_async(lambda: len(self.events) >= count, interval=0.01), WAIT)
        return self.events


async def _subscriber(
    broker: ServiceBusTestBroker, name: str | None, **options: object
) -> tuple[ServiceBusTriggerBus, Inbox]:
    bus = ServiceBusTriggerBus(
        connection_string=broker.connection_string, topic=TOPIC, subscription=name, **{**FAST, **options}
    )  # type: ignore[arg-type]
    inbox = Inbox()
    bus.subscribe(inbox)
    await bus.start()
    return bus, inbox


@cuts_connections
async def test_servicebus_publish_reaches_every_subscription(broker: ServiceBusTestBroker) -> None:
    """Declared subscriptions and a per-instance one (created by the broker on attach) all get
    a single publish and a batch publish; the batch goes as one transfer. Once connected, a publish opens
    no connection and no link."""
    subscribers = [await _subscriber(broker, name) for name in ("a", "b", None)]
    publisher = ServiceBusTriggerBus(connection_string=broker.connection_string, topic=TOPIC, **FAST)  # type: ignore[arg-type]
    try:
        assert subscribers[2][0].subscription.startswith("proc-")
        await publisher.start()
        await publisher.publish(_event())
        for _, inbox in subscribers:
            assert await inbox.received(1) == [_event()]

        batch = [_event(f"billing-input-{i}") for i in range(3)]
        sends = broker.stats()["sends"]
        await publisher.publish_many(batch)
        for _, inbox in subscribers:
            assert (await inbox.received(4))[1:] == batch
        stats = broker.stats()
        assert stats["sends"] == sends + 1 and stats["routed"] == 4
        # every message is completed (PEEK_LOCK), just after its handlers ran
        await asyncio.wait_for(wait_until_async(lambda: broker.stats().get("settled_accepted") == 12), WAIT)

        opened = broker.stats()  # steady state: each publish goes over the open connection and links
        for i in range(10):
            await publisher.publish(_event(f"again-{i}"))
            assert (await subscribers[0][1].received(5 + i))[-1] == _event(f"again-{i}")
        assert [broker.stats()[name] for name in ("connections", "links")] == [opened["connections"], opened["links"]]
    finally:
        await publisher.close()
        for bus, _ in subscribers:
            await bus.close()
    assert broker.stats()["receivers"] == {"a": 0, "b": 0, subscribers[2][0].subscription: 0}


@cuts_connections
async def test_servicebus_operations_are_counted(broker: ServiceBusTestBroker) -> None:
    """Sends, receives and settlements are billed operations: each is counted, and the counts
    agree with what the broker saw."""
    counter = RequestCounter()
    bus, inbox = await _subscriber(broker, "a", counter=counter)
    publisher_counter = RequestCounter()
    publisher = ServiceBusTriggerBus(
        connection_string=broker.connection_string, topic=TOPIC, counter=publisher_counter, **FAST
    )  # type: ignore[arg-type]
    try:
        for i in range(3):
            await publisher.publish(_event(f"billing-input-{i}"))
        await inbox.received(3)
        await asyncio.wait_for(wait_until_async(lambda: broker.stats().get("settled_accepted") == 3), WAIT)
    finally:
        await publisher.close()
        await bus.close()
    assert publisher_counter.counts == {"servicebus.send": broker.stats()["sends"]} == {"servicebus.send": 3}
    assert counter.counts["servicebus.settle"] == 3
    assert 3 <= counter.counts["servicebus.receive"] <= 5  # one per message, plus the waits in between
    assert counter.by_resource[TOPIC] == counter.total


@cuts_connections
async def test_paired_namespaces_publish_to_the_secondary_after_the_interval_and_back(collected: None) -> None:
    """Two test brokers as two namespaces: while the primary is down, publishing drops hints for the
    failover interval, then sends them to the secondary (where subscribers also listen); after the
    primary returns, the next probe moves publishing back."""

    def pair(primary: ServiceBusTestBroker, secondary: ServiceBusTestBroker, name: str | None) -> PairedTriggerBus:
        buses = [
            ServiceBusTriggerBus(connection_string=b.connection_string, topic=TOPIC, subscription=name, **FAST)
            for b in (primary, secondary)
        ]  # type: ignore[arg-type]
        return PairedTriggerBus(*buses, interval=1.0, probe_interval=1.0)

    with (
        ServiceBusTestBroker(topic=TOPIC, subscriptions=["a"]) as primary,
        ServiceBusTestBroker(topic=TOPIC, subscriptions=["a"]) as secondary,
    ):
        subscriber, publisher = pair(primary, secondary, "a"), pair(primary, secondary, None)
        inbox = Inbox()
        subscriber.subscribe(inbox)
        await subscriber.start()
        await publisher.start()
        try:
            await publisher.publish(_event("before"))
            await inbox.received(1)
            primary.stop()
            await publisher.publish(_event("dropped"))  # failing, for less than the interval
            assert publisher.route.health is Health.FAILING and secondary.stats().get("sends", 0) == 0
            await asyncio.sleep(1.0)
            await publisher.publish(_event("via-secondary"))
            assert publisher.route.health is Health.FAILED_OVER and secondary.stats()["sends"] == 1
            assert [e.queue for e in await inbox.received(2)] == ["before", "via-secondary"]

            primary.start()
            await asyncio.sleep(1.5)  # a probe is due; the subscriber has reconnected
            await publisher.publish(_event("back"))
            assert publisher.route.health is Health.HEALTHY and secondary.stats()["sends"] == 1
            assert [e.queue for e in await inbox.received(3)] == ["before", "via-secondary", "back"]
        finally:
            await publisher.close()
            await subscriber.close()


@cuts_connections
async def test_servicebus_subscriber_survives_broker_restart(broker: ServiceBusTestBroker) -> None:
    bus, inbox = await _subscriber(broker, "a")
    publisher = ServiceBusTriggerBus(connection_string=broker.connection_string, topic=TOPIC, **FAST)  # type: ignore[arg-type]
    try:
        await publisher.publish(_event("before"))
        await inbox.received(1)

        broker.stop()
        await asyncio.sleep(1.0)  # the receive loop fails and backs off meanwhile
        broker.start()
        await asyncio.wait_for(wait_until_async(lambda: broker.stats()["receivers"]["a"] == 1), 15)

        await publisher.publish(_event("after"))  # the sender reconnects too
        assert [event.queue for event in await inbox.received(2)] == ["before", "after"]
    finally:
        await publisher.close()
        await bus.close()


@cuts_connections
async def test_servicebus_server_busy_pauses(broker: ServiceBusTestBroker) -> None:
    """ServerBusy, once the SDK's own retries are spent, pauses sends (publishes meanwhile are
    dropped without touching the broker) and receives (the receiver attaches after the pause)."""
    pause = 1.5
    bus, inbox = await _subscriber(broker, "a", server_busy_pause=pause)
    publisher = ServiceBusTriggerBus(
        connection_string=broker.connection_string, topic=TOPIC, server_busy_pause=pause, **FAST
    )  # type: ignore[arg-type]
    late: ServiceBusTriggerBus | None = None
    try:
        await publisher.start()
        broker.server_busy(FAST["retry_total"] + 1)  # type: ignore[operator]
        started = time.monotonic()
        await publisher.publish(_event("refused"))  # logged and dropped, not raised
        assert publisher.paused
        sends = broker.stats()["sends"]
        await publisher.publish(_event("paused"))
        assert broker.stats()["sends"] == sends
        await asyncio.wait_for(wait_until_async(lambda: not publisher.paused), WAIT)
        assert time.monotonic() - started >= pause
        await publisher.publish(_event("resumed"))
        assert [event.queue for event in await inbox.received(1)] == ["resumed"]

        # Busy until the SDK's retries of the receiver's attach are spent, then no more.
        broker.server_busy(1000)
        late, late_inbox = await _subscriber(broker, "b", server_busy_pause=pause)
        await asyncio.wait_for(wait_until_async(lambda: late.paused), WAIT)
        paused_at = time.monotonic()
        broker.server_busy(0)
        assert broker.stats()["receivers"]["b"] == 0
        await asyncio.wait_for(wait_until_async(lambda: broker.stats()["receivers"]["b"] == 1), WAIT)
        assert not late.paused and time.monotonic() - paused_at >= pause - 0.1
        await publisher.publish(_event("late"))
        # subscription b existed all along: it kept "resumed" until its receiver came
        assert [event.queue for event in await late_inbox.received(2)] == ["resumed", "late"]
    finally:
        await publisher.close()
        await bus.close()
        if late is not None:
            await late.close()


@cuts_connections
def test_connection_string_is_not_logged(broker: ServiceBusTestBroker) -> None:
    bus = ServiceBusTriggerBus(connection_string=broker.connection_string, topic=TOPIC, subscription="a")
    assert "SharedAccessKey" not in repr(bus) and "SharedAccessKey" not in bus.where
