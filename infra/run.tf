# The three Cloud Run services of the A2A path (the public A2A edge, its gRPC binding, the private workers), the
# migration job and the drill job, all on the one image (../Dockerfile), and every setting each needs, by its real name
# (core/settings.py; docs/SETTINGS.md). Plain values in *_env, Secret Manager secrets in *_secret_env
# (name => secret id). The operator console, a fourth service on the same image, is infra/console.tf. The three
# services export traces and metrics to an OpenTelemetry Collector sidecar of their own (infra/observability.tf).
# tests/deploy/test_infra.py starts the real service from these maps.
#
# cloudbuild.yaml owns the image and the API's traffic after the first apply (lifecycle below).

locals {
  # Cloud Run's deterministic URLs (https://SERVICE-PROJECT_NUMBER.REGION.run.app). The worker's own
  # audience must be known before the worker service exists, so it cannot come from its `uri`.
  worker_url     = "https://${var.worker_service_name}-${data.google_project.this.number}.${var.region}.run.app"
  api_run_url    = "https://${var.api_service_name}-${data.google_project.this.number}.${var.region}.run.app"
  api_public_url = coalesce(var.public_url, local.api_run_url)
  # gRPC clients dial host:port; Cloud Run serves every service with TLS on 443.
  grpc_run_address = "${var.grpc_service_name}-${data.google_project.this.number}.${var.region}.run.app:443"
  grpc_public_url  = coalesce(var.grpc_public_url, local.grpc_run_address)
  # The gRPC service's container port (Cloud Run's PORT), which the binding listens on; the same process's
  # HTTP bindings listen on another port that Cloud Run routes nothing to (one port per service).
  grpc_container_port = 8080
  grpc_edge_http_port = 8081

  # Each service's own container, named beside the collector sidecar of the exporting services
  # (infra/observability.tf); the release deploys its image.
  app_container = "app"

  # Inside the image (WORKDIR /app): the routes of the deployed specialists.
  model_routes_file = "/app/infra/model_routes.toml"
  cloudsql_mount    = "/cloudsql"

  # `specialists serve` on Cloud Run: the edge, and the Cloud Tasks relay (with the lease sweeper) as its child.
  api_env = {
    SPECIALISTS_KEY_ENVIRONMENT          = var.key_environment
    SPECIALISTS_EDGE_PUBLIC_URL          = local.api_public_url
    SPECIALISTS_GRPC_PUBLIC_URL          = local.grpc_public_url
    SPECIALISTS_SERVE_WORKER             = "false"
    SPECIALISTS_SERVE_DISPATCHER         = "true"
    SPECIALISTS_SERVE_CONSOLE            = "false" # the console is a service of its own (infra/console.tf)
    SPECIALISTS_DISPATCH_BACKEND         = "cloud_tasks"
    SPECIALISTS_CLOUD_TASKS_PROJECT      = var.project_id
    SPECIALISTS_CLOUD_TASKS_LOCATION     = google_cloud_tasks_queue.jobs.location
    SPECIALISTS_CLOUD_TASKS_QUEUE        = google_cloud_tasks_queue.jobs.name
    SPECIALISTS_DISPATCH_WORKER_URL      = "${local.worker_url}/jobs"
    SPECIALISTS_DISPATCH_SERVICE_ACCOUNT = google_service_account.invoker.email
    SPECIALISTS_WORKER_AUDIENCE          = local.worker_url
    SPECIALISTS_DISPATCH_DEADLINE_S      = var.dispatch_deadline_s
    SPECIALISTS_DISPATCH_JOB_DEADLINE_S  = var.job_deadline_s
    SPECIALISTS_LOG_LEVEL                = "INFO"
    # Its share of the connection budget (infra/database.tf).
    SPECIALISTS_DB_POOL_SIZE    = var.database_pools.api.size
    SPECIALISTS_DB_MAX_OVERFLOW = var.database_pools.api.overflow
  }
  api_secret_env = {
    DATABASE_URL                     = google_secret_manager_secret.database_url_edge.secret_id
    SPECIALISTS_KEY_SIGNING_SECRETS  = google_secret_manager_secret.key_signing.secret_id
    SPECIALISTS_WORKER_JOB_SECRETS   = google_secret_manager_secret.worker_job.secret_id
    SPECIALISTS_METRICS_TOKEN        = google_secret_manager_secret.metrics_token.secret_id
    SPECIALISTS_PUSH_SIGNING_SECRETS = google_secret_manager_secret.push_signing.secret_id
  }

  # `specialists serve` on the gRPC service: the same edge (same cards), serving the gRPC binding on the
  # container's port, as an account of its own. Its admitted jobs reach Cloud Tasks through the API's relay (the
  # outbox is in the database), so it runs no relay of its own: it neither enqueues nor acts as the invoker, and
  # reads no worker job secret. api_env's values, but the ports, the dispatcher and its pool (tests/deploy checks
  # it); the API's secrets but the relay's (a live edge refuses to start without the metrics token).
  grpc_env = {
    SPECIALISTS_KEY_ENVIRONMENT          = var.key_environment
    SPECIALISTS_EDGE_PUBLIC_URL          = local.api_public_url
    SPECIALISTS_GRPC_PUBLIC_URL          = local.grpc_public_url
    SPECIALISTS_GRPC_PORT                = local.grpc_container_port
    SPECIALISTS_EDGE_PORT                = local.grpc_edge_http_port
    SPECIALISTS_SERVE_WORKER             = "false"
    SPECIALISTS_SERVE_DISPATCHER         = "false"
    SPECIALISTS_SERVE_CONSOLE            = "false"
    SPECIALISTS_DISPATCH_BACKEND         = "cloud_tasks"
    SPECIALISTS_CLOUD_TASKS_PROJECT      = var.project_id
    SPECIALISTS_CLOUD_TASKS_LOCATION     = google_cloud_tasks_queue.jobs.location
    SPECIALISTS_CLOUD_TASKS_QUEUE        = google_cloud_tasks_queue.jobs.name
    SPECIALISTS_DISPATCH_WORKER_URL      = "${local.worker_url}/jobs"
    SPECIALISTS_DISPATCH_SERVICE_ACCOUNT = google_service_account.invoker.email
    SPECIALISTS_WORKER_AUDIENCE          = local.worker_url
    SPECIALISTS_DISPATCH_DEADLINE_S      = var.dispatch_deadline_s
    SPECIALISTS_DISPATCH_JOB_DEADLINE_S  = var.job_deadline_s
    SPECIALISTS_LOG_LEVEL                = "INFO"
    SPECIALISTS_DB_POOL_SIZE             = var.database_pools.grpc.size
    SPECIALISTS_DB_MAX_OVERFLOW          = var.database_pools.grpc.overflow
  }
  grpc_secret_env = {
    DATABASE_URL                     = google_secret_manager_secret.database_url_edge.secret_id
    SPECIALISTS_KEY_SIGNING_SECRETS  = google_secret_manager_secret.key_signing.secret_id
    SPECIALISTS_METRICS_TOKEN        = google_secret_manager_secret.metrics_token.secret_id
    SPECIALISTS_PUSH_SIGNING_SECRETS = google_secret_manager_secret.push_signing.secret_id
  }

  # `specialists worker`: OIDC from the invoker account and a signed body, both bound to its own URL.
  worker_env = {
    SPECIALISTS_WORKER_AUDIENCE            = local.worker_url
    SPECIALISTS_DISPATCH_SERVICE_ACCOUNT   = google_service_account.invoker.email
    SPECIALISTS_WORKER_OIDC_VERIFY         = "true"
    SPECIALISTS_WORKER_MAX_CONCURRENT_JOBS = var.worker_max_concurrent_jobs
    SPECIALISTS_WORKER_JOB_MAX_AGE_S       = var.job_max_age_s
    SPECIALISTS_DISPATCH_DEADLINE_S        = var.dispatch_deadline_s
    SPECIALISTS_DISPATCH_JOB_DEADLINE_S    = var.job_deadline_s
    SPECIALISTS_MODEL_ROUTES_FILE          = local.model_routes_file
    SPECIALISTS_LOG_LEVEL                  = "INFO"
    # The worker's and each job process's (infra/database.tf).
    SPECIALISTS_DB_POOL_SIZE    = var.database_pools.worker.size
    SPECIALISTS_DB_MAX_OVERFLOW = var.database_pools.worker.overflow
  }
  worker_secret_env = {
    DATABASE_URL                          = google_secret_manager_secret.database_url_worker.secret_id
    SPECIALISTS_WORKER_JOB_SECRETS        = google_secret_manager_secret.worker_job.secret_id
    SPECIALISTS_SPECIALIST_CHECKPOINT_KEY = google_secret_manager_secret.checkpoint_key.secret_id
  }

  # `specialists db upgrade`.
  migrate_env = {
    SPECIALISTS_LOG_LEVEL       = "INFO"
    SPECIALISTS_DB_POOL_SIZE    = var.database_pools.jobs.size
    SPECIALISTS_DB_MAX_OVERFLOW = var.database_pools.jobs.overflow
  }
  migrate_secret_env = {
    DATABASE_URL = google_secret_manager_secret.database_url.secret_id
  }

  # `specialists drill --target <URL>`, with an operator's access, as `specialists keys`, `credits` and
  # `ledger` get it on an operator's host: the database (drill keys, credits for `drill-…` customers,
  # reservations, settlements, `ledger verify`), and the API's key-signing secrets and key environment,
  # so that the API accepts the keys the drill issues.
  drill_env = {
    SPECIALISTS_KEY_ENVIRONMENT = var.key_environment
    SPECIALISTS_LOG_LEVEL       = "INFO"
    SPECIALISTS_DB_POOL_SIZE    = var.database_pools.jobs.size
    SPECIALISTS_DB_MAX_OVERFLOW = var.database_pools.jobs.overflow
    # The bounds the drill checks must be the ones the deployment runs with: any of
    # SPECIALISTS_WORKER_HEARTBEAT_S, SPECIALISTS_WORKER_CANCEL_GRACE_S, SPECIALISTS_WORKER_LEASE_S,
    # SPECIALISTS_DISPATCH_SWEEP_INTERVAL_S and SPECIALISTS_REVOCATION_CACHE_S set in api_env or
    # worker_env is set here to the same value (tests/deploy/test_infra.py checks it). None is set now:
    # the services and the drill all run with the settings' defaults.
    #
    # The process-control hooks (SPECIALISTS_DRILL_RESTART_API_HOOK, SPECIALISTS_DRILL_RESTART_WORKER_HOOK,
    # SPECIALISTS_DRILL_KILL_WORKER_HOOK, SPECIALISTS_DRILL_ROLL_API_HOOK) stay unset: the image has no
    # gcloud to restart, kill or roll a service with, so the drill reports those scenarios as skipped,
    # naming the setting.
  }
  drill_secret_env = {
    DATABASE_URL                    = google_secret_manager_secret.database_url_operator.secret_id
    SPECIALISTS_KEY_SIGNING_SECRETS = google_secret_manager_secret.key_signing.secret_id
  }

  vpc_egress = {
    network    = google_compute_network.vpc.id
    subnetwork = google_compute_subnetwork.run.id
  }
  # The workers' own subnet: all their egress goes through it (infra/network.tf).
  worker_vpc_egress = {
    network    = google_compute_network.vpc.id
    subnetwork = google_compute_subnetwork.worker.id
  }
}

# --- the A2A edge: public ---------------------------------------------------------------------------

resource "google_cloud_run_v2_service" "api" {
  name                = var.api_service_name
  location            = var.region
  ingress             = "INGRESS_TRAFFIC_ALL"
  deletion_protection = false
  # Public without an allUsers grant: Cloud Run skips its invoker check, the service checks the customer's key
  # (infra/iam.tf; docs/OPERATIONS.md "Who may reach what").
  invoker_iam_disabled = true
  depends_on = [
    google_project_service.apis,
    google_secret_manager_secret_iam_member.api_reads,
    google_secret_manager_secret_version.database_url_edge,
    google_secret_manager_secret_version.metrics_token,
    google_secret_manager_secret_version.push_signing,
    google_project_service.telemetry,
    google_secret_manager_secret_version.otel_collector_config,
    google_secret_manager_secret_iam_member.otel_config_reads,
    google_project_iam_member.otel_trace_agent,
    google_project_iam_member.otel_metric_writer,
  ]

  template {
    service_account = google_service_account.api.email
    # Streams (SendStreamingMessage, subscribe) stay open up to Cloud Run's longest request.
    timeout                          = "3600s"
    max_instance_request_concurrency = 80
    execution_environment            = "EXECUTION_ENVIRONMENT_GEN2"

    scaling {
      # The relay and the lease sweeper live in the API instances: one must always run.
      min_instance_count = var.api_min_instances
      max_instance_count = var.api_max_instances
    }

    vpc_access {
      network_interfaces {
        network    = local.vpc_egress.network
        subnetwork = local.vpc_egress.subnetwork
      }
      egress = "PRIVATE_RANGES_ONLY"
    }

    volumes {
      name = "cloudsql"
      cloud_sql_instance {
        instances = [google_sql_database_instance.main.connection_name]
      }
    }

    # The collector's configuration, the version Terraform wrote (infra/observability.tf).
    dynamic "volumes" {
      for_each = local.otel_sidecars
      content {
        name = local.otel_collector.config_volume
        secret {
          secret = google_secret_manager_secret.otel_collector_config.secret_id
          items {
            version = google_secret_manager_secret_version.otel_collector_config.version
            path    = local.otel_collector.config_file
          }
        }
      }
    }

    containers {
      name       = local.app_container
      image      = var.image
      depends_on = local.otel_sidecars # started once the collector passed its startup probe
      args       = ["serve"]

      ports {
        container_port = 8080
      }

      resources {
        limits = {
          cpu    = "1"
          memory = "1Gi"
        }
        # The relay, the sweeper and the LISTEN connection work between requests: CPU always allocated.
        cpu_idle          = false
        startup_cpu_boost = true
      }

      volume_mounts {
        name       = "cloudsql"
        mount_path = local.cloudsql_mount
      }

      dynamic "env" {
        for_each = local.api_env
        content {
          name  = env.key
          value = env.value
        }
      }

      dynamic "env" {
        for_each = local.api_secret_env
        content {
          name = env.key
          value_source {
            secret_key_ref {
              secret  = env.value
              version = local.secret_versions[env.value]
            }
          }
        }
      }

      dynamic "env" {
        for_each = local.otel_env
        content {
          name  = env.key
          value = env.value
        }
      }

      # Ready = the database answers and its schema is at the code's head (run the migration job first).
      startup_probe {
        period_seconds    = 2
        timeout_seconds   = 2
        failure_threshold = 30
        http_get {
          path = "/readyz"
        }
      }

      liveness_probe {
        period_seconds    = 15
        timeout_seconds   = 3
        failure_threshold = 4
        http_get {
          path = "/healthz"
        }
      }
    }

    # The OpenTelemetry Collector (infra/observability.tf), when otel_enabled: this container starts first.
    dynamic "containers" {
      for_each = local.otel_sidecars
      content {
        name  = containers.value
        image = var.otel_collector_image
        args  = ["--config=${local.otel_collector.config_dir}/${local.otel_collector.config_file}"]

        resources {
          limits = {
            cpu    = local.otel_collector.cpu
            memory = local.otel_collector.memory
          }
          cpu_idle = false # as the service's own container: the collector exports between requests
        }

        volume_mounts {
          name       = local.otel_collector.config_volume
          mount_path = local.otel_collector.config_dir
        }

        startup_probe {
          period_seconds    = 2
          timeout_seconds   = 2
          failure_threshold = 30
          http_get {
            path = "/"
            port = local.otel_collector.health_port
          }
        }
      }
    }
  }

  traffic {
    type    = "TRAFFIC_TARGET_ALLOCATION_TYPE_LATEST"
    percent = 100
  }

  lifecycle {
    # cloudbuild.yaml deploys each image as a tagged revision without traffic and moves traffic after the drill.
    ignore_changes = [template[0].containers[0].image, traffic, client, client_version]
  }
}

# --- the gRPC binding: public, HTTP/2 end to end ---------------------------------------------------

resource "google_cloud_run_v2_service" "grpc" {
  name                = var.grpc_service_name
  location            = var.region
  ingress             = "INGRESS_TRAFFIC_ALL"
  deletion_protection = false
  # Public without an allUsers grant: Cloud Run skips its invoker check, the service checks the customer's key
  # (infra/iam.tf; docs/OPERATIONS.md "Who may reach what").
  invoker_iam_disabled = true
  depends_on = [
    google_project_service.apis,
    google_secret_manager_secret_iam_member.grpc_reads,
    google_secret_manager_secret_version.database_url_edge,
    google_secret_manager_secret_version.push_signing,
    google_secret_manager_secret_version.metrics_token,
    google_project_service.telemetry,
    google_secret_manager_secret_version.otel_collector_config,
    google_secret_manager_secret_iam_member.otel_config_reads,
    google_project_iam_member.otel_trace_agent,
    google_project_iam_member.otel_metric_writer,
  ]

  template {
    service_account = google_service_account.grpc.email
    # Streams (SendStreamingMessage, SubscribeToTask) stay open up to Cloud Run's longest request.
    timeout                          = "3600s"
    max_instance_request_concurrency = 80
    execution_environment            = "EXECUTION_ENVIRONMENT_GEN2"

    scaling {
      min_instance_count = 0
      max_instance_count = var.grpc_max_instances
    }

    vpc_access {
      network_interfaces {
        network    = local.vpc_egress.network
        subnetwork = local.vpc_egress.subnetwork
      }
      egress = "PRIVATE_RANGES_ONLY"
    }

    volumes {
      name = "cloudsql"
      cloud_sql_instance {
        instances = [google_sql_database_instance.main.connection_name]
      }
    }

    # The collector's configuration, the version Terraform wrote (infra/observability.tf).
    dynamic "volumes" {
      for_each = local.otel_sidecars
      content {
        name = local.otel_collector.config_volume
        secret {
          secret = google_secret_manager_secret.otel_collector_config.secret_id
          items {
            version = google_secret_manager_secret_version.otel_collector_config.version
            path    = local.otel_collector.config_file
          }
        }
      }
    }

    containers {
      name       = local.app_container
      image      = var.image
      depends_on = local.otel_sidecars # started once the collector passed its startup probe
      args       = ["serve"]

      # h2c: Cloud Run forwards HTTP/2 to the container without TLS (gRPC needs HTTP/2 end to end).
      ports {
        name           = "h2c"
        container_port = local.grpc_container_port
      }

      resources {
        limits = {
          cpu    = "1"
          memory = "1Gi"
        }
        # CPU only while a request (a call or a stream) is open: the gRPC edge runs nothing between requests (no
        # relay, no sweeper), so it is billed per request and may scale to zero.
        cpu_idle          = true
        startup_cpu_boost = true
      }

      volume_mounts {
        name       = "cloudsql"
        mount_path = local.cloudsql_mount
      }

      dynamic "env" {
        for_each = local.grpc_env
        content {
          name  = env.key
          value = env.value
        }
      }

      dynamic "env" {
        for_each = local.grpc_secret_env
        content {
          name = env.key
          value_source {
            secret_key_ref {
              secret  = env.value
              version = local.secret_versions[env.value]
            }
          }
        }
      }

      dynamic "env" {
        for_each = local.otel_env
        content {
          name  = env.key
          value = env.value
        }
      }

      # The gRPC port opens only after the edge found the schema at the code's head (its start-up refuses
      # otherwise), so a TCP probe on it means what the API's /readyz means at start. Cloud Run routes no
      # HTTP/1 path to this service, and its liveness probes speak only HTTP or gRPC health (not served).
      startup_probe {
        period_seconds    = 2
        timeout_seconds   = 2
        failure_threshold = 30
        tcp_socket {
          port = local.grpc_container_port
        }
      }
    }

    # The OpenTelemetry Collector (infra/observability.tf), when otel_enabled: this container starts first.
    dynamic "containers" {
      for_each = local.otel_sidecars
      content {
        name  = containers.value
        image = var.otel_collector_image
        args  = ["--config=${local.otel_collector.config_dir}/${local.otel_collector.config_file}"]

        resources {
          limits = {
            cpu    = local.otel_collector.cpu
            memory = local.otel_collector.memory
          }
          # As the service's own container (Cloud Run allocates CPU per instance): the collector exports on each
          # request's CPU and at shutdown, when Cloud Run gives the instance CPU to stop.
          cpu_idle = true
        }

        volume_mounts {
          name       = local.otel_collector.config_volume
          mount_path = local.otel_collector.config_dir
        }

        startup_probe {
          period_seconds    = 2
          timeout_seconds   = 2
          failure_threshold = 30
          http_get {
            path = "/"
            port = local.otel_collector.health_port
          }
        }
      }
    }
  }

  traffic {
    type    = "TRAFFIC_TARGET_ALLOCATION_TYPE_LATEST"
    percent = 100
  }

  lifecycle {
    # cloudbuild.yaml deploys each image as a tagged revision without traffic, as the API's.
    ignore_changes = [template[0].containers[0].image, traffic, client, client_version]
  }
}

# --- the workers: private -------------------------------------------------------------------------

resource "google_cloud_run_v2_service" "worker" {
  name                = var.worker_service_name
  location            = var.region
  ingress             = "INGRESS_TRAFFIC_INTERNAL_ONLY" # Cloud Tasks counts as internal; the internet does not
  deletion_protection = false
  depends_on = [
    google_project_service.apis,
    google_secret_manager_secret_iam_member.worker_reads,
    google_secret_manager_secret_iam_member.worker_reads_model_keys,
    google_secret_manager_secret_version.database_url_worker,
    google_compute_router_nat.worker,
    google_compute_network_firewall_policy_association.vpc,
    google_project_service.telemetry,
    google_secret_manager_secret_version.otel_collector_config,
    google_secret_manager_secret_iam_member.otel_config_reads,
    google_project_iam_member.otel_trace_agent,
    google_project_iam_member.otel_metric_writer,
  ]

  template {
    service_account = google_service_account.worker.email
    # A delivery holds its request for the whole job: Cloud Run must not end it before Cloud Tasks' deadline.
    timeout = "${var.dispatch_deadline_s + var.worker_request_margin_s}s"
    # Cloud Run sends no more requests to an instance than the worker runs jobs at once.
    max_instance_request_concurrency = var.worker_max_concurrent_jobs
    execution_environment            = "EXECUTION_ENVIRONMENT_GEN2"

    # At least one worker always runs and beats (workers/beat.py, every SPECIALISTS_WORKER_BEAT_S): health and the
    # alert "no live worker" (infra/monitoring.tf) tell a dead worker service from an idle one by its beats.
    scaling {
      min_instance_count = var.worker_min_instances
      max_instance_count = var.worker_max_instances
    }

    # Every packet leaves through the workers' subnet: Cloud NAT for the internet, where the firewall policy lets
    # out only the model endpoints' hosts (infra/network.tf). The jobs run model-driven code.
    vpc_access {
      network_interfaces {
        network    = local.worker_vpc_egress.network
        subnetwork = local.worker_vpc_egress.subnetwork
      }
      egress = "ALL_TRAFFIC"
    }

    volumes {
      name = "cloudsql"
      cloud_sql_instance {
        instances = [google_sql_database_instance.main.connection_name]
      }
    }

    # The collector's configuration, the version Terraform wrote (infra/observability.tf).
    dynamic "volumes" {
      for_each = local.otel_sidecars
      content {
        name = local.otel_collector.config_volume
        secret {
          secret = google_secret_manager_secret.otel_collector_config.secret_id
          items {
            version = google_secret_manager_secret_version.otel_collector_config.version
            path    = local.otel_collector.config_file
          }
        }
      }
    }

    containers {
      name       = local.app_container
      image      = var.image
      depends_on = local.otel_sidecars # started once the collector passed its startup probe
      args       = ["worker"]

      ports {
        container_port = 8080
      }

      resources {
        limits = {
          cpu    = "2"
          memory = "2Gi"
        }
        # The beat and the jobs' lease heartbeats work between requests: CPU always allocated.
        cpu_idle          = false
        startup_cpu_boost = true
      }

      volume_mounts {
        name       = "cloudsql"
        mount_path = local.cloudsql_mount
      }

      dynamic "env" {
        for_each = local.worker_env
        content {
          name  = env.key
          value = env.value
        }
      }

      dynamic "env" {
        for_each = local.worker_secret_env
        content {
          name = env.key
          value_source {
            secret_key_ref {
              secret  = env.value
              version = local.secret_versions[env.value]
            }
          }
        }
      }

      dynamic "env" {
        for_each = local.otel_env
        content {
          name  = env.key
          value = env.value
        }
      }

      # The model keys, each under the variable name its route reads (infra/model_routes.toml).
      dynamic "env" {
        for_each = google_secret_manager_secret.model_key
        content {
          name = env.key
          value_source {
            secret_key_ref {
              secret  = env.value.secret_id
              version = local.secret_versions[env.value.secret_id]
            }
          }
        }
      }

      # Ready = every specialist it should serve is served (routes, keys, checkpoint key).
      startup_probe {
        period_seconds    = 2
        timeout_seconds   = 2
        failure_threshold = 30
        http_get {
          path = "/readyz"
        }
      }

      liveness_probe {
        period_seconds    = 15
        timeout_seconds   = 3
        failure_threshold = 4
        http_get {
          path = "/healthz"
        }
      }
    }

    # The OpenTelemetry Collector (infra/observability.tf), when otel_enabled: this container starts first.
    dynamic "containers" {
      for_each = local.otel_sidecars
      content {
        name  = containers.value
        image = var.otel_collector_image
        args  = ["--config=${local.otel_collector.config_dir}/${local.otel_collector.config_file}"]

        resources {
          limits = {
            cpu    = local.otel_collector.cpu
            memory = local.otel_collector.memory
          }
          cpu_idle = false # as the worker's own container: the collector exports between requests
        }

        volume_mounts {
          name       = local.otel_collector.config_volume
          mount_path = local.otel_collector.config_dir
        }

        startup_probe {
          period_seconds    = 2
          timeout_seconds   = 2
          failure_threshold = 30
          http_get {
            path = "/"
            port = local.otel_collector.health_port
          }
        }
      }
    }
  }

  traffic {
    type    = "TRAFFIC_TARGET_ALLOCATION_TYPE_LATEST"
    percent = 100
  }

  lifecycle {
    # cloudbuild.yaml deploys each image as a tagged revision without traffic and moves traffic after the drill.
    ignore_changes = [template[0].containers[0].image, traffic, client, client_version]
  }
}

# --- the migration job ----------------------------------------------------------------------------

resource "google_cloud_run_v2_job" "migrate" {
  name                = var.migrate_job_name
  location            = var.region
  deletion_protection = false
  depends_on = [
    google_project_service.apis,
    google_secret_manager_secret_iam_member.migrate_reads,
    google_secret_manager_secret_version.database_url,
  ]

  template {
    task_count  = 1
    parallelism = 1

    template {
      service_account = google_service_account.migrate.email
      timeout         = "900s"
      max_retries     = 0 # a failed migration is looked at, not repeated

      vpc_access {
        network_interfaces {
          network    = local.vpc_egress.network
          subnetwork = local.vpc_egress.subnetwork
        }
        egress = "PRIVATE_RANGES_ONLY"
      }

      volumes {
        name = "cloudsql"
        cloud_sql_instance {
          instances = [google_sql_database_instance.main.connection_name]
        }
      }

      containers {
        image = var.image
        args  = ["db", "upgrade"]

        volume_mounts {
          name       = "cloudsql"
          mount_path = local.cloudsql_mount
        }

        dynamic "env" {
          for_each = local.migrate_env
          content {
            name  = env.key
            value = env.value
          }
        }

        dynamic "env" {
          for_each = local.migrate_secret_env
          content {
            name = env.key
            value_source {
              secret_key_ref {
                secret  = env.value
                version = local.secret_versions[env.value]
              }
            }
          }
        }
      }
    }
  }

  lifecycle {
    ignore_changes = [template[0].template[0].containers[0].image, client, client_version]
  }
}

# --- the drill job --------------------------------------------------------------------------------

# Runs inside the project, so it reaches Cloud SQL the way the migration job does; it calls the API
# at its public URL like any customer. It may not enqueue jobs or call the workers (infra/iam.tf).
resource "google_cloud_run_v2_job" "drill" {
  name                = var.drill_job_name
  location            = var.region
  deletion_protection = false
  depends_on = [
    google_project_service.apis,
    google_secret_manager_secret_iam_member.drill_reads,
    google_secret_manager_secret_version.database_url_operator,
    google_secret_manager_secret_version.key_signing,
  ]

  template {
    task_count  = 1
    parallelism = 1

    template {
      service_account = google_service_account.drill.email
      timeout         = "${var.drill_timeout_s}s"
      max_retries     = 0 # a failed drill stops the release; a retry could hide the failure

      vpc_access {
        network_interfaces {
          network    = local.vpc_egress.network
          subnetwork = local.vpc_egress.subnetwork
        }
        egress = "PRIVATE_RANGES_ONLY" # the API's run.app URL is public: reached directly, not through the VPC
      }

      volumes {
        name = "cloudsql"
        cloud_sql_instance {
          instances = [google_sql_database_instance.main.connection_name]
        }
      }

      containers {
        image = var.image
        # The release executes the job with the new API revision's tag URL instead (cloudbuild.yaml
        # overrides these args); executed by hand as it is, it drills the revision with the traffic.
        args = ["drill", "--target", local.api_run_url]

        resources {
          limits = {
            cpu    = "1"
            memory = "1Gi"
          }
        }

        volume_mounts {
          name       = "cloudsql"
          mount_path = local.cloudsql_mount
        }

        dynamic "env" {
          for_each = local.drill_env
          content {
            name  = env.key
            value = env.value
          }
        }

        dynamic "env" {
          for_each = local.drill_secret_env
          content {
            name = env.key
            value_source {
              secret_key_ref {
                secret  = env.value
                version = local.secret_versions[env.value]
              }
            }
          }
        }
      }
    }
  }

  lifecycle {
    ignore_changes = [template[0].template[0].containers[0].image, client, client_version]
  }
}
