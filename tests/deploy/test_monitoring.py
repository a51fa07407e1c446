"""The alert policies of infra/monitoring.tf (issue 42) read metrics that exist.

Each policy's filter names one metric type. The service's own are read against what the code exports: the
instruments of ``core.telemetry`` (``Meters``, and the gauges ``observe_service`` registers with the points of
``taskstate.reads.ServiceFacts``) are recorded once into an SDK meter of the test's, and each exported metric is
named as the collector's googlemanagedprometheus exporter names it (``telemetry.prometheus_name``; counters end
in ``_total``; the kind is the type's last part). Google's own metrics are listed below, each with where it is
documented: a filter naming anything else fails."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, Histogram, InMemoryMetricReader, Sum

from core import telemetry
from taskstate import liveness, push
from taskstate.reads import ServiceFacts, SpecialistQueue
from tests.deploy.manifests import Terraform

# Metrics Google's services write themselves, which the code cannot export.
GOOGLE_METRICS = {
    # https://cloud.google.com/monitoring/api/metrics_gcp_p_z#gcp-run
    "run.googleapis.com/request_count": "Cloud Run: requests reaching the revision, by response_code_class",
    # https://cloud.google.com/monitoring/api/metrics_gcp_c#gcp-cloudsql
    "cloudsql.googleapis.com/database/postgresql/num_backends": "Cloud SQL: connections to the instance",
    # https://cloud.google.com/monitoring/api/metrics_gcp_i_o#gcp-monitoring
    "monitoring.googleapis.com/uptime_check/check_passed": "Uptime checks: whether the API's /healthz answered",
}
# What the issue asks alerts on, each by the policy (and for the service's gauges, the key) that covers it.
REQUIRED = {
    ("service", "no_live_worker"), ("service", "job_wait"), ("service", "unknown_reservations"),
    ("service", "push_failures"), ("edge_5xx", None), ("database_connections", None),
    ("api_uptime", None),  # issue 46: an uptime check of the public API
}
METRIC_TYPE = re.compile(r'metric\.type = \\?"([^"\\]+)\\?"')


def exported() -> dict[str, set[str]]:
    """Every metric the code exports, as Managed Service for Prometheus types, with the attributes of its points."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        meter = provider.get_meter("test")
        for instrument in vars(telemetry.Meters(on=meter)).values():
            (instrument.add if hasattr(instrument, "add") else instrument.record)(1, {"specialist": "s"})
        now = datetime.now(timezone.utc)
        facts = ServiceFacts(
            checked_at=now, live_s=60.0,
            workers=[liveness.WorkerBeat("w", ("s",), now, now, 0.0, True)], live_workers={"s": 1},
            queue=[SpecialistQueue("s", 2, 1, now, 3.0)], push=push.Backlog(4, 5.0, 6), unknown_jobs=7)
        telemetry.observe_service(facts.points, on=meter)
        data = reader.get_metrics_data()
    finally:
        provider.shutdown()
    found: dict[str, set[str]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if isinstance(metric.data, Gauge):
                    kind, suffix = "gauge", ""
                elif isinstance(metric.data, Sum) and metric.data.is_monotonic:
                    kind, suffix = "counter", "_total"
                elif isinstance(metric.data, Histogram):
                    kind, suffix = "histogram", ""
                else:
                    kind, suffix = "gauge", ""
                name = telemetry.prometheus_name(metric.name, metric.unit or "") + suffix
                found[f"prometheus.googleapis.com/{name}/{kind}"] = {
                    key for point in metric.data.data_points for key in point.attributes}
    return found


@pytest.fixture(scope="module")
def policies() -> dict[tuple[str, str | None], dict]:
    """Each alert policy's condition, with its filter as Terraform makes it."""
    tf = Terraform()
    found: dict[tuple[str, str | None], dict] = {}
    for name, policy in tf.of_type("google_monitoring_alert_policy").items():
        condition = policy["conditions"][0]["condition_threshold"][0]
        if name == "service":  # one policy per gauge alert: the filter is the format of each entry's metric
            assert condition["filter"] == "${format(local.gauge_filter, each.value.metric)}"
            assert policy["for_each"] == "${var.otel_enabled ? local.service_alerts : {}}"
            for key, alert in tf.locals["service_alerts"].items():
                found[(name, key)] = condition | {"filter": tf.locals["gauge_filter"] % alert["metric"],
                                                  "group_by": alert["group_by"]}
        else:
            found[(name, None)] = condition | {"group_by": condition["aggregations"][0]["group_by_fields"]}
    return found


def test_every_alert_the_issue_asks_for_is_a_policy(policies):
    assert set(policies) == REQUIRED


def test_each_policys_filter_names_a_metric_the_code_exports_or_one_google_writes(policies):
    names = exported()
    assert "prometheus.googleapis.com/specialists_workers_live/gauge" in names  # the reading above is whole
    for key, condition in policies.items():
        types = METRIC_TYPE.findall(condition["filter"])
        assert len(types) == 1, (key, condition["filter"])
        metric_type = types[0]
        if metric_type in GOOGLE_METRICS:
            continue
        assert metric_type in names, f"{key}: {metric_type} is not exported; the code exports {sorted(names)}"
        # A gauge alert grouped by a label needs that attribute on the points.
        for field in condition["group_by"]:
            assert field.removeprefix("metric.label.") in names[metric_type], (key, field)
