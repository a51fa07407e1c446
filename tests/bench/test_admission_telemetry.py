"""The admission benchmark's telemetry run (bench/admission.py --telemetry): its OTLP receiver counts what the
service's own exporter sends, and a short run reports edge+otel beside edge with the spans it received.

Not a speed test: nothing here looks at a figure, only that the figures are of a run where tracing was on.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from bench.admission import free_port, start
from core.settings import PROJECT_ROOT
from ops.topology import Ready

BENCH = str(PROJECT_ROOT / "bench" / "admission.py")


@pytest.fixture
def receiver_url():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start("otlp-receiver", [sys.executable, BENCH, "otlp-receiver", str(port)], None,
                    Ready.listening(f"{url}/counts"))
    try:
        process.wait_ready()
        yield url
    finally:
        process.stop()


def test_the_benchmarks_receiver_counts_every_span_and_metric_export_the_exporters_send(receiver_url):
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver_url}/v1/traces")))
    meter_provider = MeterProvider(metric_readers=[PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{receiver_url}/v1/metrics"), export_interval_millis=60_000)])
    tracer = tracer_provider.get_tracer("test")
    for _ in range(700):  # more than one batch of 512
        with tracer.start_as_current_span("request"):
            with tracer.start_as_current_span("admission"):
                pass
    meter_provider.get_meter("test").create_counter("admissions").add(3, {"outcome": "admitted"})
    tracer_provider.shutdown()
    meter_provider.shutdown()

    counts = httpx.get(f"{receiver_url}/counts").json()

    assert counts["spans"] == {"request": 700, "admission": 700}
    assert counts["trace_exports"] >= 2
    assert counts["metric_exports"] >= 1 and counts["metric_points"] >= 1
    assert counts["bytes"] > 0


def test_the_receiver_refuses_a_path_that_is_not_an_otlp_signal(receiver_url):
    answer = httpx.post(f"{receiver_url}/v1/logs", content=b"x", headers={"content-type": "application/x-protobuf"})

    assert answer.status_code == 400
    assert httpx.get(f"{receiver_url}/counts").json()["trace_exports"] == 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_short_telemetry_run_reports_edge_and_edge_otel_side_by_side_with_the_spans_received(server_url):
    env = {**os.environ, "DATABASE_URL": server_url}
    run = subprocess.run(
        # Short and light (two clients, quarter-second runs after a tenth of warm-up: each closed-loop client still
        # sends, so every row and span count is of real requests): a closed loop saturates what it can, and the
        # suite's other worker may be measuring latency under an isolation test's flood at the same time.
        [sys.executable, BENCH, "--telemetry", "--sampling", "1", "--seconds", "0.25", "--warmup", "0.1", "--clients", "2",
         "--rounds", "2"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=220,
    )

    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    # The existing table and summary stay, with edge+otel rows beside them, closed loop and paced.
    assert re.search(r"^edge\s+\d+", out, re.M) and re.search(r"^edge\+otel\s+\d+", out, re.M)
    assert re.search(r"^edge\+otel@\d+/s\s+\d+", out, re.M)
    assert "edge / baseline throughput" in out
    # Two rounds, the second starting with edge+otel.
    assert re.search(r"^1\s+edge\s", out, re.M) and re.search(r"^2\s+edge\+otel\s", out, re.M)
    assert re.search(r"edge\+otel / edge throughput: [\d.]+% median of the rounds", out)
    # Tracing was really on: the receiver got the admission span of every request, in a separate process.
    spans = re.search(r"spans received: (\d+) for (\d+) requests to edge\+otel = ([\d.]+) per request \(([^)]*)\)", out)
    assert spans, out[-2000:]
    assert int(spans[2]) > 0 and float(spans[3]) >= 1.0
    assert re.search(r"\badmission 1\.00\b", spans[4])
