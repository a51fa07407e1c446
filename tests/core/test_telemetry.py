"""What crosses processes in a task's trace (core/telemetry.py): the W3C traceparent a span writes, and what a stored
or signed one may be read as. A span of a provider of the test's own is made current; the process's global
provider is never installed here (the whole-system tests in tests/e2e and tests/app export for real)."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from core import telemetry
from core.settings import Settings, TelemetrySettings
from pydantic import ValidationError


def test_a_span_writes_its_traceparent_and_reading_it_back_continues_the_same_trace():
    assert telemetry.traceparent() is None  # no span: nothing to continue, a NULL in the outbox row
    provider = TracerProvider()
    try:
        with provider.get_tracer("test").start_as_current_span("admission") as span:
            written = telemetry.traceparent()
            ids = span.get_span_context()
    finally:
        provider.shutdown()
    assert written.startswith(f"00-{ids.trace_id:032x}-{ids.span_id:016x}-")  # then the flags: sampled
    assert len(written) == telemetry.TRACEPARENT_CHARS
    read = trace.get_current_span(telemetry.context_of(written)).get_span_context()
    assert (read.trace_id, read.span_id, read.is_remote) == (ids.trace_id, ids.span_id, True)


@pytest.mark.parametrize("stored", [
    None, "", "not a traceparent", "00-" + "0" * 32 + "-" + "1" * 16 + "-01",  # an all-zero trace id is invalid
    "00-" + "a" * 32 + "-" + "0" * 16 + "-01",  # so is an all-zero span id
    "00-" + "a" * 32 + "-" + "b" * 16 + "-01-and-more",  # longer than a version-00 traceparent
])
def test_anything_but_a_valid_traceparent_starts_no_trace_of_its_own(stored):
    assert telemetry.context_of(stored) is None


def test_an_engine_that_is_not_instrumented_keeps_no_metric_for_after_its_commit(engine):
    with engine.begin() as conn:
        telemetry.after_commit(conn, lambda: pytest.fail("never run: telemetry is off in this process"))
        assert telemetry.AFTER_COMMIT not in conn.info  # nothing would drain it: nothing is kept


@pytest.mark.parametrize(("variable", "value"), [
    ("SPECIALISTS_OTEL_SAMPLING_RATIO", "1.5"), ("SPECIALISTS_OTEL_ENDPOINT", "localhost:4318"),
    ("SPECIALISTS_OTEL_TRACES", "jaeger"), ("SPECIALISTS_OTEL_EXPORT_TIMEOUT_S", "0"),
])
def test_a_telemetry_setting_out_of_its_bounds_is_refused_at_start_up_by_its_name(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as refused:
        Settings(telemetry=TelemetrySettings())
    assert variable.removeprefix("SPECIALISTS_OTEL_").lower() in str(refused.value)


def test_telemetry_is_off_unless_enabled():
    assert TelemetrySettings().enabled is False
    assert telemetry.setup(TelemetrySettings(), role="test") is None
