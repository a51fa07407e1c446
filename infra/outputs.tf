# What cloudbuild.yaml, the drills and operators need after an apply.

output "api_url" {
  description = "The API service's run.app URL."
  value       = google_cloud_run_v2_service.api.uri
}

output "api_public_url" {
  description = "The URL in the Agent Cards (SPECIALISTS_EDGE_PUBLIC_URL)."
  value       = local.api_public_url
}

output "grpc_url" {
  description = "The gRPC service's run.app URL."
  value       = google_cloud_run_v2_service.grpc.uri
}

output "grpc_public_url" {
  description = "The host:port in the Agent Cards' GRPC interface (SPECIALISTS_GRPC_PUBLIC_URL)."
  value       = local.grpc_public_url
}

output "worker_url" {
  description = "The worker service's URL: reachable only from inside the project (Cloud Tasks)."
  value       = google_cloud_run_v2_service.worker.uri
}

output "worker_audience" {
  description = "SPECIALISTS_WORKER_AUDIENCE: the OIDC audience and job-body audience of the workers."
  value       = local.worker_url
}

output "console_url" {
  description = "The operator console's URL: behind IAP, for the accounts of console_operators only."
  value       = google_cloud_run_v2_service.console.uri
}

output "console_iap_audience" {
  description = "SPECIALISTS_CONSOLE_IAP_AUDIENCE: the audience of the JWT IAP signs for the console."
  value       = local.console_iap_audience
}

output "image_repository" {
  description = "Where cloudbuild.yaml pushes the image."
  value       = "${var.region}-docker.pkg.dev/${var.project_id}/${google_artifact_registry_repository.images.repository_id}/specialists"
}

output "database_connection_name" {
  description = "For the Cloud SQL Auth Proxy (operators) and the services' /cloudsql socket."
  value       = google_sql_database_instance.main.connection_name
}

output "queue" {
  description = "The Cloud Tasks queue of the jobs."
  value       = google_cloud_tasks_queue.jobs.id
}

output "deployer_service_account" {
  description = "The account Cloud Build runs cloudbuild.yaml as."
  value       = google_service_account.deployer.email
}
