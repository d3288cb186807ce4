"""A small Service-Bus-compatible AMQP 1.0 broker for tests, on python-qpid-proton.

It stands in for Azure Service Bus *at the wire*: the real ``azure-servicebus`` SDK connects to it
with ``...;UseDevelopmentEmulator=true`` (plain AMQP, no TLS) and cannot tell the difference for
what the trigger bus uses. It is no Service Bus: one topic, in-memory subscriptions, no
management HTTP endpoint, no lock expiry, no sessions.

What it speaks:

- SASL ANONYMOUS (the SDK authenticates with a token over CBS afterwards);
- claims-based security: ``put-token`` requests on ``$cbs`` get ``status-code`` 202 on the
  connection's ``$cbs`` reply link (or the request's reply-to), correlation-id = message-id;
- a message sent to the topic goes to every subscription; a batch (message format
  ``0x80013700``, several data sections each holding an encoded message) is unpacked first;
- ``<topic>/Subscriptions/<name>`` receivers get round-robin deliveries with 16-byte tags
  (the SDK's lock tokens); unknown subscriptions are created on attach;
- PEEK_LOCK (rcv-settle-mode second): the client's disposition is echoed, settled; released
  messages go back without counting a delivery, modified(delivery-failed) ones count one, messages
  unsettled when their link or connection goes are counted and redelivered;
- ``busy N``: the next N sends to the topic and receiver attaches answer
  ``com.microsoft:server-busy``.

Run as a process (``python tests/support/servicebus_broker.py --port P --topic T --subscription a``,
``--host H`` to listen elsewhere than on 127.0.0.1); it prints ``ready`` when listening and takes
commands on stdin (``busy N``, ``stats``). Tests use :class:`ServiceBusTestBroker`, which starts,
stops and restarts that process on one port.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

CONNECTION_STRING = (
    "Endpoint=sb://{host}:{port};SharedAccessKeyName=test;SharedAccessKey=dGVzdA==;UseDevelopmentEmulator=true"
)
_SERVER_BUSY = "com.microsoft:server-busy"


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServiceBusTestBroker:
    """The broker in a child process on a fixed port (of ``host``, loopback by default); ``stop()`` and
    ``start()`` again restart it on the same port (its subscriptions come back empty, as declared).
    ``launcher`` prefixes its command line (``ip netns exec NS`` runs it on another test host)."""

    def __init__(
        self,
        *,
        topic: str = "billing-triggers",
        subscriptions: list[str] | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        launcher: Sequence[str] = (),
    ) -> None:
        self.topic = topic
        self.subscriptions = list(subscriptions or [])
        self.port = port or free_port()
        self.host = host
        self.launcher = list(launcher)
        self._process: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    @property
    def connection_string(self) -> str:
        """What the SDK's ``from_connection_string`` takes to reach this broker."""
        return CONNECTION_STRING.format(host=self.host, port=self.port)

    def start(self, timeout: float = 10.0) -> None:
        """Start the broker process and wait until it listens."""
        if self._process is not None:
            return
        args = [*self.launcher, sys.executable, os.path.abspath(__file__), "--port", str(self.port)]
        args += ["--host", self.host, "--topic", self.topic]
        for name in self.subscriptions:
            args += ["--subscription", name]
        process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        deadline = time.monotonic() + timeout
        line = process.stdout.readline() if process.stdout else ""
        if line.strip() != "ready" or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise RuntimeError(f"test broker did not start on port {self.port}: {line!r}")
        self._process = process

    def stop(self) -> None:
        """Kill the broker process: every connection drops at once, as in a broker crash."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()
            process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()

    def _command(self, line: str) -> str:
        with self._lock:
            if self._process is None or self._process.stdin is None or self._process.stdout is None:
                raise RuntimeError("test broker is not running")
            self._process.stdin.write(line + "\n")
            self._process.stdin.flush()
            return self._process.stdout.readline().strip()

    def server_busy(self, count: int) -> None:
        """Answer the next ``count`` topic sends and receiver attaches with server-busy."""
        self._command(f"busy {count}")

    def stats(self) -> dict[str, Any]:
        """Counters: ``connections`` and ``links`` opened by clients, ``sends`` (transfers to the topic incl.
        refused), ``busy_answers``,
        ``routed`` messages, ``settled`` by disposition, ``queued`` per subscription, ``tokens``."""
        return dict(json.loads(self._command("stats")))

    def __enter__(self) -> ServiceBusTestBroker:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------
# The broker itself (runs in the child process; proton is imported only there).


@dataclass
class _Stored:
    payload: bytes
    sequence_number: int
    enqueued_ms: int
    delivery_count: int = 0


@dataclass
class _Subscription:
    name: str
    queue: collections.deque[_Stored] = field(default_factory=collections.deque)
    receivers: list[Any] = field(default_factory=list)
    turn: int = 0


def _entity(address: str | None) -> str:
    """``amqp://host:port/a/b`` or ``a/b`` → ``a/b``."""
    if not address:
        return ""
    if "://" in address:
        rest = address.split("://", 1)[1]
        address = rest.split("/", 1)[1] if "/" in rest else ""
    return address.strip("/")


def _unbatch(payload: bytes) -> list[bytes]:
    """The encoded messages in a transfer: a batch's data sections, or the payload itself.

    Proton does not expose the transfer's message-format, so a batch is recognised by its shape:
    every data section decodes completely as a sequence of message sections.
    """
    sections = _sections(payload)
    inner = [value for code, value in sections if code == 0x75]
    if inner and all(_sections(item, strict=True) for item in inner):
        return inner
    return [payload]


def _sections(payload: bytes, strict: bool = False) -> list[tuple[int, Any]]:
    """Decode a bare message into (descriptor code, value) pairs; ``[]`` when it is no message."""
    from proton import Data

    out: list[tuple[int, Any]] = []
    rest = memoryview(payload)
    while rest:
        data = Data()
        try:
            used = data.decode(bytes(rest))
        except Exception:
            return []
        data.rewind()
        if used <= 0 or not data.next() or data.type() != Data.DESCRIBED:
            return []
        data.enter()
        data.next()
        code = data.get_object()
        data.next()
        value = data.get_object()
        if isinstance(value, memoryview):  # a view into the decoder's buffer: copy it out
            value = bytes(value)
        data.exit()
        if not isinstance(code, int) or not 0x70 <= code <= 0x78:
            return []
        out.append((int(code), value))
        rest = rest[used:]
    return out if out or not strict else []


def _error_info() -> dict[Any, Any]:
    from proton import symbol

    return {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())}


def _make_handler(topic: str, subscriptions: list[str]) -> Any:
    from proton import Condition, Delivery, Link, Message, symbol, timestamp
    from proton.handlers import Handshaker
    from proton.reactor import Handler

    class Broker(Handler):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.handlers = [Handshaker()]
            self.topic = topic
            self.subs = {name: _Subscription(name) for name in subscriptions}
            self.busy = 0
            self.counters: collections.Counter[str] = collections.Counter()
            self.sequence = itertools.count(1)
            self.inflight: dict[bytes, tuple[_Subscription, _Stored]] = {}
            self.cbs_replies: dict[int, Any] = {}  # connection id -> its $cbs reply link
            self.conn_ids = itertools.count(1)

        # -- connections --------------------------------------------------------------------
        def on_connection_bound(self, event: Any) -> None:
            sasl = event.transport.sasl()
            sasl.allowed_mechs("ANONYMOUS PLAIN")
            event.connection.broker_id = next(self.conn_ids)
            self.counters["connections"] += 1

        def on_transport_closed(self, event: Any) -> None:
            conn = event.connection
            if conn is None:
                return
            cid = getattr(conn, "broker_id", None)
            self.cbs_replies.pop(cid, None)
            for sub in self.subs.values():
                for link in [rx for rx in sub.receivers if rx.broker_conn == cid]:
                    self._drop_receiver(sub, link)

        # -- links ---------------------------------------------------------------------------
        def on_link_remote_open(self, event: Any) -> None:
            link = event.link
            self.counters["links"] += 1
            link.source.copy(link.remote_source)
            link.target.copy(link.remote_target)
            link.snd_settle_mode = link.remote_snd_settle_mode
            link.rcv_settle_mode = link.remote_rcv_settle_mode
            link.broker_conn = getattr(link.connection, "broker_id", None)
            if link.is_sender:  # the client receives from source
                self._open_outgoing(link, _entity(link.remote_source.address))
            else:  # the client sends to target
                self._open_incoming(link, _entity(link.remote_target.address))

        def _refuse(self, link: Any, condition: str, description: str) -> None:
            link.open()
            link.condition = Condition(condition, description, _error_info())
            link.close()

        def _open_outgoing(self, link: Any, address: str) -> None:
            if address == "$cbs":
                self.cbs_replies[link.broker_conn] = link
                link.open()
                return
            if address.endswith("$management"):
                self._refuse(link, "amqp:not-implemented", "no $management in the test broker")
                return
            parts = address.split("/")
            if len(parts) != 3 or parts[0] != self.topic or parts[1].lower() != "subscriptions":
                self._refuse(link, "amqp:not-found", f"no entity {address!r} here")
                return
            if self.busy > 0:
                self.busy -= 1
                self.counters["busy_answers"] += 1
                self._refuse(link, _SERVER_BUSY, "test broker is busy")
                return
            sub = self.subs.setdefault(parts[2], _Subscription(parts[2]))
            link.broker_sub = sub.name
            link.open()
            sub.receivers.append(link)
            self._pump(sub)

        def _open_incoming(self, link: Any, address: str) -> None:
            if address.endswith("$management"):  # settlement by lock token, peek, renew...
                self._refuse(link, "amqp:not-implemented", "no $management in the test broker")
                return
            if address not in ("$cbs", self.topic):
                self._refuse(link, "amqp:not-found", f"no entity {address!r} here")
                return
            link.broker_address = address
            link.open()
            link.flow(100)

        def on_link_remote_close(self, event: Any) -> None:
            link = event.link
            name = getattr(link, "broker_sub", None)
            if name in self.subs:
                self._drop_receiver(self.subs[name], link)
            conn = getattr(link, "broker_conn", None)
            if self.cbs_replies.get(conn) is link:
                del self.cbs_replies[conn]

        def _drop_receiver(self, sub: _Subscription, link: Any) -> None:
            if link in sub.receivers:
                sub.receivers.remove(link)
            tags = getattr(link, "broker_tags", set())
            lost = [tag for tag, (s, _) in self.inflight.items() if s is sub and tag in tags]
            for tag in lost:  # the lock is lost with the link: the delivery counts
                _, stored = self.inflight.pop(tag)
                stored.delivery_count += 1
                sub.queue.appendleft(stored)
            self._pump(sub)

        def on_link_flow(self, event: Any) -> None:
            name = getattr(event.link, "broker_sub", None)
            if event.link.is_sender and name in self.subs:
                self._pump(self.subs[name])

        # -- deliveries ----------------------------------------------------------------------
        def on_delivery(self, event: Any) -> None:
            dlv = event.delivery
            link = dlv.link
            if link.is_receiver:
                if dlv.partial or not dlv.readable:
                    return
                payload = link.recv(dlv.pending)
                link.advance()
                address = getattr(link, "broker_address", None)
                if address == "$cbs":
                    self._answer_cbs(link, payload, dlv)
                elif address == self.topic:
                    self._accept_send(payload, dlv)
                else:  # a transfer that raced the refusal of its link
                    dlv.update(Delivery.REJECTED)
                    dlv.settle()
                link.flow(1)
            elif dlv.updated and not dlv.settled:
                self._settle(dlv)

        def _answer_cbs(self, link: Any, payload: bytes, dlv: Any) -> None:
            request = Message()
            request.decode(payload)
            self.counters["tokens"] += 1
            reply_link = self.cbs_replies.get(link.broker_conn)
            if reply_link is not None:
                reply = Message(
                    address=request.reply_to,
                    correlation_id=request.id,
                    properties={"status-code": 202, "status-description": "Accepted"},
                )
                reply_link.delivery(uuid.uuid4().bytes)
                reply_link.send(reply.encode())
                reply_link.advance()
            dlv.update(Delivery.ACCEPTED)
            dlv.settle()

        def _accept_send(self, payload: bytes, dlv: Any) -> None:
            self.counters["sends"] += 1
            if self.busy > 0:
                self.busy -= 1
                self.counters["busy_answers"] += 1
                # The SDK reads error[2] (info) unguarded: a missing info field makes it hang.
                dlv.local.condition = Condition(_SERVER_BUSY, "test broker is busy", _error_info())
                dlv.update(Delivery.REJECTED)
                dlv.settle()
                return
            for message in _unbatch(payload):
                self.counters["routed"] += 1
                number, now = next(self.sequence), int(time.time() * 1000)  # one per topic message
                for sub in self.subs.values():
                    sub.queue.append(_Stored(message, number, now))
            dlv.update(Delivery.ACCEPTED)
            dlv.settle()
            for sub in self.subs.values():
                self._pump(sub)

        def _pump(self, sub: _Subscription) -> None:
            while sub.queue:
                ready = [rx for rx in sub.receivers if rx.credit > 0 and rx.state & Link.LOCAL_ACTIVE]
                if not ready:
                    return
                link = ready[sub.turn % len(ready)]
                sub.turn += 1
                self._deliver(link, sub, sub.queue.popleft())

        def _deliver(self, link: Any, sub: _Subscription, stored: _Stored) -> None:
            message = Message()
            message.decode(stored.payload)
            annotations = dict(message.annotations or {})
            annotations[symbol("x-opt-sequence-number")] = stored.sequence_number
            annotations[symbol("x-opt-enqueued-time")] = timestamp(stored.enqueued_ms)
            annotations[symbol("x-opt-locked-until")] = timestamp(int(time.time() * 1000) + 60_000)
            message.annotations = annotations
            message.delivery_count = stored.delivery_count
            message.first_acquirer = stored.delivery_count == 0
            tag = uuid.uuid4().bytes  # 16 bytes: the SDK reads the lock token from the tag
            dlv = link.delivery(tag)
            dlv.broker_tag = tag  # proton returns tags as UTF-8 text and fails on these bytes
            link.send(message.encode())
            link.advance()
            if link.snd_settle_mode == Link.SND_SETTLED:  # RECEIVE_AND_DELETE
                dlv.settle()
                return
            if not hasattr(link, "broker_tags"):
                link.broker_tags = set()
            link.broker_tags.add(tag)
            self.inflight[tag] = (sub, stored)

        def _settle(self, dlv: Any) -> None:
            state = dlv.remote_state
            tag = getattr(dlv, "broker_tag", None)
            entry = self.inflight.pop(tag, None) if tag else None
            if entry is not None:
                sub, stored = entry
                dlv.link.broker_tags.discard(tag)
                if state == Delivery.RELEASED:
                    sub.queue.appendleft(stored)
                elif state == Delivery.MODIFIED:
                    if dlv.remote.failed:
                        stored.delivery_count += 1
                    sub.queue.appendleft(stored)
                self.counters[f"settled_{getattr(state, 'name', state)}".lower()] += 1
            dlv.update(state)  # echo the outcome the client chose, settled
            dlv.settle()
            if entry is not None:
                self._pump(entry[0])

        def stats(self) -> dict[str, Any]:
            return {
                **self.counters,
                "queued": {n: len(s.queue) for n, s in self.subs.items()},
                "receivers": {n: len(s.receivers) for n, s in self.subs.items()},
            }

    return Broker()


def _serve(host: str, port: int, topic: str, subscriptions: list[str]) -> None:
    from proton.reactor import Container

    handler = _make_handler(topic, subscriptions)
    container = Container(handler)
    container.container_id = "servicebus-test-broker"
    container.listen(f"{host}:{port}")

    def commands() -> None:
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["busy"]:
                handler.busy = int(words[1])
                print("ok", flush=True)
            elif words[:1] == ["stats"]:
                print(json.dumps(handler.stats()), flush=True)
            else:
                print("error", flush=True)
        os._exit(0)  # the parent went away

    threading.Thread(target=commands, daemon=True).start()
    print("ready", flush=True)
    container.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--topic", default="billing-triggers")
    parser.add_argument("--subscription", action="append", default=[])
    args = parser.parse_args()
    _serve(args.host, args.port, args.topic, args.subscription)


if __name__ == "__main__":
    main()
