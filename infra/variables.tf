# What an operator chooses per deployment. Names are shared with cloudbuild.yaml's substitutions
# (tests/deploy checks that they agree); limits are shared with the service's settings.

variable "project_id" {
  description = "The Google Cloud project to deploy into."
  type        = string
}

variable "region" {
  description = "Region of Cloud Run, Cloud SQL, Cloud Tasks and Artifact Registry."
  type        = string
  default     = "europe-west1"
}

# --- names ----------------------------------------------------------------------------------------

variable "api_service_name" {
  description = "Cloud Run service of the A2A edge (`specialists serve`); cloudbuild.yaml _API_SERVICE."
  type        = string
  default     = "specialists-api"
}

variable "grpc_service_name" {
  description = "Cloud Run service of the A2A gRPC binding (`specialists serve` with SPECIALISTS_GRPC_PORT, HTTP/2 end to end); cloudbuild.yaml _GRPC_SERVICE."
  type        = string
  default     = "specialists-grpc"
}

variable "worker_service_name" {
  description = "Cloud Run service of the private workers (`specialists worker`); cloudbuild.yaml _WORKER_SERVICE."
  type        = string
  default     = "specialists-worker"
}

variable "console_service_name" {
  description = "Cloud Run service of the operator console (`specialists console`), behind IAP; cloudbuild.yaml _CONSOLE_SERVICE."
  type        = string
  default     = "specialists-console"
}

variable "migrate_job_name" {
  description = "Cloud Run job that applies migrations (`specialists db upgrade`); cloudbuild.yaml _MIGRATE_JOB."
  type        = string
  default     = "specialists-migrate"
}

variable "drill_job_name" {
  description = "Cloud Run job that drills a new API revision (`specialists drill --target <revision URL>`); cloudbuild.yaml _DRILL_JOB."
  type        = string
  default     = "specialists-drill"
}

variable "repository_id" {
  description = "Artifact Registry repository of the image; cloudbuild.yaml _REPOSITORY."
  type        = string
  default     = "specialists"
}

variable "queue_name" {
  description = "Cloud Tasks queue that carries jobs to the workers (SPECIALISTS_CLOUD_TASKS_QUEUE)."
  type        = string
  default     = "specialists-jobs"
}

variable "database_instance_name" {
  description = "Cloud SQL instance name."
  type        = string
  default     = "specialists"
}

variable "database_name" {
  description = "Database the service uses on the instance."
  type        = string
  default     = "specialists"
}

variable "database_user" {
  description = "Database user the service connects as (its password is generated into Secret Manager)."
  type        = string
  default     = "specialists"
}

variable "image" {
  description = "Image the services start with on the first apply. cloudbuild.yaml deploys every later image, and Terraform leaves the image alone after creation."
  type        = string
  default     = "us-docker.pkg.dev/cloudrun/container/hello"
}

variable "public_url" {
  description = "Base URL customers reach the edge at (a custom domain). Empty: the API service's run.app URL."
  type        = string
  default     = ""
}

variable "grpc_public_url" {
  description = "host:port customers reach the gRPC binding at (a custom domain, TLS on 443). Empty: the gRPC service's run.app host on 443."
  type        = string
  default     = ""
}

variable "key_environment" {
  description = "SPECIALISTS_KEY_ENVIRONMENT: the key prefix this deployment issues and accepts (live or test)."
  type        = string
  default     = "live"

  validation {
    condition     = contains(["live", "test"], var.key_environment)
    error_message = "key_environment is live or test."
  }
}

variable "model_key_env_names" {
  description = "Names of the environment variables that hold model API keys: every api_key_env of infra/model_routes.toml. Each gets a Secret Manager secret, set on the worker."
  type        = set(string)
  default     = ["OPENROUTER_API_KEY"]
}

# --- the operator console -------------------------------------------------------------------------

variable "console_operators" {
  description = "Google accounts (emails) that may use the operator console: each is let through IAP (roles/iap.httpsResourceAccessor on the console service) and listed in SPECIALISTS_CONSOLE_OPERATORS, which the console checks again on every request. No default: a deployment names its operators."
  type        = list(string)

  validation {
    condition     = length(var.console_operators) > 0
    error_message = "console_operators names at least one operator's Google account: without one, nobody can use the console."
  }

  # Lower case: IAM keeps a member's email in lower case, so a mixed-case one would differ from the policy on
  # every plan (the console itself compares in lower case). No comma or space: the list is joined with commas.
  validation {
    condition     = alltrue([for email in var.console_operators : can(regex("^[a-z0-9._%+-]+@[a-z0-9.-]+\\.[a-z]{2,}$", email))])
    error_message = "Each of console_operators is a Google account's email address, in lower case (alice@example.com), without a member prefix such as user:."
  }

  validation {
    condition     = length(distinct(var.console_operators)) == length(var.console_operators)
    error_message = "console_operators lists each account once."
  }
}

variable "console_max_instances" {
  description = "Most console instances: a few operators' browsers (sessions are signed cookies, so any instance serves any of them)."
  type        = number
  default     = 2
}

# --- database -------------------------------------------------------------------------------------

variable "database_tier" {
  description = "Cloud SQL machine tier."
  type        = string
  default     = "db-custom-2-7680"
}

variable "database_availability_type" {
  description = "REGIONAL (a standby in another zone) or ZONAL."
  type        = string
  default     = "REGIONAL"
}

variable "database_backup_retained_count" {
  description = "Daily backups kept."
  type        = number
  default     = 14
}

variable "database_log_retention_days" {
  description = "Days of transaction log kept for point-in-time recovery (1-7)."
  type        = number
  default     = 7
}

# --- limits shared with the service's settings ----------------------------------------------------

variable "dispatch_deadline_s" {
  description = "SPECIALISTS_DISPATCH_DEADLINE_S: how long Cloud Tasks holds one delivery (15-1800). Must exceed every specialist's deadline plus SPECIALISTS_WORKER_CANCEL_GRACE_S."
  type        = number
  default     = 600

  validation {
    condition     = var.dispatch_deadline_s >= 15 && var.dispatch_deadline_s <= 1800
    error_message = "Cloud Tasks accepts a dispatch deadline of 15 to 1800 seconds."
  }
}

variable "job_deadline_s" {
  description = "SPECIALISTS_DISPATCH_JOB_DEADLINE_S: the deadline every job gets (until specs carry their own)."
  type        = number
  default     = 300
}

variable "worker_request_margin_s" {
  description = "How much longer than the dispatch deadline Cloud Run lets a worker request run, so that Cloud Tasks, not Cloud Run, ends a delivery that overran."
  type        = number
  default     = 60
}

variable "job_max_age_s" {
  description = "SPECIALISTS_WORKER_JOB_MAX_AGE_S: the oldest signed job body a worker accepts; also how long the queue retries a task."
  type        = number
  default     = 3600
}

variable "worker_max_concurrent_jobs" {
  description = "SPECIALISTS_WORKER_MAX_CONCURRENT_JOBS, and the worker service's request concurrency."
  type        = number
  default     = 4
}

variable "worker_min_instances" {
  description = "Worker instances kept running, at least 1: a worker beats only while it runs, and health and the alert \"no live worker\" (infra/monitoring.tf) read the beats."
  type        = number
  default     = 1

  validation {
    condition     = var.worker_min_instances >= 1
    error_message = "worker_min_instances must be at least 1: with none running, no worker beats, and health and the alerts say no worker is live whenever the service is idle."
  }
}

variable "worker_max_instances" {
  description = "Most worker instances; with worker_max_concurrent_jobs it bounds the queue's concurrent dispatches."
  type        = number
  default     = 10
}

variable "drill_timeout_s" {
  description = "How long one execution of the drill job may run: every drill scenario against the new revision. cloudbuild.yaml's timeout must leave room for it after the steps before."
  type        = number
  default     = 1800
}

variable "api_min_instances" {
  description = "API instances kept running: at least 1, since the edge's Cloud Tasks relay and lease sweeper run there."
  type        = number
  default     = 1

  validation {
    condition     = var.api_min_instances >= 1
    error_message = "At least one API instance must run: it relays admitted jobs to Cloud Tasks and sweeps expired leases."
  }
}

variable "api_max_instances" {
  description = "Most API instances."
  type        = number
  default     = 20
}

variable "grpc_max_instances" {
  description = "Most gRPC service instances."
  type        = number
  default     = 10
}

# --- the network (infra/database.tf, infra/network.tf) ----------------------------------------------------

variable "run_subnet_cidr" {
  description = "The subnet the API, gRPC and console services and the jobs egress through (Direct VPC): an address per instance, two during a rollout."
  type        = string
  default     = "10.8.0.0/22"
}

variable "worker_subnet_cidr" {
  description = "The workers' own subnet: all their egress goes through it, to Cloud NAT, and the firewall policy lets out only worker_egress_hosts."
  type        = string
  default     = "10.8.4.0/24"
}

variable "worker_egress_hosts" {
  description = "The host names workers may reach on the internet (tcp 443): every route's base_url host in infra/model_routes.toml (tests/deploy checks they agree). Add a route's host here and apply before deploying the route."
  type        = list(string)
  default     = ["openrouter.ai"]
}

# --- secret versions (infra/secrets.tf) ------------------------------------------------------------------

variable "secret_versions" {
  description = "The version each revision reads of a secret Terraform generated, by secret id (specialists-key-signing-secrets = \"3\"); unset: the version Terraform wrote. A rotation adds a version, sets it here and applies: a new revision reads it, and no revision mixes versions."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for version in values(var.secret_versions) : can(regex("^[0-9]+$", version))])
    error_message = "secret_versions are version numbers: never \"latest\", which would let one revision's instances read different versions during a rotation."
  }
}

variable "model_key_versions" {
  description = "The version the workers read of each model key secret, by its variable name (OPENROUTER_API_KEY = \"2\"); unset: version 1, the operator's first (docs/OPERATIONS.md \"First deployment\")."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for version in values(var.model_key_versions) : can(regex("^[0-9]+$", version))])
    error_message = "model_key_versions are version numbers: never \"latest\"."
  }
}

variable "queue_max_dispatches_per_second" {
  description = "Cloud Tasks rate limit: deliveries started per second."
  type        = number
  default     = 20
}

# --- traces and metrics (infra/observability.tf) -------------------------------------------------------

variable "otel_enabled" {
  description = "Traces and metrics: an OpenTelemetry Collector beside the API, gRPC and worker services, exporting to Cloud Trace and Cloud Monitoring (SPECIALISTS_OTEL_ENABLED). false: no sidecar, no export, and the services' accounts lose roles/cloudtrace.agent and roles/monitoring.metricWriter."
  type        = bool
  default     = true
}

variable "otel_collector_image" {
  description = "The Google-Built OpenTelemetry Collector the sidecars run, pinned to a release (a version tag, or a digest); Terraform, not the release, changes it."
  type        = string
  default     = "us-docker.pkg.dev/cloud-ops-agents-artifacts/google-cloud-opentelemetry-collector/otelcol-google:0.160.0"

  validation {
    condition     = can(regex("(:[0-9]+\\.[0-9]+\\.[0-9]+|@sha256:[0-9a-f]{64})$", var.otel_collector_image))
    error_message = "otel_collector_image is pinned: it ends in a version tag (:0.160.0) or a digest (@sha256:...), never :latest or no tag."
  }
}

variable "otel_sampling_ratio" {
  description = "SPECIALISTS_OTEL_SAMPLING_RATIO: the share of new traces recorded (0-1); Cloud Trace bills per span ingested. Its default is the setting's (docs/BENCHMARKS.md: 1 costs the edge 10-13% more CPU per admission)."
  type        = number
  default     = 0.1

  validation {
    condition     = var.otel_sampling_ratio >= 0 && var.otel_sampling_ratio <= 1
    error_message = "otel_sampling_ratio is a share of traces, from 0 to 1."
  }
}

# --- alert policies (infra/monitoring.tf; docs/OPERATIONS.md "Alert policies") ---------------------------------

variable "alert_notification_channels" {
  description = "Cloud Monitoring notification channels every alert policy notifies (projects/<p>/notificationChannels/<id>); none: the incidents are only in the console."
  type        = list(string)
  default     = []
}

variable "alert_no_live_worker_s" {
  description = "How long a served specialist may have no live worker (its gauge specialists_workers_live below 1) before the alert; SPECIALISTS_HEALTH_WORKER_LIVE_S has already passed by then."
  type        = number
  default     = 120
}

variable "alert_job_wait_s" {
  description = "Age of the oldest job no worker has taken (specialists_queue_age_seconds) past which the alert fires; as SPECIALISTS_HEALTH_MAX_JOB_WAIT_S."
  type        = number
  default     = 300
}

variable "alert_push_failures" {
  description = "Push notifications that finally failed within SPECIALISTS_HEALTH_FAILURES_WINDOW_S (specialists_push_failed_recent) past which the alert fires."
  type        = number
  default     = 10
}

variable "alert_5xx_per_s" {
  description = "5xx answers per second, summed over an edge service's instances, past which the alert fires (for 5 minutes)."
  type        = number
  default     = 0.1
}

variable "database_max_connections" {
  description = "PostgreSQL's max_connections on the instance (a database flag): every process's pool at every service's maximum instances must fit in it (infra/database.tf's connection budget; the plan is refused otherwise). About 2-3 MB of the tier's memory per idle connection."
  type        = number
  default     = 600
}

variable "database_pools" {
  description = "Each role's connection pool per process (SPECIALISTS_DB_POOL_SIZE and SPECIALISTS_DB_MAX_OVERFLOW in its containers): api, grpc, worker (the worker and each job process), console, and jobs (migration and drill). Their worst case counts against database_max_connections."
  type = object({
    api     = object({ size = number, overflow = number })
    grpc    = object({ size = number, overflow = number })
    worker  = object({ size = number, overflow = number })
    console = object({ size = number, overflow = number })
    jobs    = object({ size = number, overflow = number })
  })
  default = {
    api     = { size = 3, overflow = 2 }
    grpc    = { size = 3, overflow = 2 }
    worker  = { size = 2, overflow = 1 }
    console = { size = 2, overflow = 1 }
    jobs    = { size = 2, overflow = 1 }
  }
}

variable "alert_database_connections_share" {
  description = "Share of database_max_connections in use past which the alert fires."
  type        = number
  default     = 0.8

  validation {
    condition     = var.alert_database_connections_share > 0 && var.alert_database_connections_share < 1
    error_message = "alert_database_connections_share is a share of max_connections, between 0 and 1."
  }
}
