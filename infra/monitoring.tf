# Alert policies (issue 42): Cloud Monitoring tells an operator that work cannot run, before a customer does.
# docs/OPERATIONS.md "Alert policies" says what each means and what to do.
#
# Four read the service's own gauges (core/telemetry.py SERVICE_GAUGES), which every dispatcher (the API service's
# relay) exports through the collector beside it as Managed Service for Prometheus series: the metric type is
# prometheus.googleapis.com/<name with dots as underscores, a unit of seconds as _seconds>/gauge on the resource
# prometheus_target. Each API instance exports the same reading of the database, so each condition takes the
# maximum over instances, never the sum. They exist only with otel_enabled (nothing is exported without it).
# Two read Google's own metrics: Cloud Run's request count (the 5xx rate) and Cloud SQL's connections.
#
# tests/deploy/test_monitoring.py reads every filter here against the names the code exports.

locals {
  # Where alerts go: the notification channels' ids (projects/<p>/notificationChannels/<id>), made outside Terraform.
  alert_channels = var.alert_notification_channels
  # The service's own gauges, as Managed Service for Prometheus names them.
  gauge_filter = "resource.type = \"prometheus_target\" AND metric.type = \"prometheus.googleapis.com/%s/gauge\""
  service_alerts = {
    # A served specialist none of whose workers beat within SPECIALISTS_HEALTH_WORKER_LIVE_S: its jobs wait.
    no_live_worker = {
      display_name = "A specialist has no live worker"
      metric       = "specialists_workers_live"
      comparison   = "COMPARISON_LT"
      threshold    = 1
      duration_s   = var.alert_no_live_worker_s
      group_by     = ["metric.label.specialist"]
      aligner      = "ALIGN_MAX"
      documentation = join(" ", [
        "No worker serving $${metric.label.specialist} has beaten within SPECIALISTS_HEALTH_WORKER_LIVE_S: jobs for it",
        "wait. Run `specialists health` (no_live_worker); look at the worker service's logs and instances.",
      ])
    }
    # The oldest job no worker has taken: workers down, full, or refusing.
    job_wait = {
      display_name = "A job has waited too long for a worker"
      metric       = "specialists_queue_age_seconds"
      comparison   = "COMPARISON_GT"
      threshold    = var.alert_job_wait_s
      duration_s   = 60
      group_by     = ["metric.label.specialist"]
      aligner      = "ALIGN_MAX"
      documentation = join(" ", [
        "The oldest job for $${metric.label.specialist} has waited longer than the threshold for a worker.",
        "Run `specialists health` (job_wait_too_long: redelivery counts the jobs a dispatcher tried); the",
        "dispatchers' workers_unreachable and dispatch_retry lines say why.",
      ])
    }
    # Jobs whose outcome is unknown hold their credits until an operator reconciles them.
    unknown_reservations = {
      display_name = "Jobs with an unknown outcome hold credits"
      metric       = "specialists_jobs_unknown_open"
      comparison   = "COMPARISON_GT"
      threshold    = 0
      duration_s   = 300
      group_by     = []
      aligner      = "ALIGN_MAX"
      documentation = join(" ", [
        "A worker died holding a job: its task and reservation are unknown until an operator decides.",
        "`specialists reservations list --unknown`, then `specialists reconcile` with a reason.",
      ])
    }
    # Push notifications that finally failed within SPECIALISTS_HEALTH_FAILURES_WINDOW_S.
    push_failures = {
      display_name = "Push notifications fail"
      metric       = "specialists_push_failed_recent"
      comparison   = "COMPARISON_GT"
      threshold    = var.alert_push_failures
      duration_s   = 60
      group_by     = []
      aligner      = "ALIGN_MAX"
      documentation = join(" ", [
        "More push notifications than the threshold finally failed in the recent window.",
        "`specialists push failures` lists them with the reason, by customer; a stalled deliverer shows as",
        "push_stalled in `specialists health`.",
      ])
    }
  }
}

resource "google_monitoring_alert_policy" "service" {
  for_each     = var.otel_enabled ? local.service_alerts : {}
  display_name = "specialists: ${each.value.display_name}"
  combiner     = "OR"
  depends_on   = [google_project_service.telemetry]

  conditions {
    display_name = each.value.display_name
    condition_threshold {
      filter          = format(local.gauge_filter, each.value.metric)
      comparison      = each.value.comparison
      threshold_value = each.value.threshold
      duration        = "${each.value.duration_s}s"
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = each.value.aligner
        cross_series_reducer = "REDUCE_MAX"
        group_by_fields      = each.value.group_by
      }
      trigger {
        count = 1
      }
    }
  }

  documentation {
    content   = each.value.documentation
    mime_type = "text/markdown"
  }
  notification_channels = local.alert_channels
}

# The A2A edges answer 5xx: Cloud Run's own count of requests, by response class, over the API and gRPC services.
resource "google_monitoring_alert_policy" "edge_5xx" {
  display_name = "specialists: the edge answers 5xx"
  combiner     = "OR"
  depends_on   = [google_project_service.telemetry]

  conditions {
    display_name = "5xx answers per second"
    condition_threshold {
      filter = join(" AND ", [
        "resource.type = \"cloud_run_revision\"",
        "metric.type = \"run.googleapis.com/request_count\"",
        "metric.label.response_code_class = \"5xx\"",
        "resource.label.service_name = one_of(\"${var.api_service_name}\", \"${var.grpc_service_name}\")",
      ])
      comparison      = "COMPARISON_GT"
      threshold_value = var.alert_5xx_per_s
      duration        = "300s"
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_RATE"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["resource.label.service_name"]
      }
      trigger {
        count = 1
      }
    }
  }

  documentation {
    content   = "The edge is failing requests. Its http_request log lines with status >= 500 carry the request_id and code; `specialists health` says whether the database and the workers are there."
    mime_type = "text/markdown"
  }
  notification_channels = local.alert_channels
}

# The database's connections near max_connections (database.tf sets it): a new connection is refused past it.
resource "google_monitoring_alert_policy" "database_connections" {
  display_name = "specialists: database connections near their limit"
  combiner     = "OR"
  depends_on   = [google_project_service.telemetry]

  conditions {
    display_name = "connections over ${var.alert_database_connections_share * 100}% of max_connections"
    condition_threshold {
      filter = join(" AND ", [
        "resource.type = \"cloudsql_database\"",
        "metric.type = \"cloudsql.googleapis.com/database/postgresql/num_backends\"",
        "resource.label.database_id = \"${var.project_id}:${var.database_instance_name}\"",
      ])
      comparison      = "COMPARISON_GT"
      threshold_value = floor(var.database_max_connections * var.alert_database_connections_share)
      duration        = "300s"
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_MAX"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["resource.label.database_id"]
      }
      trigger {
        count = 1
      }
    }
  }

  documentation {
    content   = "PostgreSQL's connections are near max_connections (var.database_max_connections). Each process keeps SPECIALISTS_DB_POOL_SIZE + SPECIALISTS_DB_MAX_OVERFLOW at most: instances times that must stay below it. Lower the pools or the services' max instances, or raise the limit."
    mime_type = "text/markdown"
  }
  notification_channels = local.alert_channels
}

# The public API from outside Google's network: Cloud Monitoring asks /healthz from several regions every minute.
resource "google_monitoring_uptime_check_config" "api" {
  display_name = "specialists: the API answers /healthz"
  timeout      = "10s"
  period       = "60s"
  depends_on   = [google_project_service.telemetry]

  http_check {
    path         = "/healthz"
    port         = 443
    use_ssl      = true
    validate_ssl = true
  }

  monitored_resource {
    type = "uptime_url"
    labels = {
      project_id = var.project_id
      host       = replace(google_cloud_run_v2_service.api.uri, "https://", "")
    }
  }
}

resource "google_monitoring_alert_policy" "api_uptime" {
  display_name = "specialists: the API is unreachable"
  combiner     = "OR"
  depends_on   = [google_project_service.telemetry]

  conditions {
    display_name = "the uptime check fails"
    condition_threshold {
      filter          = "resource.type = \"uptime_url\" AND metric.type = \"monitoring.googleapis.com/uptime_check/check_passed\" AND metric.label.check_id = \"${google_monitoring_uptime_check_config.api.uptime_check_id}\""
      comparison      = "COMPARISON_GT"
      threshold_value = 1
      duration        = "300s"
      aggregations {
        alignment_period     = "1200s"
        per_series_aligner   = "ALIGN_NEXT_OLDER"
        cross_series_reducer = "REDUCE_COUNT_FALSE"
        group_by_fields      = ["resource.label.host"]
      }
      trigger {
        count = 1
      }
    }
  }

  documentation {
    content   = "The public API's /healthz has failed from more than one checker region for 5 minutes. Look at the API service's revisions and logs; `specialists health` says whether the database and the workers are there."
    mime_type = "text/markdown"
  }
  notification_channels = local.alert_channels
}
