# The operator console (`specialists console`, ops/console/): its own Cloud Run service on the one image, behind
# Identity-Aware Proxy enabled on the service itself, so customers never reach it.
#
# Two gates, both required: IAP lets through only the accounts of var.console_operators (and the run.app URL,
# tag URLs included, answers nobody else), then the console verifies IAP's signed header (its audience is this
# service's) and refuses any email not in SPECIALISTS_CONSOLE_OPERATORS, the same list. Behind IAP, only IAP's
# own service agent may invoke the service (Cloud Run's IAM check still runs, after IAP's).
#
# Its account reaches Cloud SQL and reads exactly the database URL, the key-signing secrets (it issues customer
# keys) and its own session secrets: nothing of Cloud Tasks, the workers or the push signing (infra/iam.tf).
#
# IAP directly on Cloud Run needs the project to be in an organization, and lets in identities of that
# organization; it needs no load balancer or OAuth client of ours. In provider 6.x its field is the beta
# provider's (infra/versions.tf); the feature itself is GA, so the service keeps the default launch stage (an API
# that still called it a preview would refuse the apply until `launch_stage = "BETA"` is set here).
# cloudbuild.yaml owns the image and the traffic after the first apply.

locals {
  # The `aud` of the JWT IAP signs for a Cloud Run service of its own (SPECIALISTS_CONSOLE_IAP_AUDIENCE).
  console_iap_audience = "/projects/${data.google_project.this.number}/locations/${var.region}/services/${var.console_service_name}"

  # `specialists console` with auth=iap. Its host (0.0.0.0) comes from the image and its port from PORT
  # (ops/entrypoint.py), as the other listening roles'; IAP's keys are fetched from the settings' default
  # address (SPECIALISTS_CONSOLE_IAP_CERTS_URL), its only outbound call.
  console_env = {
    SPECIALISTS_CONSOLE_AUTH         = "iap"
    SPECIALISTS_CONSOLE_IAP_AUDIENCE = local.console_iap_audience
    SPECIALISTS_CONSOLE_OPERATORS    = join(",", var.console_operators)
    # The only page the console's forms may be posted from (the CSRF check's Origin): its own run.app URL, which
    # Cloud Run makes deterministic (https://SERVICE-PROJECT_NUMBER.REGION.run.app).
    SPECIALISTS_CONSOLE_ALLOWED_ORIGINS = "https://${var.console_service_name}-${data.google_project.this.number}.${var.region}.run.app"
    # The keys it issues must be of the environment the API accepts.
    SPECIALISTS_KEY_ENVIRONMENT = var.key_environment
    SPECIALISTS_LOG_LEVEL       = "INFO"
    # Its share of the connection budget (infra/database.tf).
    SPECIALISTS_DB_POOL_SIZE    = var.database_pools.console.size
    SPECIALISTS_DB_MAX_OVERFLOW = var.database_pools.console.overflow
  }
  console_secret_env = {
    DATABASE_URL                        = google_secret_manager_secret.database_url_operator.secret_id
    SPECIALISTS_KEY_SIGNING_SECRETS     = google_secret_manager_secret.key_signing.secret_id
    SPECIALISTS_CONSOLE_SESSION_SECRETS = google_secret_manager_secret.console_session.secret_id
  }
}

# IAP's service agent (service-PROJECT_NUMBER@gcp-sa-iap.iam.gserviceaccount.com), made to exist so that it can
# be granted the invoker role below before IAP is first used.
resource "google_project_service_identity" "iap" {
  provider   = google-beta
  project    = var.project_id
  service    = "iap.googleapis.com"
  depends_on = [google_project_service.apis]
}

resource "google_cloud_run_v2_service" "console" {
  provider            = google-beta
  name                = var.console_service_name
  location            = var.region
  ingress             = "INGRESS_TRAFFIC_ALL" # operators' browsers, from anywhere; IAP refuses everyone else
  iap_enabled         = true
  deletion_protection = false
  depends_on = [
    google_project_service.apis,
    google_secret_manager_secret_iam_member.console_reads,
    google_secret_manager_secret_version.database_url_operator,
    google_secret_manager_secret_version.console_session,
  ]

  template {
    service_account = google_service_account.console.email
    # Cloud Run's default: a page or a usage CSV of the longest period (SPECIALISTS_CONSOLE_MAX_USAGE_DAYS).
    timeout                          = "300s"
    max_instance_request_concurrency = 40
    execution_environment            = "EXECUTION_ENVIRONMENT_GEN2"

    scaling {
      min_instance_count = 0
      max_instance_count = var.console_max_instances
    }

    # Cloud SQL's private IP through the VPC; the rest (IAP's keys) goes out directly.
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
      args  = ["console"]

      ports {
        container_port = 8080
      }

      resources {
        limits = {
          cpu    = "1"
          memory = "1Gi"
        }
        # CPU only while a page is served: the console does nothing between requests (sessions are rows, signed
        # cookies), so it is billed per request and scales to zero.
        cpu_idle          = true
        startup_cpu_boost = true
      }

      volume_mounts {
        name       = "cloudsql"
        mount_path = local.cloudsql_mount
      }

      dynamic "env" {
        for_each = local.console_env
        content {
          name  = env.key
          value = env.value
        }
      }

      dynamic "env" {
        for_each = local.console_secret_env
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

      # Cloud Run's probes reach the container directly, not through IAP.
      startup_probe {
        period_seconds    = 2
        timeout_seconds   = 2
        failure_threshold = 30
        http_get {
          path = "/healthz"
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

# --- who may reach it ------------------------------------------------------------------------------

# Behind IAP, requests reach Cloud Run as IAP's service agent: the one invoker.
resource "google_cloud_run_v2_service_iam_member" "iap_calls_console" {
  project  = var.project_id
  location = google_cloud_run_v2_service.console.location
  name     = google_cloud_run_v2_service.console.name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_project_service_identity.iap.email}"
}

# Who IAP lets through: the operators, each by their Google account.
resource "google_iap_web_cloud_run_service_iam_member" "operators_open_console" {
  provider               = google-beta
  for_each               = toset(var.console_operators)
  project                = var.project_id
  location               = google_cloud_run_v2_service.console.location
  cloud_run_service_name = google_cloud_run_v2_service.console.name
  role                   = "roles/iap.httpsResourceAccessor"
  member                 = "user:${each.value}"
}
