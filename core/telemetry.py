"""Traces and OpenTelemetry metrics of every process of the service (docs/OPERATIONS.md, "Traces and metrics").

One trace per task: the edge's request span (or the customer's ``traceparent``, when
``SPECIALISTS_OTEL_ACCEPT_TRACEPARENT`` accepts it) is the root; admission writes its span's W3C ``traceparent``
into the task's outbox row (migration 0250); the dispatcher continues it and signs its own span's traceparent into
the job's body (``workers.dispatch.jobs``); the worker continues that, and hands its run span's traceparent to the
job's process, whose specialist steps and model calls are its children. A resumed job is delivered from the same
row, so it continues the same trace.

Off unless ``SPECIALISTS_OTEL_ENABLED``: then :func:`setup` installs nothing, the OpenTelemetry API's no-op tracer and
meter answer every call below (no span is recorded, nothing is exported), :func:`traceparent` is None, and log lines
carry no trace. The instruments are made at import from the API's proxy meter, so they start counting once a
provider is installed, in whichever order the modules were imported.

What is never put in a span, an event or a metric: keys, message content, prompts, model outputs. Attributes are
ids, names, counts, codes and outcomes (``tests/e2e/test_traces.py`` scans a whole task's export and log lines).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from core.settings import TelemetrySettings

log = logging.getLogger(__name__)

# The whole of a version-00 W3C traceparent ("00-<32 hex>-<16 hex>-<2 hex>"): what the outbox row and the signed job
# hold (``taskstate.outbox.MAX_TRACE_PARENT_CHARS`` is this, migration 0250's CHECK the same); anything longer is not one.
TRACEPARENT_CHARS = 55
# The a2a-sdk decorates its handler, queues and dispatchers with spans of its own (scope ``a2a-python-sdk``): a dozen
# per request, none of which says more than the edge's own spans. They are not recorded (``_Unrecorded``).
SDK_SCOPE = "a2a-python-sdk"
# Cloud Logging opens a line's trace from these fields (docs: "Link log entries with traces").
ADMISSION_SPAN = "admission"  # a SendMessage request's span, once it admits (``admission_span``)
LOG_TRACE_FIELD = "logging.googleapis.com/trace"
LOG_SPAN_FIELD = "logging.googleapis.com/spanId"
LOG_SAMPLED_FIELD = "logging.googleapis.com/trace_sampled"

_W3C = TraceContextTextMapPropagator()
tracer = trace.get_tracer("specialists")
meter = metrics.get_meter("specialists")


# --- spans -----------------------------------------------------------------------------------------------------


def traceparent() -> str | None:
    """The current span's W3C traceparent, or None (telemetry off, or no span)."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    value = carrier.get("traceparent")
    return value if value is not None and len(value) <= TRACEPARENT_CHARS else None


def context_of(value: str | None) -> otel_context.Context | None:
    """The context a stored or signed traceparent names; None for none, or for one that does not parse."""
    if not value or len(value) > TRACEPARENT_CHARS:
        return None
    ctx = _W3C.extract({"traceparent": value})
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def current_context() -> otel_context.Context | None:
    """The current context when a span is current in it: what a thread started for the same work continues."""
    return otel_context.get_current() if trace.get_current_span().get_span_context().is_valid else None


@contextmanager
def span(name: str, *, parent: otel_context.Context | None = None, kind: SpanKind = SpanKind.INTERNAL,
         attributes: Mapping[str, Any] | None = None) -> Iterator[Span]:
    """A span made current for the block, a child of ``parent`` when given (a trace continued from another
    process or thread), else of the current span. An exception ends it with an error status and its type only:
    an exception's message may quote what a customer sent."""
    if _installed is None and parent is None:
        # Telemetry off: the API's no-op tracer would make a span of the current span's context and make it current,
        # which changes nothing a caller can see; the current span is given as it is (issue 44: a worker's job
        # opens five spans, and the no-op's context switches cost more than the rest of the span's work).
        yield trace.get_current_span()
        return
    with tracer.start_as_current_span(name, context=parent, kind=kind, attributes=_clean(attributes),
                                      record_exception=False, set_status_on_exception=False) as current:
        try:
            yield current
        except BaseException as exc:
            if current.is_recording():
                current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                current.set_attribute("error.type", type(exc).__name__)
            raise


def admission_span(specialist_id: str, tariff_credits: int) -> Span:
    """The current request's span, named ``admission`` and given the specialist and its tariff: what a SendMessage
    request does is admit (the reservation, the task and the outbox row, in one statement)."""
    current = trace.get_current_span()
    if current.is_recording():
        current.update_name(ADMISSION_SPAN)
        current.set_attributes({"specialists.specialist": specialist_id, "specialists.tariff_credits": tariff_credits})
    return current


def annotate(target: Span, **attributes: Any) -> None:
    """Attributes set on a span once they are known (None values are left out)."""
    if target.is_recording():
        target.set_attributes(_clean(attributes) or {})


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not attributes:
        return None
    return {key: value for key, value in attributes.items() if value is not None}


# --- metrics ---------------------------------------------------------------------------------------------------


class Meters:
    """The service's metrics. Counters are cumulative per process, with the resource naming the process, so a
    backend's sum over instances is the service's total (``/metrics`` keeps each instance's own Prometheus view)."""

    def __init__(self, on: metrics.Meter | None = None) -> None:
        target = on or meter  # another meter than the process's: a test's, to read what the code exports
        self.admissions = target.create_counter(
            "specialists.admissions", unit="{admission}",
            description="SendMessage admissions, by specialist and outcome (admitted, replay, or the refusal's code)")
        self.refusals = target.create_counter(
            "specialists.refusals", unit="{request}", description="Requests refused at the edge, by stable code")
        self.credits_reserved = target.create_counter(
            "specialists.credits.reserved", unit="{credit}", description="Credits held by admissions, by specialist")
        self.credits_settled = target.create_counter(
            "specialists.credits.settled", unit="{credit}",
            description="Credits charged by settlements, by specialist and outcome")
        self.claim_latency = target.create_histogram(
            "specialists.job.claim_latency", unit="s",
            description="From the job's dispatch (its signature) to the worker's claim, by specialist and claim outcome")
        self.job_duration = target.create_histogram(
            "specialists.job.duration", unit="s",
            description="A job's run on a worker, from its claim to its finish, by specialist and outcome")
        self.unknown_outcomes = target.create_counter(
            "specialists.jobs.unknown", unit="{job}",
            description="Jobs whose outcome became unknown (a lease expired while they ran), by specialist")
        self.model_tokens = target.create_counter(
            "specialists.model.tokens", unit="{token}",
            description="Model tokens of hosted runs, by specialist, model and kind (input, output)")
        self.model_cost = target.create_counter(
            "specialists.model.cost", unit="USD", description="Model cost of hosted runs, by specialist and model")
        self.push_attempts = target.create_counter(
            "specialists.push.attempts", unit="{attempt}",
            description="Push notification attempts by what came of them: delivered, retried (another attempt "
            "follows) or failed (final), each recorded by the dispatcher that made it")


meters = Meters()


# The gauges of the service's state: can work run, what waits, what could not be pushed (issue 42). Name -> (unit,
# attributes, description). Their values are ``taskstate.reads.ServiceFacts.points()``, the read `specialists
# health` makes: each dispatcher observes them once per export (``observe_service``), and the edge's ``/metrics``
# reads them at each scrape under ``prometheus_name`` (app/observability.py). infra/monitoring.tf alerts on them.
SERVICE_GAUGES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "specialists.queue.depth": ("{job}", ("specialist",), "Jobs no worker has taken yet, by specialist"),
    "specialists.queue.age": ("s", ("specialist",),
                              "How long the oldest job no worker has taken has waited, by specialist"),
    "specialists.queue.redelivery": ("{job}", ("specialist",),
                                     "Jobs a dispatcher tried to deliver and must deliver again, by specialist"),
    "specialists.workers.live": ("{worker}", ("specialist",),
                                 "Workers serving the specialist whose beat is within "
                                 "SPECIALISTS_HEALTH_WORKER_LIVE_S (0: none can run its jobs), by specialist"),
    "specialists.push.pending": ("{notification}", (), "Push notifications not yet delivered or failed"),
    "specialists.push.retrying": ("{notification}", (), "Of the pending push notifications, those attempted "
                                                        "at least once: waiting for a retry, or in one"),
    "specialists.push.due_age": ("s", (), "How long the oldest push notification due now has waited for an attempt"),
    "specialists.push.failed_recent": ("{notification}", (),
                                       "Push notifications that finally failed within "
                                       "SPECIALISTS_HEALTH_FAILURES_WINDOW_S"),
    "specialists.jobs.unknown_open": ("{job}", (), "Jobs whose outcome is unknown now, holding credits until an "
                                                   "operator reconciles them"),
}
SERVICE_READ_REUSE_S = 1.0  # one export asks every gauge in turn: they share one read made within this


def prometheus_name(name: str, unit: str) -> str:
    """A metric's name as Prometheus (``/metrics``) and Managed Service for Prometheus show it: dots as underscores,
    a unit of seconds as ``_seconds``, a unit in braces (an annotation) dropped, as the OpenTelemetry Collector's
    Prometheus translation does."""
    base = name.replace(".", "_")
    return base + "_seconds" if unit == "s" else base


ServicePoints = list[tuple[str, float, dict[str, str]]]


def observe_service(read: Callable[[], ServicePoints], on: metrics.Meter | None = None) -> None:
    """Register ``SERVICE_GAUGES``, valued from ``read`` ((gauge name, value, attributes) of every point), read once
    per export. Only a dispatcher registers them (``on``: another meter than the process's). A read that fails
    leaves the export without these points, and says so."""
    target = on or meter
    from opentelemetry.metrics import CallbackOptions, Observation

    latest: dict[str, Any] = {"at": None, "points": []}
    lock = threading.Lock()

    def reading() -> ServicePoints:
        with lock:
            now = time.monotonic()
            if latest["at"] is None or now - latest["at"] > SERVICE_READ_REUSE_S:
                try:
                    latest["points"] = read()
                except Exception as exc:  # the export goes on without these points
                    log.warning("the service's state could not be read for its gauges: %s", type(exc).__name__)
                    latest["points"] = []
                latest["at"] = now
            return latest["points"]

    def callback_of(name: str) -> Callable[[CallbackOptions], list[Observation]]:
        def observe(_: CallbackOptions) -> list[Observation]:
            return [Observation(value, attributes) for point, value, attributes in reading() if point == name]
        return observe

    for name, (unit, _, description) in SERVICE_GAUGES.items():
        target.create_observable_gauge(name, [callback_of(name)], unit=unit, description=description)


AFTER_COMMIT = "telemetry_after_commit"
_instrumented: "weakref.WeakSet[Any]" = weakref.WeakSet()


def after_commit(conn: Any, record: Callable[[], None]) -> None:
    """Count ``record`` once the caller's transaction on ``conn`` commits, never for one that rolls back and is
    tried again (``instrument_engine`` runs the list at the commit, and drops it at a rollback)."""
    if conn.engine not in _instrumented:  # telemetry off, or an engine made before it was set up: nothing drains it
        return
    conn.info.setdefault(AFTER_COMMIT, []).append(record)


def _run_after_commit(conn: Any) -> None:
    for record in conn.info.pop(AFTER_COMMIT, ()):
        try:
            record()
        except Exception as exc:  # a metric must never fail a committed transaction's caller
            log.warning("a metric after a commit failed: %s", type(exc).__name__)


def _drop_after_commit(conn: Any) -> None:
    conn.info.pop(AFTER_COMMIT, None)


# --- the providers ---------------------------------------------------------------------------------------------


@dataclass
class Installed:
    tracer_provider: Any
    meter_provider: Any
    settings: "TelemetrySettings"


# What ``setup`` imports when telemetry is on (production's default, infra/): the image writes their bytecode
# (ops/image_bytecode.py), so a process that starts with telemetry on does not compile them in memory.
SDK_MODULES = (
    "opentelemetry.sdk.trace", "opentelemetry.sdk.metrics", "opentelemetry.sdk.resources",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.instrumentation.httpx", "opentelemetry.instrumentation.sqlalchemy",
    "opentelemetry.instrumentation.grpc",
)

_installed: Installed | None = None
_install_lock = threading.Lock()


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specialists")
    except PackageNotFoundError:
        return "unknown"


def setup(settings: "TelemetrySettings", *, role: str) -> Installed | None:
    """Install the providers and exporters of this process, once; None when telemetry is off."""
    global _installed, tracer
    if not settings.enabled:
        return None
    with _install_lock:
        if _installed is not None:
            return _installed
        from opentelemetry.propagate import set_global_textmap
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        class _Provider(TracerProvider):
            def get_tracer(self, instrumenting_module_name: str, *args: Any, **kwargs: Any) -> trace.Tracer:
                if instrumenting_module_name == SDK_SCOPE:
                    return _UNRECORDED
                return super().get_tracer(instrumenting_module_name, *args, **kwargs)

        attributes = {
            "service.name": settings.service_name or f"specialists-{role}",
            "service.version": settings.revision or _package_version(),
            # Unique per process, so no two instances (or a restarted one) ever share a cumulative series.
            "service.instance.id": f"{socket.gethostname()[:60]}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
            "specialists.role": role,
        }
        resource = Resource.create(attributes)
        timeout_s = settings.export_timeout_s
        # No shutdown at exit of their own: ``shutdown`` bounds it (theirs would wait out a silent receiver).
        tracer_provider = _Provider(resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sampling_ratio)),
                                    shutdown_on_exit=False)
        if settings.traces == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            tracer_provider.add_span_processor(BatchSpanProcessor(
                OTLPSpanExporter(endpoint=_signal_url(settings.endpoint, "traces"), timeout=timeout_s),
                schedule_delay_millis=settings.export_delay_s * 1000, export_timeout_millis=timeout_s * 1000,
            ))
        readers = []
        if settings.metrics == "otlp":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            readers.append(PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=_signal_url(settings.endpoint, "metrics"), timeout=timeout_s),
                export_interval_millis=settings.metrics_interval_s * 1000, export_timeout_millis=timeout_s * 1000,
            ))
        meter_provider = MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        # The SDK's own tracer from now on: the proxy's indirection was a measurable share of each span.
        tracer = tracer_provider.get_tracer("specialists")
        # Our trace crosses processes in the outbox row and the signed job, never in a header; a header is read
        # only at the edge, and only when the operator accepts callers' traces.
        set_global_textmap(_W3C if settings.accept_traceparent else _NoPropagation())
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        HTTPXClientInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
        _stamp_log_records(settings.project)
        _installed = Installed(tracer_provider, meter_provider, settings)
        return _installed


class _Unrecorded(trace.NoOpTracer):
    """The a2a-sdk's own spans: none recorded, and, unlike the API's no-op tracer (which makes a non-recording
    copy of the current span current), nothing made current: the request's span stays the current span inside the
    SDK's handlers, where admission names it (``admission_span``), and what the SDK sets on its span (a status,
    an exception with its message) goes nowhere."""

    @contextmanager
    def start_as_current_span(self, name: str, context: otel_context.Context | None = None, *args: Any,
                              **kwargs: Any) -> Iterator[Span]:
        yield trace.INVALID_SPAN


_UNRECORDED = _Unrecorded()


class _NoPropagation(TextMapPropagator):
    """Headers neither continue a trace nor carry ours: each request starts a trace of its own."""

    def extract(self, carrier: Any, context: otel_context.Context | None = None, getter: Any = None
                ) -> otel_context.Context:
        return context if context is not None else otel_context.Context()

    def inject(self, carrier: Any, context: otel_context.Context | None = None, setter: Any = None) -> None:
        return None

    @property
    def fields(self) -> set[str]:
        return set()


def shutdown() -> None:
    """Export what is pending and stop the exporters (a process's end: its last spans and its last counts), within
    ``SPECIALISTS_OTEL_SHUTDOWN_S``: a receiver that is down or slow costs the process's last telemetry, never
    its stop."""
    global _installed
    with _install_lock:
        done, _installed = _installed, None
    if done is None:
        return

    def export_the_rest() -> None:
        for provider in (done.tracer_provider, done.meter_provider):
            try:
                provider.shutdown()
            except Exception as exc:
                log.warning("telemetry could not be exported at shutdown: %s", type(exc).__name__)

    exporting = threading.Thread(target=export_the_rest, name="telemetry-shutdown", daemon=True)
    exporting.start()
    exporting.join(done.settings.shutdown_s)
    if exporting.is_alive():
        log.warning("telemetry was still exporting after SPECIALISTS_OTEL_SHUTDOWN_S (%g s); the rest is dropped",
                    done.settings.shutdown_s)


def _signal_url(endpoint: str, signal: str) -> str:
    return f"{endpoint.rstrip('/')}/v1/{signal}"


def instrument_engine(engine: Any) -> None:
    """Spans for the statements of a SQLAlchemy engine (its ``sync_engine`` for an async one), when telemetry is on.
    A statement's text is recorded, never its parameters."""
    if _installed is None:
        return
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
    from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer

    from sqlalchemy import event

    scope = SQLAlchemyInstrumentor.__module__
    sync_engine = getattr(engine, "sync_engine", engine)
    connections = metrics.get_meter(scope).create_up_down_counter(
        "db.client.connections.usage", unit="connections", description="Connections in use or idle, by state")
    EngineTracer(_ChildSpansOnly(trace.get_tracer(scope)), sync_engine, connections)
    event.listen(sync_engine, "commit", _run_after_commit)
    event.listen(sync_engine, "rollback", _drop_after_commit)
    _instrumented.add(sync_engine)


class _ChildSpansOnly(trace.Tracer):
    """A statement's span only inside a trace (a request, a job): the dispatchers' and sweepers' polls, a dozen
    statements a second between them, would otherwise each be a trace of one span, paid for and never read."""

    def __init__(self, inner: trace.Tracer) -> None:
        self._inner = inner

    def start_span(self, name: str, context: otel_context.Context | None = None, *args: Any, **kwargs: Any) -> Span:
        if not trace.get_current_span(context).get_span_context().is_valid:
            return trace.INVALID_SPAN
        return self._inner.start_span(name, context, *args, **kwargs)

    @contextmanager
    def start_as_current_span(self, name: str, context: otel_context.Context | None = None, *args: Any,
                              **kwargs: Any) -> Iterator[Span]:
        if not trace.get_current_span(context).get_span_context().is_valid:
            yield trace.INVALID_SPAN
            return
        with self._inner.start_as_current_span(name, context, *args, **kwargs) as current:
            yield current


# FastAPI's own OpenTelemetry (``FastAPI(telemetry=...)``, on whenever a provider is installed) stays off: the edge
# opens its request span itself (``request_span``, the access line inside it), and the worker's endpoint belongs to
# the job's trace, continued from the signed body. Measured on the admission benchmark, FastAPI's span and HTTP
# metrics were most of telemetry's cost (docs/BENCHMARKS.md).
FASTAPI_TELEMETRY = {"tracing": False, "metrics": False, "logs": False}


def is_on() -> bool:
    return _installed is not None


def request_span(method: str, operation: str, caller_traceparent: str | None) -> Any:
    """The edge's span of one request (SERVER): the root of its trace, or the child of the caller's ``traceparent``
    header when ``SPECIALISTS_OTEL_ACCEPT_TRACEPARENT`` accepts it."""
    accepted = _installed is not None and _installed.settings.accept_traceparent
    parent = context_of(caller_traceparent) if accepted else None
    return span(f"{method} {operation}", parent=parent or otel_context.Context(), kind=SpanKind.SERVER,
                attributes={"http.request.method": method, "specialists.operation": operation})


def grpc_server_interceptors() -> list[Any]:
    """The gRPC server's span interceptor, when telemetry is on."""
    if _installed is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return [aio_server_interceptor(tracer_provider=_installed.tracer_provider)]


# --- logs ------------------------------------------------------------------------------------------------------


def _stamp_log_records(project: str) -> None:
    """Every log record made where a span is current carries its trace in Cloud Logging's fields
    (``record.trace_fields``), stamped when it is made: a record relayed from a job's process, or formatted on
    another thread, keeps the trace it was logged in."""
    previous = logging.getLogRecordFactory()
    prefix = f"projects/{project}/traces/" if project else ""

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_fields = {
                LOG_TRACE_FIELD: prefix + format(context.trace_id, "032x"),
                LOG_SPAN_FIELD: format(context.span_id, "016x"),
                LOG_SAMPLED_FIELD: context.trace_flags.sampled,
            }
        return record

    logging.setLogRecordFactory(factory)
