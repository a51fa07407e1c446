"""Traces and metrics in production (infra/observability.tf, infra/otel-collector.yaml): which processes export,
where to, and with what rights.

The API, gRPC and worker services each run Google's build of the OpenTelemetry Collector as a sidecar; their
processes export OTLP over HTTP to it on the instance's loopback, and it writes to Cloud Trace and Cloud
Monitoring as the instance's account. The console, the migration job and the drill job export nothing. The
grants themselves are test_infra_policy.py's (every account exactly what its processes use, the collectors'
exporters included); here, what is particular to the telemetry.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

import pytest
import yaml

from core.settings import PROJECT_ROOT
from tests.deploy.conftest import settings_from, terraform_environment
from tests.deploy.manifests import (
    INFRA,
    Terraform,
    collector_config,
    container,
    container_env,
    mounted_secrets,
    plan_variables,
    revision_template,
    secret_file,
    sidecars,
)
from tests.deploy.test_infra_policy import collector_needs, grants

pytestmark = pytest.mark.timeout(90, func_only=True)

SERVICE = "google_cloud_run_v2_service"
JOB = "google_cloud_run_v2_job"
# The processes that export: the API service (the edge and its Cloud Tasks relay), the gRPC service's edge, the
# worker and its job processes. Not the console, the migration or the drill.
EXPORTING = {(SERVICE, "api"), (SERVICE, "grpc"), (SERVICE, "worker")}
COLLECTOR = "otel-collector"
GOOGLES_COLLECTOR = "us-docker.pkg.dev/cloud-ops-agents-artifacts/google-cloud-opentelemetry-collector/otelcol-google"
TELEMETRY_ROLES = {"roles/cloudtrace.agent", "roles/monitoring.metricWriter"}
WITHOUT_TELEMETRY = {"otel_enabled": False}


def runs_containers(tf: Terraform) -> list[tuple[str, str]]:
    return sorted(key for key in tf.resources if key[0] in (SERVICE, JOB))


def the_collector(tf: Terraform, kind: str, name: str) -> dict:
    (sidecar,) = sidecars(tf, kind, name)
    assert tf.resolve(sidecar["name"]) == COLLECTOR
    return sidecar


def config() -> dict:
    return yaml.safe_load((INFRA / "otel-collector.yaml").read_text())


def host_and_port(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


# --- where the collector runs -------------------------------------------------------------------------


def test_the_collector_runs_beside_exactly_the_services_whose_processes_export(tf):
    for kind, name in runs_containers(tf):
        names = [tf.resolve(c["name"]) for c in sidecars(tf, kind, name)]
        assert names == ([COLLECTOR] if (kind, name) in EXPORTING else []), name
        enabled = container_env(tf, kind, name).plain.get("SPECIALISTS_OTEL_ENABLED")
        assert enabled == ("true" if (kind, name) in EXPORTING else None), name


def test_each_exporting_service_starts_its_own_container_only_once_the_collector_passed_its_startup_probe(tf):
    health_port = host_and_port(config()["extensions"]["health_check"]["endpoint"])[1]
    for kind, name in EXPORTING:
        own, collector = container(tf, kind, name), the_collector(tf, kind, name)
        assert tf.resolve(own["depends_on"]) == [COLLECTOR], name
        probe = collector["startup_probe"][0]
        assert probe["http_get"][0]["path"] == "/" and tf.resolve(probe["http_get"][0]["port"]) == health_port, name
        # Cloud Run routes requests to the one container with a port: the service's own.
        assert "ports" in own and "ports" not in collector, name


def test_the_release_changes_the_services_own_image_and_terraform_the_collectors(tf):
    # lifecycle ignores containers[0].image (cloudbuild.yaml deploys it): containers[0] must be the service's own
    # container, so its static block comes before the dynamic one of the sidecar in each service.
    run_tf = (INFRA / "run.tf").read_text()
    for kind, name in EXPORTING:
        block = run_tf.split(f'resource "{kind}" "{name}" {{', 1)[1].split("\nresource ", 1)[0]
        assert block.index("\n    containers {") < block.index('\n    dynamic "containers" {'), name
        assert "template[0].containers[0].image" in str(tf.resource(kind, name)["lifecycle"][0]["ignore_changes"])
        assert tf.resolve(container(tf, kind, name)["image"]) == tf.default("image")
        assert tf.resolve(the_collector(tf, kind, name)["image"]) == tf.default("otel_collector_image")


def test_the_collector_is_googles_build_pinned_to_a_release(tf):
    image = tf.default("otel_collector_image")
    repository, _, version = image.partition(":")
    assert repository == GOOGLES_COLLECTOR
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"{image}: pinned to a version, not a moving tag"


@pytest.mark.parametrize("image", [
    f"{GOOGLES_COLLECTOR}:latest",
    GOOGLES_COLLECTOR,
    f"{GOOGLES_COLLECTOR}:0.160",
], ids=["latest", "no_tag", "minor_only"])
def test_terraform_refuses_a_collector_image_that_is_not_pinned(tmp_path, image):
    planned = plan_variables(tmp_path, otel_collector_image=image)
    assert planned.returncode != 0
    assert "otel_collector_image is pinned" in " ".join((planned.stdout + planned.stderr).split())


def test_terraform_accepts_a_collector_image_pinned_by_version_or_digest(tmp_path):
    planned = plan_variables(tmp_path, otel_collector_image=f"{GOOGLES_COLLECTOR}@sha256:{'0' * 64}")
    assert planned.returncode == 0, planned.stdout + planned.stderr


def test_the_collectors_cpu_and_memory_are_bounded_and_it_drops_data_before_its_memory_limit(tf):
    limits = config()["processors"]["memory_limiter"]
    for kind, name in EXPORTING:
        collector, own = the_collector(tf, kind, name), container(tf, kind, name)
        resources = collector["resources"][0]
        memory_mib = int(tf.resolve(resources["limits"]["memory"]).removesuffix("Mi"))
        assert limits["limit_mib"] + limits["spike_limit_mib"] <= memory_mib, name
        assert 0 < float(tf.resolve(resources["limits"]["cpu"])) < 1, name
        # CPU allocation is the revision's: the sidecar says what the service's own container says.
        assert resources.get("cpu_idle") == own["resources"][0].get("cpu_idle"), name


# --- what it listens on, and where it writes -----------------------------------------------------------


def test_the_collector_listens_for_otlp_over_http_on_the_loopback_only(tf):
    collector = config()
    assert set(collector["receivers"]) == {"otlp"}
    protocols = collector["receivers"]["otlp"]["protocols"]
    assert set(protocols) == {"http"}, "the processes export OTLP over HTTP; no gRPC receiver"
    host, port = host_and_port(protocols["http"]["endpoint"])
    assert ipaddress.ip_address(host).is_loopback and port == 4318
    # The only other listener is the health endpoint Cloud Run's probe asks; no internal metrics, zpages or pprof.
    assert set(collector["extensions"]) == {"health_check"} and collector["service"]["extensions"] == ["health_check"]
    assert collector["service"]["telemetry"]["metrics"]["level"] == "none"
    # And every exporting process is told that address.
    for kind, name in EXPORTING:
        endpoint = urlsplit(container_env(tf, kind, name).plain["SPECIALISTS_OTEL_ENDPOINT"])
        assert (endpoint.scheme, endpoint.hostname, endpoint.port) == ("http", host, port), name


def test_the_collector_sends_spans_to_cloud_trace_and_metrics_to_cloud_monitoring_and_nothing_else():
    pipelines = config()["service"]["pipelines"]
    assert set(pipelines) == {"traces", "metrics"}, "logs are the processes' stderr, which Cloud Run keeps itself"
    assert pipelines["traces"]["exporters"] == ["googlecloud"]
    assert pipelines["metrics"]["exporters"] == ["googlemanagedprometheus"]
    for pipeline in pipelines.values():
        assert pipeline["receivers"] == ["otlp"]
        assert pipeline["processors"][0] == "memory_limiter" and pipeline["processors"][-1] == "batch"
    assert collector_needs(config()) == {(role, "project") for role in TELEMETRY_ROLES}
    # The processes' own resource (service.name, service.version, service.instance.id) is kept: one series each.
    assert config()["processors"]["resourcedetection"]["override"] is False


def test_the_collector_reads_the_configuration_of_this_repository_from_secret_manager(tf):
    for kind, name in EXPORTING:
        collector = the_collector(tf, kind, name)
        assert collector_config(tf, kind, name, collector) == config(), name
        (secret,) = set(mounted_secrets(tf, kind, name, collector).values())
        assert secret_file(tf, secret) == INFRA / "otel-collector.yaml"
        # The version Terraform wrote, not `latest`: a changed file reaches new revisions, not running ones.
        volume = [v for v in revision_template(tf, kind, name)["dynamic"] if "volumes" in v][0]["volumes"]
        version = volume["content"][0]["secret"][0]["items"][0]["version"]
        assert version == "${google_secret_manager_secret_version.otel_collector_config.version}", name
    assert tf.resource("google_project_service", "telemetry")["for_each"] == (
        '${toset(["cloudtrace.googleapis.com", "monitoring.googleapis.com"])}')


# --- what each process is told ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(name for _, name in EXPORTING))
def test_the_exporting_services_settings_turn_export_on_point_at_the_collector_and_name_the_project(
    tf, name, database_url, monkeypatch
):
    settings = settings_from(terraform_environment(tf, SERVICE, name, database_url), monkeypatch).telemetry
    assert settings.enabled and settings.traces == "otlp" and settings.metrics == "otlp"
    assert settings.endpoint == f"http://{config()['receivers']['otlp']['protocols']['http']['endpoint']}"
    assert settings.project == tf.default("project_id"), "log lines' logging.googleapis.com/trace names it"
    assert settings.sampling_ratio == tf.default("otel_sampling_ratio")
    # Cloud Run's K_SERVICE and K_REVISION are the resource's service.name and service.version.
    assert settings.service_name == tf.resolve(tf.resource(SERVICE, name)["name"])
    assert settings.revision.startswith(settings.service_name + "-")


def test_the_api_started_from_terraforms_environment_exports_its_spans_to_the_collector_as_its_cloud_run_service(
    tf, api_from_terraform, collector
):
    from tests import http_calls

    assert http_calls.get(f"{api_from_terraform.url}/specialists/conformance/.well-known/agent-card.json").status_code == 200
    service = tf.resolve(tf.resource(SERVICE, "api")["name"])
    spans = collector.wait_for(
        "a span of the API service", lambda: [s for s in collector.spans if s.resource.get("service.name") == service],
        timeout_s=30,
    )
    assert {span.resource.get("service.version") for span in spans} == {f"{service}-00001-tst"}
    assert all(span.resource.get("service.instance.id") for span in spans)


# --- who may write ------------------------------------------------------------------------------------


def test_only_the_accounts_of_exporting_services_may_write_traces_or_metrics(tf):
    writers = {g.member for g in grants(tf) if g.role in TELEMETRY_ROLES}
    exporting = {"account:" + tf.name_of(revision_template(tf, kind, name)["service_account"])[1]
                 for kind, name in EXPORTING}
    assert writers == exporting == {"account:api", "account:grpc", "account:worker"}
    for kind, name in runs_containers(tf):
        if (kind, name) in EXPORTING:
            continue
        account = "account:" + tf.name_of(revision_template(tf, kind, name)["service_account"])[1]
        assert account not in writers, f"{name} exports nothing, yet its account may write traces or metrics"
    # Each role is granted on the project alone (neither exists on a narrower resource), to exactly those two.
    for role in TELEMETRY_ROLES:
        assert {(g.member, g.target) for g in grants(tf) if g.role == role} == {(m, "project") for m in exporting}


def test_with_otel_enabled_false_no_collector_runs_no_process_exports_and_no_account_may_write_telemetry():
    tf = Terraform(given=WITHOUT_TELEMETRY)
    for kind, name in runs_containers(tf):
        assert sidecars(tf, kind, name) == [], name
    for kind, name in EXPORTING:
        assert container_env(tf, kind, name).plain["SPECIALISTS_OTEL_ENABLED"] == "false", name
        assert tf.resolve(container(tf, kind, name)["depends_on"]) == [], name
    assert not [g for g in grants(tf) if g.role in TELEMETRY_ROLES or g.target == "secret:otel_collector_config"]


# --- docs/OPERATIONS.md, "Traces and metrics in production" --------------------------------------------


def production_section() -> str:
    text = (PROJECT_ROOT / "docs" / "OPERATIONS.md").read_text()
    return text.split("### Traces and metrics in production\n", 1)[1].split("\n### ", 1)[0]


def test_the_docs_name_the_switch_the_roles_the_sidecars_address_and_the_trace_field_of_the_logs(tf):
    section = production_section()
    for named in ("otel_enabled = false", "otel_collector_image", "otel_sampling_ratio", "infra/otel-collector.yaml",
                  config()["receivers"]["otlp"]["protocols"]["http"]["endpoint"], "logging.googleapis.com/trace",
                  "Cloud Trace", "Cloud Monitoring", *TELEMETRY_ROLES):
        assert named in section, named
    text = (PROJECT_ROOT / "docs" / "OPERATIONS.md").read_text()
    assert text.index("### Traces and metrics in production") < text.index("### The release (`cloudbuild.yaml`)")
