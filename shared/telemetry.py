"""OpenTelemetry for every process: one trace per batch, the pipeline's counters, ids in log lines.

Off unless configured. :func:`running` installs the SDK only when an exporter is named by the standard
variables: OTLP over HTTP/protobuf with ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the per-signal
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``…_METRICS_ENDPOINT``; headers, timeouts and the rest of the
``OTEL_EXPORTER_OTLP_*`` and ``OTEL_BSP_*`` / ``OTEL_METRIC_EXPORT_*`` variables as the SDK reads them),
and Azure Monitor with ``APPLICATIONINSIGHTS_CONNECTION_STRING`` (the ``[azure-monitor]`` extra, imported
only then; with ``APPLICATIONINSIGHTS_AUTHENTICATION_STRING=Authorization=AAD`` it authenticates with an Entra
token, :func:`azure_monitor_auth`). ``OTEL_SDK_DISABLED=true`` turns both off. Otherwise nothing past the
OpenTelemetry API is imported: :data:`TRACER` and :data:`METER` are the API's no-op ones (a span costs
microseconds, and no span is made per row, only per message or work item).

The trace context travels in every message envelope (W3C ``traceparent``, through the propagator API,
see :func:`carrier` and :func:`context_of`), so a batch is one trace::

    billing submit ─► debatch ─┬► send work item ─► rate work item ─► apply work item [─► batch complete]
                               └► apply manifest

A message that fans in (a processor rates the work items of one dequeue together, a results message
carries several of them, the controller applies a dequeue in one SQL transaction) gets one child span
per work item, each in its own batch's trace, rather than one span with links: Jaeger and Application
Insights draw a batch's trace as one tree, while a linked span would sit in a trace of its own.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind, StatusCode

from .logs import redact

TRACER = trace.get_tracer("billing")
METER = metrics.get_meter("billing")

#: Span attributes: what a span is about.
BATCH_ID = "billing.batch.id"
WORK_ITEM_ID = "billing.work_item.id"
ROWS = "billing.rows"
#: Storage requests attributed to the work so far (see :mod:`shared.messaging.tally`).
REQUESTS = "billing.requests"

#: A settled batch's figures as ``billing status`` shows them, added to the ``billing.batch.<field>`` counters.
BATCH_FIELDS = (
    "rows",
    "accepted",
    "rejected",
    "work_items",
    "completed_items",
    "poisoned_items",
    "transactions_recorded",
    "requests",
)

_enabled = False


def configured() -> tuple[bool, bool, bool]:
    """Which exporters the environment asks for: (OTLP traces, OTLP metrics, Azure Monitor)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False, False, False
    return _otlp("TRACES"), _otlp("METRICS"), bool(os.environ.get("APPLICATIONINSIGHTS_CONNECTION_STRING"))


def _otlp(signal: str) -> bool:
    """Whether an OTLP endpoint is named for ``signal`` (``TRACES``, ``METRICS``) and not refused."""
    env = os.environ
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    return bool(endpoint) and env.get(f"OTEL_{signal}_EXPORTER") != "none"


def enabled() -> bool:
    """Whether this process exports telemetry (:func:`running` found an exporter configured)."""
    return _enabled


@contextmanager
def running(service: str) -> Iterator[bool]:
    """Export this process's telemetry as ``service`` (its ``service.name``: the cloud role in
    Application Insights) for the block, if configured; yields whether it is. On the way out,
    what is buffered is flushed (a role stopped by SIGTERM exports its last spans and counts)."""
    global _enabled
    traces, measures, azure = configured()
    if not (traces or measures or azure):
        yield False
        return
    tracer_provider, meter_provider = _providers(service, traces=traces, measures=measures, azure=azure)
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    _enabled = True
    try:
        yield True
    finally:
        _enabled = False
        tracer_provider.shutdown()
        meter_provider.shutdown()


def _providers(service: str, *, traces: bool, measures: bool, azure: bool) -> tuple[Any, Any]:
    """The SDK's tracer and meter providers with the exporters asked for (imported only here)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    resource = Resource.create(
        {
            "service.name": service,
            "service.namespace": "billing",
            "service.instance.id": f"{socket.gethostname()}-{os.getpid()}",
        }
    )
    span_exporters: list[SpanExporter] = []
    readers: list[MetricReader] = []
    if traces:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        span_exporters.append(OTLPSpanExporter())
    if measures:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if azure:  # the connection string is read from the environment by the exporters themselves
        from azure.monitor.opentelemetry.exporter import AzureMonitorMetricExporter, AzureMonitorTraceExporter

        auth = azure_monitor_auth()
        span_exporters.append(AzureMonitorTraceExporter(**auth))
        readers.append(PeriodicExportingMetricReader(AzureMonitorMetricExporter(**auth)))
    tracer_provider = TracerProvider(resource=resource)
    for exporter in span_exporters:
        tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    return tracer_provider, MeterProvider(resource=resource, metric_readers=readers)


def azure_monitor_auth() -> dict[str, Any]:
    """The Azure Monitor exporters' keyword arguments for Entra authentication: ``credential``, the
    same chain the roles use for storage (``DefaultAzureCredential``: ``AZURE_TOKEN_CREDENTIALS`` and
    ``AZURE_CLIENT_ID`` pick a managed or workload identity), when
    ``APPLICATIONINSIGHTS_AUTHENTICATION_STRING`` asks for it (``Authorization=AAD``, as Application
    Insights with local authentication off needs); none otherwise (the instrumentation key alone).
    The exporter's own reading of that variable knows only ``ManagedIdentityCredential``, which an
    AKS workload identity is not."""
    pairs = (part.split("=", 1) for part in os.environ.get("APPLICATIONINSIGHTS_AUTHENTICATION_STRING", "").split(";"))
    settings = {key.strip().lower(): value.strip() for key, *rest in pairs for value in rest[:1]}
    if settings.get("authorization", "").upper() != "AAD":
        return {}
    from azure.identity import DefaultAzureCredential

    client_id = settings.get("clientid") or os.environ.get("AZURE_CLIENT_ID")
    return {"credential": DefaultAzureCredential(managed_identity_client_id=client_id)}


@contextmanager
def span(
    name: str,
    context: Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, str | int] | None = None,
) -> Iterator[trace.Span]:
    """A span, current for the block; an error leaving the block marks it failed (:func:`failed`)."""
    with TRACER.start_as_current_span(
        name, context, kind, attributes, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except BaseException as error:
            failed(current, error)
            raise


@contextmanager
def ending(spans: Iterable[trace.Span]) -> Iterator[None]:
    """End ``spans`` (started for work done together) after the block, failed if it raised."""
    try:
        yield
    except BaseException as error:
        for each in spans:
            failed(each, error)
        raise
    finally:
        for each in spans:
            each.end()


def failed(span: trace.Span, error: BaseException) -> None:
    """Mark ``span`` failed by ``error``: its type and message, redacted as log lines are (no
    traceback: spans leave the process)."""
    span.set_status(StatusCode.ERROR, redact(f"{type(error).__name__}: {error}"))


def carrier(span: trace.Span | None = None) -> dict[str, str]:
    """The W3C trace context (``traceparent``, ``tracestate``) of ``span`` (default: the current
    one) for a message to carry; empty when there is no valid span (telemetry off)."""
    headers: dict[str, str] = {}
    propagate.inject(headers, context=None if span is None else trace.set_span_in_context(span))
    return headers


def context_of(headers: Mapping[str, str]) -> Context:
    """The trace context a message carried (:func:`carrier`): the parent of the spans it causes."""
    return propagate.extract(headers)


def observe_role(
    requests: Callable[[], Mapping[str, int]], listeners: Callable[[], Iterable[Mapping[str, Any]]]
) -> None:
    """Report a role's live counters at each metric export (nothing on the hot path):
    ``billing.storage.requests`` by kind, as ``billing status --json`` shows them for the role, and
    per queue ``billing.messages.processed`` and ``billing.messages.poisoned`` from its listeners' states."""

    def by_kind(_: CallbackOptions) -> Iterable[Observation]:
        return [Observation(count, {"kind": kind}) for kind, count in requests().items() if kind != "total"]

    def per_queue(field: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        return lambda _: [Observation(int(state[field]), {"queue": str(state["queue"])}) for state in listeners()]

    METER.create_observable_counter("billing.storage.requests", [by_kind], "{request}", "Storage requests made")
    for field, what in (("processed", "handled and acknowledged"), ("poisoned", "moved to the poison queue")):
        METER.create_observable_counter(
            f"billing.messages.{field}", [per_queue(field)], "{message}", f"Messages {what}"
        )


class BatchCounters:
    """Counters of settled batches (complete or failed), one per :data:`BATCH_FIELDS` as
    ``billing.batch.<field>``, plus ``billing.batches`` by state: summed over batches, the figures
    ``billing status`` shows for each."""

    def __init__(self) -> None:
        self._batches = METER.create_counter("billing.batches", "{batch}", "Batches settled, by state")
        self._fields = {
            name: METER.create_counter(f"billing.batch.{name}", description=f"Settled batches' {name}, summed")
            for name in BATCH_FIELDS
        }

    def settled(self, status: Mapping[str, Any]) -> None:
        """Count one settled batch's figures (a ``billing status --json`` object)."""
        self._batches.add(1, {"state": str(status["state"])})
        for name, counter in self._fields.items():
            counter.add(int(status[name] or 0))
