"""An OTLP/HTTP receiver on 127.0.0.1 for tests: what an OpenTelemetry Collector's ``otlphttp``
receiver accepts (``POST /v1/traces``, ``/v1/metrics`` and ``/v1/logs``, protobuf, gzip or not),
decoded with ``opentelemetry-proto``, the OpenTelemetry project's own generated wire classes. It keeps
the spans it got and the latest value of every sum; the roles and the client export to it through
their real SDK exporters, given ``OTEL_EXPORTER_OTLP_ENDPOINT``."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

#: What each path decodes and answers.
SIGNALS: dict[str, tuple[type[Message], type[Message]]] = {
    "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
    "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
    "/v1/logs": (ExportLogsServiceRequest, ExportLogsServiceResponse),
}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str  # 32 hex digits
    span_id: str
    parent_span_id: str  # "" for a root
    kind: int
    attributes: dict[str, Any]
    status_code: int


class OtlpReceiver:
    """Receives OTLP/HTTP on a free loopback port; :attr:`endpoint` is what
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` should name. Thread-safe readers."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        #: (service instance, metric name, sorted attributes) → latest value of that sum's point.
        self.sums: dict[tuple[str, str, tuple[tuple[str, Any], ...]], int | float] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"

    @contextmanager
    def serving(self) -> Iterator[OtlpReceiver]:
        thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join()

    def traces(self) -> dict[str, list[ReceivedSpan]]:
        """The spans received so far, by trace id."""
        by_trace: dict[str, list[ReceivedSpan]] = {}
        with self._lock:
            for span in self.spans:
                by_trace.setdefault(span.trace_id, []).append(span)
        return by_trace

    def total(self, metric: str, **attributes: Any) -> int | float:
        """The latest value of sum ``metric``, added up over the processes that report it and over
        the points whose attributes include ``attributes``."""
        with self._lock:
            return sum(
                value
                for (_, name, labels), value in self.sums.items()
                if name == metric and attributes.items() <= dict(labels).items()
            )

    def _received(self, request: Any) -> None:
        with self._lock:
            if isinstance(request, ExportTraceServiceRequest):
                for resource_spans in request.resource_spans:
                    service = _attributes(resource_spans.resource)["service.name"]
                    for scope in resource_spans.scope_spans:
                        self.spans.extend(_span(service, span) for span in scope.spans)
            elif isinstance(request, ExportMetricsServiceRequest):
                for resource_metrics in request.resource_metrics:
                    instance = _attributes(resource_metrics.resource)["service.instance.id"]
                    for scope in resource_metrics.scope_metrics:
                        for metric in scope.metrics:
                            if metric.WhichOneof("data") != "sum":
                                continue
                            for point in metric.sum.data_points:
                                labels = tuple(sorted(_values(point.attributes).items()))
                                value = point.as_int if point.WhichOneof("value") == "as_int" else point.as_double
                                self.sums[(instance, metric.name, labels)] = value

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path not in SIGNALS:
                    self.send_error(404)
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request_type, response_type = SIGNALS[self.path]
                request = request_type()
                request.ParseFromString(body)
                receiver._received(request)
                answer = response_type().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def _values(attributes: Any) -> dict[str, Any]:
    return {attribute.key: _value(attribute.value) for attribute in attributes}


def _attributes(resource: Resource) -> dict[str, Any]:
    return _values(resource.attributes)


def _span(service: str, span: Any) -> ReceivedSpan:
    return ReceivedSpan(
        service=service,
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        kind=span.kind,
        attributes=_values(span.attributes),
        status_code=span.status.code,
    )
