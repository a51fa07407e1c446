# Terraform and provider versions, and where the state lives.
#
# The state holds generated secrets (the database password, the first signing secrets): keep it in a
# bucket only operators can read. `terraform init -backend-config="bucket=<state bucket>"`.

terraform {
  required_version = ">= 1.5"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 6.31" # invoker_iam_disabled on Cloud Run v2 services
    }
    # Only for the console (infra/console.tf): in 6.x, Cloud Run's own IAP (`iap_enabled`, from 6.30) and its
    # access grants (google_iap_web_cloud_run_service_iam_member, 6.31) are beta-provider fields.
    google-beta = {
      source  = "hashicorp/google-beta"
      version = "~> 6.31"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.6"
    }
  }

  backend "gcs" {
    prefix = "specialists"
  }
}

provider "google" {
  project = var.project_id
  region  = var.region
}

provider "google-beta" {
  project = var.project_id
  region  = var.region
}

data "google_project" "this" {
  project_id = var.project_id
}

# Every API the deployment uses; never disabled by a destroy (other things in the project may use them).
resource "google_project_service" "apis" {
  for_each = toset([
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudtasks.googleapis.com",
    "compute.googleapis.com",
    "containerscanning.googleapis.com", # Artifact Analysis scans every pushed image for known vulnerabilities
    "iam.googleapis.com",
    "iap.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "servicenetworking.googleapis.com",
    "sqladmin.googleapis.com",
  ])
  service            = each.value
  disable_on_destroy = false
}
