# The Cloud Tasks queue that carries admitted jobs from the API's relay to the workers.
#
# The dispatch deadline is not a queue setting: the relay sets it on every task from
# SPECIALISTS_DISPATCH_DEADLINE_S (var.dispatch_deadline_s, above every specialist's deadline plus
# the cancel grace; the settings refuse less). Delivery is at least once; the worker's claim makes
# execution at most once.

resource "google_cloud_tasks_queue" "jobs" {
  name       = var.queue_name
  location   = var.region
  depends_on = [google_project_service.apis]

  rate_limits {
    max_dispatches_per_second = var.queue_max_dispatches_per_second
    # Never more deliveries in flight than the workers can run at once: the rest wait in the queue
    # instead of being refused as worker_at_capacity and retried.
    max_concurrent_dispatches = var.worker_max_instances * var.worker_max_concurrent_jobs
  }

  retry_config {
    # Retry without a count limit, for as long as a signed job body stays valid
    # (SPECIALISTS_WORKER_JOB_MAX_AGE_S): later deliveries would be refused as expired anyway.
    max_attempts       = -1
    max_retry_duration = "${var.job_max_age_s}s"
    min_backoff        = "1s"
    max_backoff        = "60s"
    max_doublings      = 6
  }

  stackdriver_logging_config {
    sampling_ratio = 1.0
  }
}
