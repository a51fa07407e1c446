"""Structured JSON logs with a request id, key redaction, and the Prometheus metrics of the edge.

Every log line is one JSON object carrying the request id of the request it
belongs to (a context variable set by the request middleware). Keys never
reach a log: a filter on every handler replaces anything shaped like an API
key or a bearer credential before the line is written, whoever logged it
(the a2a-sdk logs call contexts and request bodies at DEBUG).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from core import telemetry

request_id_var: ContextVar[str] = ContextVar("request_id", default="-")
customer_var: ContextVar[str] = ContextVar("customer_id", default="-")
# The request's refusal code, for its access line: a holder set per request, filled in by whoever refuses
# (possibly in a task the SDK started, which sees the same holder).
refusal_var: ContextVar[dict[str, str] | None] = ContextVar("refusal", default=None)


def note_refusal(code: str) -> None:
    holder = refusal_var.get()
    if holder is not None:
        holder["code"] = code


def note_task(task_id: str) -> None:
    """The task the request is about (the one it admitted, read, canceled or subscribed to), for its access line:
    ``jsonPayload.task_id="<id>"`` finds the edge's line (docs/OPERATIONS.md). Same holder as the refusal's."""
    holder = refusal_var.get()
    if holder is not None:
        holder["task_id"] = task_id

# sk_<env>_<secret id>_<payload>.<signature>, and any "Bearer <credential>".
_KEY_RE = re.compile(r"sk_(?:live|test)_[0-9a-f]{8}_[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)?")
_BEARER_RE = re.compile(r"(?i)(bearer\s+)[^\s'\",}]+")
REDACTED = "[redacted]"


def redact(text: str) -> str:
    return _BEARER_RE.sub(lambda m: m.group(1) + REDACTED, _KEY_RE.sub(REDACTED, text))


class RedactingFilter(logging.Filter):
    """Renders the message once, redacted, so neither the format string nor its args can leak a key."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string must not hide the line
            message = str(record.msg)
        record.msg = redact(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


_SEVERITY = {logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARNING", logging.ERROR: "ERROR",
             logging.CRITICAL: "CRITICAL"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "severity": _SEVERITY.get(record.levelno, "DEFAULT"),  # the field Cloud Logging reads
            "logger": record.name,
            "request_id": request_id_var.get(),
            "message": record.getMessage(),
        }
        customer = customer_var.get()
        if customer != "-":
            entry["customer_id"] = customer
        for key in ("event", "method", "path", "status", "duration_ms", "task_id", "specialist", "code", "job_id",
                    "outcome", "worker_id", "count"):
            value = record.__dict__.get(key)
            if value is not None:
                entry[key] = value
        trace_fields = record.__dict__.get("trace_fields")  # stamped where it was logged (core/telemetry.py)
        if trace_fields:
            entry.update(trace_fields)
        if record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, default=str)


def configure_logging(level: str, stream: object = None) -> logging.Handler:
    """One JSON handler on the root logger; uvicorn's own loggers propagate to it."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # The request middleware writes one access line per request, with the request id.
    logging.getLogger("uvicorn.access").disabled = True
    return handler


@dataclass
class Metrics:
    """The edge's metrics, in their own registry (several apps can live in one test process)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(
            "edge_http_requests", "HTTP requests answered", ["operation", "status"], registry=r
        )
        self.latency = Histogram(
            "edge_http_request_duration_seconds",
            "Time to the response head",
            ["operation"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.admissions = Counter(
            "edge_admissions", "SendMessage admissions by outcome", ["specialist", "outcome"], registry=r
        )
        self.refusals = Counter("edge_refusals", "Requests refused, by stable code", ["code"], registry=r)
        self.open_streams = Gauge("edge_open_streams", "Event streams being served", registry=r)
        # The service's state, read from the database at each scrape (``show_service``): the gauges the dispatchers
        # export by OpenTelemetry, under their Prometheus names (core.telemetry.SERVICE_GAUGES).
        self.service = {name: Gauge(telemetry.prometheus_name(name, unit), description, list(labels), registry=r)
                        for name, (unit, labels, description) in telemetry.SERVICE_GAUGES.items()}

    def show_service(self, points: telemetry.ServicePoints | None) -> None:
        """The service gauges as of one read (``taskstate.reads.ServiceFacts.points``); None (the read failed):
        none, rather than the last read's values shown as now."""
        for gauge in self.service.values():
            gauge.clear()
        for name, value, attributes in points or ():
            gauge = self.service[name]
            (gauge.labels(**attributes) if attributes else gauge).set(value)

    # Counted twice: in this instance's Prometheus registry (``/metrics``) and in the OpenTelemetry meters
    # (``core.telemetry``: exported with the instance in the resource, so the instances' counts add up).
    def count_refusal(self, code: str) -> None:
        self.refusals.labels(code=code).inc()
        telemetry.meters.refusals.add(1, {"code": code})

    def count_admission(self, specialist: str, outcome: str, credits_reserved: int = 0) -> None:
        self.admissions.labels(specialist=specialist, outcome=outcome).inc()
        telemetry.meters.admissions.add(1, {"specialist": specialist, "outcome": outcome})
        if credits_reserved:
            telemetry.meters.credits_reserved.add(credits_reserved, {"specialist": specialist})
