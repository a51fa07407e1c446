# Secret Manager: every secret a service reads, each given only to the service accounts that need it
# (see iam.tf), each stored in var.region only (user-managed replication: the data stays where the services are).
# Every revision reads a pinned version (local.secret_versions), never "latest": all instances of one revision
# read the same one, and a rotation is a new version, var.secret_versions, and an apply (docs/OPERATIONS.md).
#
# Generated here on the first apply (and so also in the Terraform state): the database password and
# DATABASE_URL, the first key-signing secret, worker job secret, push signing secret, checkpoint key and console
# session secret. Rotations add versions with gcloud (docs/OPERATIONS.md). Model keys cannot be generated: an
# operator adds them.

# SPECIALISTS_KEY_SIGNING_SECRETS (API, drill job): signs and verifies customer keys; comma-separated, newest first.
resource "google_secret_manager_secret" "key_signing" {
  secret_id = "specialists-key-signing-secrets"
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

# SPECIALISTS_WORKER_JOB_SECRETS (API's relay signs job bodies, workers verify them).
# The bearer token a Prometheus scraper presents at the API's /metrics; without it the public API answers
# 401 there. Terraform writes the first version; give the scraper the same value.
resource "google_secret_manager_secret" "metrics_token" {
  secret_id = "specialists-metrics-token"
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

resource "google_secret_manager_secret" "worker_job" {
  secret_id = "specialists-worker-job-secrets"
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

# SPECIALISTS_SPECIALIST_CHECKPOINT_KEY (workers): signs Monty checkpoints of running jobs.
resource "google_secret_manager_secret" "checkpoint_key" {
  secret_id = "specialists-checkpoint-key"
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

# SPECIALISTS_PUSH_SIGNING_SECRETS (API and gRPC service: the edge publishes the JWKS, the API's relay child
# signs push notifications): the secrets the ES256 keys derive from; comma-separated, newest first.
resource "google_secret_manager_secret" "push_signing" {
  secret_id = "specialists-push-signing-secrets"
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

# SPECIALISTS_CONSOLE_SESSION_SECRETS (the console only): signs the console's session cookies; comma-separated,
# newest first (the newest signs, all verify).
resource "google_secret_manager_secret" "console_session" {
  secret_id = "specialists-console-session-secrets"
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

# The database user's password, for operators (psql through the Cloud SQL Auth Proxy).
resource "google_secret_manager_secret" "database_password" {
  secret_id = "specialists-database-password"
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

# DATABASE_URL of the migration job: the schema owner's password inside, the Cloud SQL socket as host.
resource "google_secret_manager_secret" "database_url" {
  secret_id = "specialists-database-url"
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

# One per model key variable named by infra/model_routes.toml (workers).
resource "google_secret_manager_secret" "model_key" {
  for_each  = var.model_key_env_names
  secret_id = "specialists-${lower(replace(each.value, "_", "-"))}"
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

resource "random_password" "key_signing" {
  length  = 64
  special = false
}

resource "random_password" "worker_job" {
  length  = 64
  special = false
}

resource "random_password" "push_signing" {
  length  = 64
  special = false
}

resource "google_secret_manager_secret_version" "push_signing" {
  secret      = google_secret_manager_secret.push_signing.id
  secret_data = random_password.push_signing.result
}

resource "random_password" "console_session" {
  length  = 64
  special = false
}

resource "google_secret_manager_secret_version" "console_session" {
  secret      = google_secret_manager_secret.console_session.id
  secret_data = random_password.console_session.result
}

resource "random_password" "checkpoint_key" {
  length  = 64
  special = false
}

resource "google_secret_manager_secret_version" "key_signing" {
  secret      = google_secret_manager_secret.key_signing.id
  secret_data = random_password.key_signing.result
}

resource "google_secret_manager_secret_version" "worker_job" {
  secret      = google_secret_manager_secret.worker_job.id
  secret_data = random_password.worker_job.result
}

resource "random_password" "metrics_token" {
  length  = 48
  special = false
}

resource "google_secret_manager_secret_version" "metrics_token" {
  secret      = google_secret_manager_secret.metrics_token.id
  secret_data = random_password.metrics_token.result
}

resource "google_secret_manager_secret_version" "checkpoint_key" {
  secret      = google_secret_manager_secret.checkpoint_key.id
  secret_data = random_password.checkpoint_key.result
}

resource "google_secret_manager_secret_version" "database_password" {
  secret      = google_secret_manager_secret.database_password.id
  secret_data = random_password.database.result
}

resource "google_secret_manager_secret_version" "database_url" {
  secret      = google_secret_manager_secret.database_url.id
  secret_data = "postgresql+psycopg://${google_sql_user.app.name}:${random_password.database.result}@/${google_sql_database.app.name}?host=/cloudsql/${google_sql_database_instance.main.connection_name}"
}

# DATABASE_URL of the serving roles, one per database user (infra/database.tf): edge (API, gRPC), worker, operator
# (console, drill job). DML only: migrations/grants.sql.
resource "google_secret_manager_secret" "database_url_edge" {
  secret_id = "specialists-database-url-edge"
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

resource "google_secret_manager_secret_version" "database_url_edge" {
  secret      = google_secret_manager_secret.database_url_edge.id
  secret_data = "postgresql+psycopg://${google_sql_user.edge.name}:${random_password.database_edge.result}@/${google_sql_database.app.name}?host=/cloudsql/${google_sql_database_instance.main.connection_name}"
}

resource "google_secret_manager_secret" "database_url_worker" {
  secret_id = "specialists-database-url-worker"
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

resource "google_secret_manager_secret_version" "database_url_worker" {
  secret      = google_secret_manager_secret.database_url_worker.id
  secret_data = "postgresql+psycopg://${google_sql_user.worker.name}:${random_password.database_worker.result}@/${google_sql_database.app.name}?host=/cloudsql/${google_sql_database_instance.main.connection_name}"
}

resource "google_secret_manager_secret" "database_url_operator" {
  secret_id = "specialists-database-url-operator"
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

resource "google_secret_manager_secret_version" "database_url_operator" {
  secret      = google_secret_manager_secret.database_url_operator.id
  secret_data = "postgresql+psycopg://${google_sql_user.operator.name}:${random_password.database_operator.result}@/${google_sql_database.app.name}?host=/cloudsql/${google_sql_database_instance.main.connection_name}"
}

# The version each revision reads, by secret id: the one Terraform wrote, unless var.secret_versions names a later
# one (a rotation); the model keys' from var.model_key_versions (1: the operator's first). run.tf and console.tf
# read every secret through this map.
locals {
  terraform_secret_versions = merge(
    {
      for version in [
        google_secret_manager_secret_version.key_signing,
        google_secret_manager_secret_version.worker_job,
        google_secret_manager_secret_version.metrics_token,
        google_secret_manager_secret_version.checkpoint_key,
        google_secret_manager_secret_version.push_signing,
        google_secret_manager_secret_version.console_session,
        google_secret_manager_secret_version.database_url,
        google_secret_manager_secret_version.database_url_edge,
        google_secret_manager_secret_version.database_url_worker,
        google_secret_manager_secret_version.database_url_operator,
      ] : element(split("/", version.secret), 3) => version.version
    },
  )
  secret_versions = merge(
    local.terraform_secret_versions,
    { for name, secret in google_secret_manager_secret.model_key : secret.secret_id => lookup(var.model_key_versions, name, "1") },
    var.secret_versions,
  )
}
