# Service accounts, one per role, each with only what that role does:
#   api       runs the edge and its Cloud Tasks relay: reaches Cloud SQL, enqueues on the jobs queue,
#             and acts as the invoker account (Cloud Tasks mints the invoker's OIDC token for its tasks);
#             its collector sidecar writes traces and metrics (infra/observability.tf)
#   grpc      runs the gRPC binding's edge: reaches Cloud SQL and reads the key-signing, push-signing and metrics
#             token secrets;
#             it runs no relay, so nothing of Cloud Tasks, the invoker or the worker job secrets; its collector
#             sidecar writes traces and metrics
#   invoker   the identity of Cloud Tasks deliveries: may invoke the worker service, nothing else
#   worker    runs jobs: reaches Cloud SQL; its collector sidecar writes traces and metrics
#   migrate   the migration job: reaches Cloud SQL
#   drill     the drill job: reaches Cloud SQL and reads what an operator uses (the database URL, the
#             key-signing secrets); calls the API like a customer, and may neither enqueue on the
#             jobs queue, act as the invoker nor call the workers
#   console   the operator console: reaches Cloud SQL and reads the key-signing secrets (it issues customer
#             keys) and its own session secrets; nothing of Cloud Tasks, the invoker or the workers. Who may
#             open it is IAP's grant, in infra/console.tf
#   deployer  Cloud Build (cloudbuild.yaml): pushes the image, updates the services and the jobs,
#             executes the jobs
# Secret access is granted per secret, to the accounts whose service reads it.

resource "google_service_account" "api" {
  account_id   = "specialists-api"
  display_name = "specialists: A2A edge and Cloud Tasks relay"
}

resource "google_service_account" "grpc" {
  account_id   = "specialists-grpc"
  display_name = "specialists: A2A gRPC binding"
}

resource "google_service_account" "invoker" {
  account_id   = "specialists-invoker"
  display_name = "specialists: Cloud Tasks deliveries to the workers"
}

resource "google_service_account" "worker" {
  account_id   = "specialists-worker"
  display_name = "specialists: workers"
}

resource "google_service_account" "migrate" {
  account_id   = "specialists-migrate"
  display_name = "specialists: migration job"
}

resource "google_service_account" "drill" {
  account_id   = "specialists-drill"
  display_name = "specialists: drill job (operator access)"
}

resource "google_service_account" "console" {
  account_id   = "specialists-console"
  display_name = "specialists: operator console"
}

resource "google_service_account" "deployer" {
  account_id   = "specialists-deployer"
  display_name = "specialists: Cloud Build deployments"
}

# --- Cloud SQL ------------------------------------------------------------------------------------
# roles/cloudsql.client exists only on the project; the condition narrows it to this deployment's instance.

resource "google_project_iam_member" "cloudsql_client" {
  for_each = {
    api     = google_service_account.api.email
    grpc    = google_service_account.grpc.email
    worker  = google_service_account.worker.email
    migrate = google_service_account.migrate.email
    drill   = google_service_account.drill.email
    console = google_service_account.console.email
  }
  project = var.project_id
  role    = "roles/cloudsql.client"
  member  = "serviceAccount:${each.value}"

  condition {
    title       = "the specialists instance only"
    description = "Connect to the deployment's Cloud SQL instance, no other of the project."
    expression  = "resource.name == \"projects/${var.project_id}/instances/${var.database_instance_name}\" && resource.service == \"sqladmin.googleapis.com\""
  }
}

# --- Cloud Tasks: the API enqueues, as the invoker; the invoker calls the worker -------------------

resource "google_cloud_tasks_queue_iam_member" "api_enqueues" {
  project  = var.project_id
  location = google_cloud_tasks_queue.jobs.location
  name     = google_cloud_tasks_queue.jobs.name
  role     = "roles/cloudtasks.enqueuer"
  member   = "serviceAccount:${google_service_account.api.email}"
}

resource "google_service_account_iam_member" "api_acts_as_invoker" {
  service_account_id = google_service_account.invoker.name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.api.email}"
}

resource "google_cloud_run_v2_service_iam_member" "invoker_calls_worker" {
  project  = var.project_id
  location = google_cloud_run_v2_service.worker.location
  name     = google_cloud_run_v2_service.worker.name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.invoker.email}"
}

# The edge and its gRPC binding are public: customers' agents call them with their API keys, which the service
# checks itself. They are public by `invoker_iam_disabled = true` on the services (infra/run.tf), not by an
# allUsers grant: an organisation with domain-restricted sharing refuses allUsers in any policy, and accepts this.

# --- traces and metrics: the collector sidecars write as their instance's account --------------------
# Only the accounts of the exporting services (local.otel_writers; none when otel_enabled is false). Both roles
# exist only at the project level. Cloud Trace: cloudtrace.traces.patch; Cloud Monitoring: timeSeries.create and
# the metric descriptors the new series need.

resource "google_project_iam_member" "otel_trace_agent" {
  for_each = local.otel_writers
  project  = var.project_id
  role     = "roles/cloudtrace.agent"
  member   = "serviceAccount:${each.value}"
}

resource "google_project_iam_member" "otel_metric_writer" {
  for_each = local.otel_writers
  project  = var.project_id
  role     = "roles/monitoring.metricWriter"
  member   = "serviceAccount:${each.value}"
}

# --- secrets --------------------------------------------------------------------------------------

resource "google_secret_manager_secret_iam_member" "api_reads" {
  for_each = {
    database_url  = google_secret_manager_secret.database_url_edge.id
    key_signing   = google_secret_manager_secret.key_signing.id
    worker_job    = google_secret_manager_secret.worker_job.id
    metrics_token = google_secret_manager_secret.metrics_token.id
    push_signing  = google_secret_manager_secret.push_signing.id
  }
  secret_id = each.value
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.api.email}"
}

resource "google_secret_manager_secret_iam_member" "grpc_reads" {
  for_each = {
    database_url  = google_secret_manager_secret.database_url_edge.id
    key_signing   = google_secret_manager_secret.key_signing.id
    metrics_token = google_secret_manager_secret.metrics_token.id
    push_signing  = google_secret_manager_secret.push_signing.id
  }
  secret_id = each.value
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.grpc.email}"
}

resource "google_secret_manager_secret_iam_member" "worker_reads" {
  for_each = {
    database_url   = google_secret_manager_secret.database_url_worker.id
    worker_job     = google_secret_manager_secret.worker_job.id
    checkpoint_key = google_secret_manager_secret.checkpoint_key.id
  }
  secret_id = each.value
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.worker.email}"
}

resource "google_secret_manager_secret_iam_member" "worker_reads_model_keys" {
  for_each  = google_secret_manager_secret.model_key
  secret_id = each.value.id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.worker.email}"
}

# The collector's configuration, mounted by the sidecars of the exporting services.
resource "google_secret_manager_secret_iam_member" "otel_config_reads" {
  for_each  = local.otel_writers
  secret_id = google_secret_manager_secret.otel_collector_config.id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${each.value}"
}

resource "google_secret_manager_secret_iam_member" "migrate_reads" {
  for_each = {
    database_url = google_secret_manager_secret.database_url.id
  }
  secret_id = each.value
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.migrate.email}"
}

resource "google_secret_manager_secret_iam_member" "drill_reads" {
  for_each = {
    database_url = google_secret_manager_secret.database_url_operator.id
    key_signing  = google_secret_manager_secret.key_signing.id
  }
  secret_id = each.value
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.drill.email}"
}

resource "google_secret_manager_secret_iam_member" "console_reads" {
  for_each = {
    database_url    = google_secret_manager_secret.database_url_operator.id
    key_signing     = google_secret_manager_secret.key_signing.id
    console_session = google_secret_manager_secret.console_session.id
  }
  secret_id = each.value
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.console.email}"
}

# --- the deployer (Cloud Build) -------------------------------------------------------------------

resource "google_artifact_registry_repository_iam_member" "deployer_pushes" {
  location   = google_artifact_registry_repository.images.location
  repository = google_artifact_registry_repository.images.name
  role       = "roles/artifactregistry.writer"
  member     = "serviceAccount:${google_service_account.deployer.email}"
}

resource "google_project_iam_member" "deployer" {
  for_each = toset([
    "roles/run.developer",     # deploy revisions, move traffic, update and execute the jobs (with overridden args)
    "roles/logging.logWriter", # the build's own logs (CLOUD_LOGGING_ONLY)
  ])
  project = var.project_id
  role    = each.value
  member  = "serviceAccount:${google_service_account.deployer.email}"
}

# Deploying a revision (or updating a job) that runs as an account needs actAs on that account: only
# the runtime accounts.
resource "google_service_account_iam_member" "deployer_acts_as" {
  for_each = {
    api     = google_service_account.api.name
    grpc    = google_service_account.grpc.name
    worker  = google_service_account.worker.name
    migrate = google_service_account.migrate.name
    drill   = google_service_account.drill.name
    console = google_service_account.console.name
  }
  service_account_id = each.value
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.deployer.email}"
}
