"""An OTLP/HTTP receiver on 127.0.0.1 for the tests: what a collector is to the service's exporters.

It speaks the protocol the exporters speak (``POST /v1/traces`` and ``/v1/metrics`` with the protobuf
``Export*ServiceRequest`` bodies, optionally gzipped), keeps everything in memory, and lets a test wait on what
has arrived (``wait_for``) instead of on the exporters' schedule.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

T = TypeVar("T")
MAX_BODY_BYTES = 16 * 1024 * 1024


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    events: tuple[str, ...]
    resource: dict[str, Any]


@dataclass
class Receiver:
    url: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    # (instance, metric, sorted attributes) -> the newest cumulative value a sum or gauge reported (a histogram: its
    # count, as "<metric>.count")
    points: dict[tuple[str, str, tuple[tuple[str, Any], ...]], float] = field(default_factory=dict)
    bodies: list[bytes] = field(default_factory=list)  # every export as received, for scans
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)  # instance -> its resource
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def take_traces(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        with self._changed:
            self.bodies.append(body)
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(ReceivedSpan(
                            span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(), span.name, span.kind,
                            _attributes(span.attributes), tuple(event.name for event in span.events), resource,
                        ))
            self._changed.notify_all()

    def take_metrics(self, body: bytes) -> None:
        request = ExportMetricsServiceRequest.FromString(body)
        with self._changed:
            self.bodies.append(body)
            for resource_metrics in request.resource_metrics:
                resource = _attributes(resource_metrics.resource.attributes)
                instance = str(resource.get("service.instance.id"))
                self.resources[instance] = resource
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        kind = metric.WhichOneof("data")
                        if kind == "histogram":  # kept as its count of recordings, under "<name>.count"
                            for point in metric.histogram.data_points:
                                key = (instance, f"{metric.name}.count",
                                       tuple(sorted(_attributes(point.attributes).items())))
                                self.points[key] = point.count
                            continue
                        if kind not in ("sum", "gauge"):
                            continue
                        for point in getattr(metric, kind).data_points:
                            value = point.as_int if point.WhichOneof("value") == "as_int" else point.as_double
                            key = (instance, metric.name, tuple(sorted(_attributes(point.attributes).items())))
                            self.points[key] = value
            self._changed.notify_all()

    def wait_for(self, what: str, found: Callable[[], T | None], timeout_s: float) -> T:
        """``found()`` once it is truthy, re-checked at each export received; fails after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                result = found()
                if result:
                    return result
                left = deadline - time.monotonic()
                assert left > 0, f"never received: {what}; received: {self.summary()}"
                self._changed.wait(left)

    def summary(self) -> dict[str, int]:
        """How many spans of each role and name arrived (what a failed wait shows)."""
        counts: dict[str, int] = {}
        for span in self.spans:
            key = f"{span.resource.get('specialists.role')}:{span.name}"
            counts[key] = counts.get(key, 0) + 1
        return counts

    def total(self, metric: str, **attributes: Any) -> float:
        """The sum over every instance of ``metric``'s newest values whose attributes include ``attributes``."""
        with self._changed:
            return sum(value for (_, name, attrs), value in self.points.items()
                       if name == metric and attributes.items() <= dict(attrs).items())

    def per_instance(self, metric: str, **attributes: Any) -> dict[str, float]:
        with self._changed:
            totals: dict[str, float] = {}
            for (instance, name, attrs), value in self.points.items():
                if name == metric and attributes.items() <= dict(attrs).items():
                    totals[instance] = totals.get(instance, 0) + value
            return totals

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._changed:
            return [span for span in self.spans if span.trace_id == trace_id]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    takers = {"/v1/traces": (receiver.take_traces, ExportTraceServiceResponse),
              "/v1/metrics": (receiver.take_metrics, ExportMetricsServiceResponse)}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            taker = takers.get(self.path)
            length = int(self.headers.get("content-length") or 0)
            if taker is None or self.headers.get("content-type") != "application/x-protobuf" or length > MAX_BODY_BYTES:
                self.send_error(400)
                return
            body = self.rfile.read(length)
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            taker[0](body)
            answer = taker[1]().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_: Any) -> None:
            return None

    return Handler


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver := Receiver(url="")))
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


def telemetry_env(receiver: Receiver, **extra: str) -> dict[str, str]:
    """The settings that point a process's exporters at ``receiver``, recording every trace and exporting soon
    after each span ends."""
    return {"SPECIALISTS_OTEL_ENABLED": "true", "SPECIALISTS_OTEL_ENDPOINT": receiver.url,
            "SPECIALISTS_OTEL_SAMPLING_RATIO": "1", "SPECIALISTS_OTEL_EXPORT_DELAY_S": "0.2",
            "SPECIALISTS_OTEL_METRICS_INTERVAL_S": "1", **extra}

