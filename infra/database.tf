# Cloud SQL for PostgreSQL on a private IP only, with daily backups and point-in-time recovery, and
# the network the services reach it through (Direct VPC egress into the same VPC; the instance's
# socket is mounted at /cloudsql in each container by Cloud Run's Cloud SQL connection).

resource "google_compute_network" "vpc" {
  name                    = "specialists"
  auto_create_subnetworks = false
  depends_on              = [google_project_service.apis]
}

resource "google_compute_subnetwork" "run" {
  name                     = "specialists-run"
  region                   = var.region
  network                  = google_compute_network.vpc.id
  ip_cidr_range            = "10.8.0.0/24"
  private_ip_google_access = true
}

# Private services access: the range Cloud SQL's private IP is taken from.
resource "google_compute_global_address" "sql_private_range" {
  name          = "specialists-sql-private-range"
  purpose       = "VPC_PEERING"
  address_type  = "INTERNAL"
  prefix_length = 16
  network       = google_compute_network.vpc.id
}

resource "google_service_networking_connection" "sql_private" {
  network                 = google_compute_network.vpc.id
  service                 = "servicenetworking.googleapis.com"
  reserved_peering_ranges = [google_compute_global_address.sql_private_range.name]
}

resource "google_sql_database_instance" "main" {
  name                = var.database_instance_name
  region              = var.region
  database_version    = "POSTGRES_16"
  deletion_protection = true
  depends_on          = [google_service_networking_connection.sql_private]

  settings {
    tier                        = var.database_tier
    edition                     = "ENTERPRISE"
    availability_type           = var.database_availability_type
    disk_autoresize             = true
    deletion_protection_enabled = true

    ip_configuration {
      ipv4_enabled    = false # no public IP at all
      private_network = google_compute_network.vpc.id
      # Every role connects through Cloud Run's Cloud SQL connection (the socket under /cloudsql), which is
      # the Cloud SQL Auth Proxy: it presents the instance's client certificate itself. So the instance can
      # refuse any connection without one, and a client that reached the private IP some other way is refused.
      ssl_mode = "TRUSTED_CLIENT_CERTIFICATE_REQUIRED"
    }

    # Who connected, who left, and who waited on a lock longer than deadlock_timeout (1 s): what an operator
    # reads after an incident (a reservation held, a claim's lease, a migration waiting on the service).
    # log_checkpoints is PostgreSQL's own default since 15; set so that it stays on.
    # The connections every process's pool must fit in; the alert "database connections near their limit"
    # (infra/monitoring.tf) is a share of it.
    database_flags {
      name  = "max_connections"
      value = tostring(var.database_max_connections)
    }
    database_flags {
      name  = "log_connections"
      value = "on"
    }
    database_flags {
      name  = "log_disconnections"
      value = "on"
    }
    database_flags {
      name  = "log_lock_waits"
      value = "on"
    }
    database_flags {
      name  = "log_checkpoints"
      value = "on"
    }

    backup_configuration {
      enabled                        = true
      start_time                     = "03:00"
      point_in_time_recovery_enabled = true
      transaction_log_retention_days = var.database_log_retention_days

      backup_retention_settings {
        retained_backups = var.database_backup_retained_count
        retention_unit   = "COUNT"
      }
    }

    maintenance_window {
      day          = 7
      hour         = 4
      update_track = "stable"
    }

    insights_config {
      query_insights_enabled = true
    }
  }
}

resource "google_sql_database" "app" {
  name     = var.database_name
  instance = google_sql_database_instance.main.name
}

# Letters and digits only: the password goes into DATABASE_URL unescaped.
resource "random_password" "database" {
  length  = 40
  special = false
}

resource "google_sql_user" "app" {
  name     = var.database_user
  instance = google_sql_database_instance.main.name
  password = random_password.database.result
}
