# Traces and metrics (core/telemetry.py; docs/OPERATIONS.md, "Traces and metrics in production").
#
# Every process of the three exporting services exports OTLP over HTTP to an OpenTelemetry Collector beside it: a
# sidecar container of the same Cloud Run instance, listening on the instance's loopback only. The API service's
# edge and its Cloud Tasks relay, the gRPC service's edge, the worker and its job processes export; the console,
# the migration job and the drill job do not, and their accounts may write neither traces nor metrics.
#
# Google's documented pattern for Cloud Run: Google's build of the Collector, its configuration
# (otel-collector.yaml) a Secret Manager secret mounted as a file, a startup probe on its health endpoint, and the
# service's own container started only once the collector passed it. The collector writes spans to Cloud Trace
# and metrics to Cloud Monitoring (Managed Service for Prometheus) as the instance's account, which holds
# roles/cloudtrace.agent and roles/monitoring.metricWriter for it and may read the configuration's secret
# (infra/iam.tf): nothing more.
#
# otel_enabled = false removes the sidecars and those grants, and tells every process not to export.

locals {
  otel_collector = {
    name = "otel-collector"
    # OTLP/HTTP (protobuf), on the loopback the containers of one instance share. otel-collector.yaml binds the
    # same address; the processes' SPECIALISTS_OTEL_ENDPOINT names it.
    receiver = "127.0.0.1:4318"
    # The health_check extension that Cloud Run's startup probe asks (the one port bound beyond the loopback:
    # Cloud Run probes from outside the container's loopback, and routes no request to a sidecar).
    health_port   = 13133
    config_volume = "otel-collector-config"
    config_dir    = "/etc/otelcol-google"
    config_file   = "config.yaml"
    # Beside 1 vCPU and 1 GiB (API, gRPC) or 2 and 2 GiB (worker). otel-collector.yaml's memory_limiter
    # (200 MiB) refuses data before this limit is reached.
    cpu    = "0.5"
    memory = "256Mi"
  }

  # The sidecar of each exporting service, or none: run.tf's `dynamic "containers"` and `dynamic "volumes"`, and
  # the `depends_on` of each service's own container, read this list.
  otel_sidecars = var.otel_enabled ? [local.otel_collector.name] : []

  # The settings of the exporting services' own containers (core/settings.py, TelemetrySettings). Cloud Run
  # sets K_SERVICE and K_REVISION, the resource's service.name and service.version.
  otel_env = {
    SPECIALISTS_OTEL_ENABLED        = var.otel_enabled ? "true" : "false"
    SPECIALISTS_OTEL_ENDPOINT       = "http://${local.otel_collector.receiver}"
    SPECIALISTS_OTEL_SAMPLING_RATIO = var.otel_sampling_ratio
    # Log lines' logging.googleapis.com/trace names the trace in this project, so Cloud Logging opens it.
    SPECIALISTS_OTEL_PROJECT = var.project_id
  }

  # The accounts the collectors write as: the API's, the gRPC service's and the worker's.
  otel_exporting_accounts = {
    api    = google_service_account.api.email
    grpc   = google_service_account.grpc.email
    worker = google_service_account.worker.email
  }
  otel_writers = { for name, email in local.otel_exporting_accounts : name => email if var.otel_enabled }
}

# The APIs the collector writes to.
resource "google_project_service" "telemetry" {
  for_each = toset([
    "cloudtrace.googleapis.com",
    "monitoring.googleapis.com",
  ])
  service            = each.value
  disable_on_destroy = false
}

# The collector's configuration: nothing in it is secret, but Secret Manager is how Cloud Run mounts a file.
resource "google_secret_manager_secret" "otel_collector_config" {
  secret_id = "specialists-otel-collector-config"
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

# Each revision mounts the version it was created with (run.tf): a changed file reaches the services as new
# revisions, never a running instance.
resource "google_secret_manager_secret_version" "otel_collector_config" {
  secret      = google_secret_manager_secret.otel_collector_config.id
  secret_data = file("${path.module}/otel-collector.yaml")
}
