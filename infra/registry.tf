# Artifact Registry: the one image of the service (cloudbuild.yaml pushes <region>-docker.pkg.dev/<project>/<repository>/specialists).

resource "google_artifact_registry_repository" "images" {
  repository_id = var.repository_id
  location      = var.region
  format        = "DOCKER"
  description   = "Images of the specialists service"
  depends_on    = [google_project_service.apis]

  cleanup_policies {
    id     = "keep-recent"
    action = "KEEP"
    most_recent_versions {
      keep_count = 30
    }
  }

  cleanup_policies {
    id     = "delete-old-untagged"
    action = "DELETE"
    condition {
      tag_state  = "UNTAGGED"
      older_than = "1209600s" # 14 days
    }
  }
}
