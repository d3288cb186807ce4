"""OpenTelemetry across processes: the three roles as real processes and ``billing submit`` export
through their real SDK exporters (OTLP over HTTP, protobuf) to a receiver this test runs on
127.0.0.1 (``support/otlp.py``: it stands in for an OpenTelemetry Collector at the wire, decoding the
requests with ``opentelemetry-proto``, the OpenTelemetry project's own OTLP classes). One batch is one
trace from the client's root span through every role; its spans and counters say what ``billing
status`` says; with nothing configured no exporter, nor the SDK, is even imported."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.proto.trace.v1.trace_pb2 import Status
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from billing.sample import generate, sample_price_book_bytes
from shared import telemetry
from shared.messaging.envelope import ClaimCheck, Envelope, content_hash
from shared.messaging.storage import Storage
from shared.refstore import PRICEBOOK
from shared.settings import Settings
from support.exact import billing_process
from support.netns import NamespaceRefused, loopback_only
from support.otlp import OtlpReceiver, ReceivedSpan
from support.references import sample_flags
from support.roles import Roles

ROWS = 6_000
#: Long enough that nothing is exported on a schedule during the test: what arrives was flushed as
#: each process stopped (the client at its exit, the roles at SIGTERM).
NEVER_MS = "600000"


@pytest.fixture
def receiver(settings_env: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """An OTLP receiver every process of the test exports to; small work items on two partitions."""
    monkeypatch.setenv("BILLING_WORK_ITEM_SIZE", "500")
    monkeypatch.setenv("BILLING_PARTITIONS", "2")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", NEVER_MS)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", NEVER_MS)
    with OtlpReceiver().serving() as receiving:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiving.endpoint)
        yield receiving


def batch_trace(receiver: OtlpReceiver, batch_id: str) -> list[ReceivedSpan]:
    """The one trace of every span about ``batch_id``: spans from the client and all three roles,
    one tree rooted at the client's ``billing submit``."""
    (trace_id,) = {span.trace_id for span in receiver.spans if span.attributes.get(telemetry.BATCH_ID) == batch_id}
    spans = receiver.traces()[trace_id]
    assert {span.service for span in spans} == {"client", "initiator", "processor", "controller"}
    (root,) = [span for span in spans if not span.parent_span_id]
    assert (root.service, root.name) == ("client", "billing submit")
    ids = {span.span_id for span in spans}
    assert all(span.parent_span_id in ids for span in spans if span is not root), "a tree: no orphan"
    return spans


def test_a_batch_is_one_trace_across_the_roles_and_its_counts_match_status(
    settings_env: Settings, roles: Roles, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    settings = Settings()
    path = tmp_path / "batch.csv"
    generate(ROWS, path, seed=29, reject_rate=0.02)
    with roles.running(settings):
        assert roles.wait_up()
        billing_process("submit", str(path), "--batch-id", "traced", "--wait", *sample_flags(tmp_path / "ref"))
        assert {span.service for span in receiver.spans} == {"client"}, "the client flushed as it exited"
    assert roles.returncodes == [0, 0, 0]
    status = json.loads(billing_process("status", "traced", "--json").stdout)
    assert status["state"] == "complete" and status["work_items"] > 5

    spans = batch_trace(receiver, "traced")
    trace_id = spans[0].trace_id
    names = Counter(span.name for span in spans)
    work_items = status["work_items"]
    assert names == {
        "billing submit": 1,
        "debatch": 1,
        "send work item": work_items,
        "rate work item": work_items,
        "apply work item": work_items,
        "apply manifest": 1,
        "batch complete": 1,
    }
    by_id = {span.span_id: span for span in spans}
    for span in spans:  # each work item's chain: sent by the debatch, rated, applied
        parent = by_id.get(span.parent_span_id)
        if span.name == "apply work item":
            assert parent is not None and parent.name == "rate work item"
            assert parent.attributes[telemetry.WORK_ITEM_ID] == span.attributes[telemetry.WORK_ITEM_ID]
        if span.name == "rate work item":
            assert parent is not None and parent.name == "send work item" and parent.service == "initiator"
    applied = [span for span in spans if span.name == "apply work item"]
    assert len({span.attributes[telemetry.WORK_ITEM_ID] for span in applied}) == work_items
    assert sum(span.attributes[telemetry.ROWS] for span in applied) == status["rows"]
    applies = [span for span in spans if span.name.startswith("apply ")]
    assert sum(span.attributes[telemetry.REQUESTS] for span in applies) == status["requests"]
    (complete,) = [span for span in spans if span.name == "batch complete"]
    assert {field: complete.attributes[f"billing.{field}"] for field in telemetry.BATCH_FIELDS} == {
        field: status[field] for field in telemetry.BATCH_FIELDS
    }

    # Metrics: the settled batch's figures as `billing status` shows them; the roles' own counters.
    for field in telemetry.BATCH_FIELDS:
        assert receiver.total(f"billing.batch.{field}") == status[field], field
    assert receiver.total("billing.batches", state="complete") == 1
    assert sum(receiver.total("billing.messages.processed", queue=q) for q in settings.input_queues) == work_items
    assert receiver.total("billing.messages.poisoned") == 0
    states = [json.loads(p.read_text()) for p in (settings.home / "state").glob("*-*.json")]
    requests = Counter[str]()
    for state in states:  # what each role reported last, as `billing status --json` shows live roles
        requests.update({kind: n for kind, n in state["requests"].items() if kind != "total"})
    assert {kind: receiver.total("billing.storage.requests", kind=kind) for kind in requests} == requests

    # Logs: lines about the batch name its trace.
    assert f"trace_id={trace_id}" in roles.logs()["initiator-0.log"]
    assert f"trace_id={trace_id}" in roles.logs()["controller-2.log"]


def test_poisoned_work_items_and_their_failed_batch_show_in_its_trace_and_counters(
    settings_env: Settings, roles: Roles, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """The price book a batch's work items name is gone when they are rated (the roles run one after
    the other, ``--burst``): every work item is poisoned and the batch fails, all in its trace."""
    settings = Settings()
    path = tmp_path / "batch.csv"
    generate(1_500, path, seed=31)
    billing_process("submit", str(path), "--batch-id", "doomed", *sample_flags(tmp_path / "ref"))
    roles.burst("initiator")
    asyncio.run(_drop_sample_price_book(settings))
    roles.burst("processor")
    roles.burst("controller")
    status = json.loads(billing_process("status", "doomed", "--json").stdout)
    work_items = status["work_items"]
    assert (status["state"], status["poisoned_items"]) == ("failed", work_items)

    spans = batch_trace(receiver, "doomed")
    names = Counter(span.name for span in spans)
    assert names["poison message"] == names["apply poison notice"] == work_items
    assert "rate work item" not in names
    failed = [span for span in spans if span.status_code == Status.STATUS_CODE_ERROR]
    assert Counter(span.name for span in failed) == {"poison message": work_items, "batch failed": 1}
    reasons = [span.attributes["billing.poison.reason"] for span in failed if span.name == "poison message"]
    assert all(reason.startswith("unknown_reference_data") for reason in reasons)
    assert receiver.total("billing.batches", state="failed") == 1
    assert receiver.total("billing.batch.poisoned_items") == work_items
    assert sum(receiver.total("billing.messages.poisoned", queue=q) for q in settings.input_queues) == work_items


async def _drop_sample_price_book(settings: Settings) -> None:
    async with Storage(settings) as storage:
        name = f"{PRICEBOOK}/{content_hash(sample_price_book_bytes())}.csv"
        await storage.container(settings.reference_container).delete_blob(name)


@pytest.mark.parametrize(
    "configured", [{}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"}]
)
def test_off_unless_configured_nothing_beyond_the_api_is_imported(configured: dict[str, str]) -> None:
    """A role process's imports and start-up with no exporter configured (or the SDK disabled): no
    exporter is created, nor the SDK imported; spans are the API's no-op ones."""
    check = """
import sys
from opentelemetry import trace
from opentelemetry.proto.trace.v1.trace_pb2 import Status
import billing.cli, controller.service, initiator.service, processor.service
from shared import telemetry
with telemetry.running("initiator") as on:
    assert not on and not telemetry.enabled()
    assert type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider"
    with telemetry.TRACER.start_as_current_span("nothing") as span:
        assert not span.is_recording()
loaded = [m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter", "azure.monitor"))]
assert not loaded, loaded
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "APPLICATIONINSIGHTS_"))}
    done = subprocess.run(
        [sys.executable, "-c", check], env={**env, **configured}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


async def test_envelopes_carry_the_trace_context_and_older_ones_still_decode(
    settings_env: Settings, storage: Storage
) -> None:
    claim_check = ClaimCheck(storage, container=settings_env.work_container, limit=64 * 1024)
    context = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False, TraceFlags(1))
    with trace.use_span(NonRecordingSpan(context)):
        text = await claim_check.pack(Envelope("work", {"a": 1}, b"payload"), queue="q", blob_name="unused")
    carried = json.loads(text)["trace"]
    assert carried == {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    envelope = await claim_check.unpack(text)
    assert trace.get_current_span(telemetry.context_of(envelope.trace)).get_span_context().trace_id == context.trace_id
    assert "trace" not in json.loads(await claim_check.pack(Envelope("work"), queue="q", blob_name="unused"))
    older = json.loads(text)
    del older["trace"]
    assert (await claim_check.unpack(json.dumps(older))).trace == {}


#: Exports one span and the settled-batch counters, then prints the span's trace id.
AZURE_CLIENT = """
from opentelemetry import trace
from opentelemetry.proto.trace.v1.trace_pb2 import Status
from shared import telemetry
with telemetry.running("client") as on:
    assert on
    with telemetry.TRACER.start_as_current_span("billing submit", attributes={telemetry.BATCH_ID: "azure"}) as span:
        telemetry.BatchCounters().settled({"state": "complete", **{field: 7 for field in telemetry.BATCH_FIELDS}})
    print(format(span.get_span_context().trace_id, "032x"))
"""


def test_azure_monitor_receives_the_trace_and_counters_when_a_connection_string_is_set() -> None:
    """Application Insights' ingestion endpoint is stood in for at the wire by a loopback server that
    answers ``POST /v2.1/track`` as the service does; Microsoft's exporter, imported because the
    connection string names it, sends there. The exporting process runs in a network namespace with
    only loopback, so its other calls (control plane, statsbeat: switched off by their variables as
    well) cannot leave the machine whatever they try."""
    pytest.importorskip("azure.monitor.opentelemetry.exporter", reason="the [azure-monitor] extra")
    received: list[dict[str, Any]] = []

    class Ingestion(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            items = json.loads(body)
            received.extend(items)
            answer = json.dumps({"itemsReceived": len(items), "itemsAccepted": len(items), "errors": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    with ExitStack() as stack:
        try:
            stack.enter_context(loopback_only())
        except NamespaceRefused as exc:
            if os.environ.get("CI"):
                pytest.fail(f"{exc} (needed to keep the exporter on loopback)")
            pytest.skip(str(exc))
        server = ThreadingHTTPServer(("127.0.0.1", 0), Ingestion)
        stack.callback(server.server_close)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        stack.callback(server.shutdown)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "APPLICATIONINSIGHTS_"))}
        env |= {
            "APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=00000000-0000-0000-0000-000000000001;"
            f"IngestionEndpoint=http://127.0.0.1:{server.server_port}/",
            "APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL": "true",
            "APPLICATIONINSIGHTS_SDKSTATS_DISABLED": "true",
            "APPLICATIONINSIGHTS_CONTROLPLANE_DISABLED": "true",
        }
        done = subprocess.run(
            [sys.executable, "-c", AZURE_CLIENT], env=env, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr
    trace_id = done.stdout.split()[-1]
    (span,) = [item for item in received if item["data"]["baseData"].get("name") == "billing submit"]
    assert span["tags"]["ai.operation.id"] == trace_id
    assert span["tags"]["ai.cloud.role"] == "billing.client"
    assert span["data"]["baseData"]["properties"][telemetry.BATCH_ID] == "azure"
    metrics = {
        metric["name"]: metric["value"]
        for item in received
        if item["data"]["baseType"] == "MetricData"
        for metric in item["data"]["baseData"]["metrics"]
    }
    assert metrics["billing.batches"] == 1 and metrics["billing.batch.requests"] == 7
