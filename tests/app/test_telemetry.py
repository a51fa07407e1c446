"""The edge's OpenTelemetry as an operator relies on it, through two real edge processes exporting by OTLP to a
receiver on 127.0.0.1 (tests/otlp.py): counters that add up across instances, and a customer's ``traceparent``
continued only when the operator accepts it."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import pytest

from taskstate import reads
from tests import http_calls
from tests.app.conftest import PAID, PAID_TARIFF, message, start_edge, stop_edge
from tests.otlp import otlp_receiver

pytestmark = [pytest.mark.timeout(90)]

SENT_TO = {"a": 5, "b": 3}
TRACE_ID = uuid.uuid4().hex


def _send(edge, customer, *, headers: dict[str, str] | None = None) -> dict:
    answer = http_calls.post(f"{edge.specialist(PAID)}/message:send", json=message(returnImmediately=True),
                             headers={**customer.headers, **(headers or {})}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["task"]


def _get_task_over_grpc(edge, customer, task_id: str) -> None:
    """The gRPC binding's GetTask (the specialist as tenant, the key in metadata), as a gRPC client sends it."""
    import asyncio

    import grpc.aio
    from a2a.types import a2a_pb2_grpc
    from a2a.types.a2a_pb2 import GetTaskRequest

    async def call() -> None:
        async with grpc.aio.insecure_channel(edge.grpc_address) as channel:
            task = await a2a_pb2_grpc.A2AServiceStub(channel).GetTask(
                GetTaskRequest(id=task_id, tenant=PAID), metadata=(("authorization", f"Bearer {customer.key}"),),
                timeout=30)
            assert task.id == task_id

    asyncio.run(call())


def test_two_instances_export_counters_that_sum_to_the_admissions_made_and_a_traceparent_joins_only_if_accepted(
        database_url: str, edge_specs_dir: Path, tmp_path: Path, make_customer):
    customer = make_customer(credits=200)
    unentitled = make_customer(credits=10, entitled=False)
    with otlp_receiver() as receiver:
        telemetry = dict(otel_enabled="true", otel_endpoint=receiver.url, otel_export_delay_s="0.2",
                         otel_sampling_ratio="1")
        # a continues a caller's trace (SPECIALISTS_OTEL_ACCEPT_TRACEPARENT), b keeps the default: it does not.
        edges = {"a": start_edge(database_url, edge_specs_dir, tmp_path, "otel-a", otel_accept_traceparent="true",
                                 **telemetry),
                 "b": start_edge(database_url, edge_specs_dir, tmp_path, "otel-b", **telemetry)}
        try:
            caller = {"traceparent": f"00-{TRACE_ID}-{uuid.uuid4().hex[:16]}-01"}
            tasks = {name: [_send(edge, customer, headers=caller if i == 0 else None)["id"]
                            for i in range(SENT_TO[name])] for name, edge in edges.items()}
            refused = http_calls.post(f"{edges['b'].specialist(PAID)}/message:send", json=message(),
                                      headers=unentitled.headers, timeout=30)
            assert refused.status_code == 403, refused.text

            _get_task_over_grpc(edges["b"], customer, tasks["b"][0])

            def admission_of(task_id: str):
                return next((s for s in receiver.spans if s.name == "admission"
                             and s.attributes.get("specialists.task_id") == task_id), None)

            joined = receiver.wait_for("a's first admission", lambda: admission_of(tasks["a"][0]), 30)
            kept_apart = receiver.wait_for("b's first admission", lambda: admission_of(tasks["b"][0]), 30)
            grpc_call = receiver.wait_for("b's gRPC GetTask span", lambda: next(
                (s for s in receiver.spans if s.name.endswith("/GetTask") and s.kind == 2), None), 30)  # SERVER
        finally:
            for edge in edges.values():  # SIGTERM: each exports its last counts as it stops
                stop_edge(edge)

    assert grpc_call.resource["service.instance.id"] != joined.resource["service.instance.id"]  # b's, not a's
    assert joined.trace_id == TRACE_ID
    assert kept_apart.trace_id != TRACE_ID and kept_apart.parent_span_id != caller["traceparent"].split("-")[2]

    admitted = receiver.per_instance("specialists.admissions", specialist=PAID, outcome="admitted")
    assert sorted(admitted.values()) == sorted(SENT_TO.values())  # one series per instance, none shared
    assert receiver.total("specialists.admissions", specialist=PAID, outcome="admitted") == sum(SENT_TO.values())
    assert receiver.total("specialists.credits.reserved", specialist=PAID) == sum(SENT_TO.values()) * PAID_TARIFF
    refusals = {dict(attrs)["code"]: value for (_, name, attrs), value in receiver.points.items()
                if name == "specialists.refusals"}
    [(code, count)] = refusals.items()  # the one refusal, by the stable code its answer carries
    assert count == 1 and code in refused.text, (refusals, refused.text)
    for instance in admitted:
        resource = receiver.resources[instance]
        assert resource["service.name"] == "specialists-api" and resource["service.version"]


def test_the_service_gauges_read_each_specialists_queued_jobs_and_the_oldest_ones_wait(engine, make_customer,
                                                                                        edge_alone, edge_specs_dir):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from core import telemetry
    from core.settings import Settings
    from workers.dispatch.process import served_specialists, service_points

    customer = make_customer(credits=50)
    for _ in range(2):  # nothing claims the paid specialist's tasks beside edge_alone: they stay queued
        _send(edge_alone, customer)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])  # this test's own, not the process's
    settings = Settings(hosted={"specs_dir": edge_specs_dir})
    specialists = served_specialists(settings)  # read once, as a dispatcher starts
    assert PAID in specialists
    try:
        telemetry.observe_service(lambda: service_points(settings, engine, specialists), on=provider.get_meter("test"))
        exported = reader.get_metrics_data()
    finally:
        provider.shutdown()
    points = {metric.name: {dict(p.attributes).get("specialist"): p.value for p in metric.data.data_points}
              for resource in exported.resource_metrics for scope in resource.scope_metrics for metric in scope.metrics}
    with engine.connect() as conn:
        queued = {row["specialist_id"]: row["queued"] for row in reads.queue(conn)}
    assert 2 <= points["specialists.queue.depth"][PAID] <= queued[PAID]  # read first; the queue only grows here
    assert points["specialists.queue.age"][PAID] >= 0
    assert set(points) == set(telemetry.SERVICE_GAUGES)  # every gauge has its points, one read for all
    assert points["specialists.push.pending"][None] >= 0 and points["specialists.jobs.unknown_open"][None] >= 0


def test_an_edge_whose_receiver_never_answers_still_stops_within_its_shutdown_bound(
        database_url: str, edge_specs_dir: Path, tmp_path: Path, make_customer):
    customer = make_customer(credits=20)
    # Accepts connections into its backlog and never reads a byte: an export to it waits its whole timeout.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        shutdown_s, export_timeout_s = 1.0, 30.0
        edge = start_edge(database_url, edge_specs_dir, tmp_path, "otel-silent", otel_enabled="true",
                          otel_endpoint=endpoint, otel_export_timeout_s=str(export_timeout_s),
                          otel_shutdown_s=str(shutdown_s))
        try:
            _send(edge, customer)  # a trace and counts to export, which never leave
        finally:
            stopping = time.monotonic()
            stop_edge(edge)
            stopped_s = time.monotonic() - stopping
    assert edge.process.returncode == 0
    # Unbounded, the spans' and the metrics' last exports would each wait 30 s. The promise is
    # SPECIALISTS_OTEL_SHUTDOWN_S on top of the edge's own stop, which takes well under 10 s even on a loaded machine.
    assert stopped_s < shutdown_s + 10, f"stopped after {stopped_s:.1f} s (SPECIALISTS_OTEL_SHUTDOWN_S={shutdown_s})"
    assert "SPECIALISTS_OTEL_SHUTDOWN_S" in edge.log_path.read_text()
