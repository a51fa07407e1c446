# Cloud SQL for PostgreSQL on a private IP only, with daily backups and point-in-time recovery, and
# the network the services reach it through (Direct VPC egress into the same VPC; the instance's
# socket is mounted at /cloudsql in each container by Cloud Run's Cloud SQL connection).

resource "google_compute_network" "vpc" {
  name                    = "specialists"
  auto_create_subnetworks = false
  depends_on              = [google_project_service.apis]
}

# Direct VPC egress takes an address per instance of the API, gRPC and console services and the jobs, and during a
# rollout the old and the new revisions' instances hold theirs together: var.run_subnet_cidr must hold
# SUBNET_ADDRESSES_PER_INSTANCE (tests/deploy/test_infra_changes.py) times their maximum instances.
resource "google_compute_subnetwork" "run" {
  name                     = "specialists-run"
  region                   = var.region
  network                  = google_compute_network.vpc.id
  ip_cidr_range            = var.run_subnet_cidr
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

  lifecycle {
    # Every process's pool, at every service's maximum instances, fits in max_connections (the budget below).
    precondition {
      condition     = local.database_connections_worst_case <= var.database_max_connections - local.database_reserved_connections
      error_message = "The services' connection pools at their maximum instances (local.database_connections_worst_case) exceed database_max_connections less the reserved connections: lower the pools (database_pools), the services' max instances, or raise database_max_connections."
    }
  }

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
    # A statement that fails is logged with its text (CKV_GCP_109), every schema change is logged (CKV_GCP_111:
    # `ddl`, not every statement of the hot path), and pgAudit is loaded (CKV_GCP_110), so that an operator can
    # turn its session logging on for an investigation (pgaudit.log) without a restart; it logs nothing until then.
    database_flags {
      name  = "log_min_error_statement"
      value = "error"
    }
    database_flags {
      name  = "log_statement"
      value = "ddl"
    }
    database_flags {
      name  = "cloudsql.enable_pgaudit"
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

# --- database users: the schema's owner, and one DML-only user per kind of serving role ----------------------
# The owner (var.database_user) is the migration job's: it creates and alters the schema. The serving roles connect
# as users of their own, which migrations/grants.sql (applied by every `specialists db upgrade`, so by the migration
# job) gives DML on the tables, EXECUTE on the ledger's functions and nothing else: no CREATE, no ALTER, no DROP.
#   edge      the API and gRPC services          worker    the worker service and its job processes
#   operator  the console and the drill job (and operators' own commands through the Cloud SQL Auth Proxy)
# docs/OPERATIONS.md "Database users" says why these are password users and not IAM database users yet.

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

resource "random_password" "database_edge" {
  length  = 40
  special = false
}

resource "google_sql_user" "edge" {
  name     = "specialists_edge"
  instance = google_sql_database_instance.main.name
  password = random_password.database_edge.result
}

resource "random_password" "database_worker" {
  length  = 40
  special = false
}

resource "google_sql_user" "worker" {
  name     = "specialists_worker"
  instance = google_sql_database_instance.main.name
  password = random_password.database_worker.result
}

resource "random_password" "database_operator" {
  length  = 40
  special = false
}

resource "google_sql_user" "operator" {
  name     = "specialists_operator"
  instance = google_sql_database_instance.main.name
  password = random_password.database_operator.result
}

# --- the connection budget ----------------------------------------------------------------------------------
# The most connections every process can hold at once: per process its pool and overflow (database_pools, set in
# each container's environment as SPECIALISTS_DB_POOL_SIZE and SPECIALISTS_DB_MAX_OVERFLOW) and one LISTEN
# connection, times the processes of one instance (the API: the edge and its relay; a worker: itself and one
# process per concurrent job), times the service's maximum instances. The instance's precondition above refuses
# a plan where it exceeds max_connections less what Cloud SQL and an operator keep (superuser_reserved plus a
# psql session, database_reserved_connections). tests/deploy/test_infra_changes.py sums it again from the
# services themselves.
locals {
  database_reserved_connections = 10
  database_processes = {
    api     = { instances = var.api_max_instances, processes = 2, pool = var.database_pools.api }
    grpc    = { instances = var.grpc_max_instances, processes = 1, pool = var.database_pools.grpc }
    worker  = { instances = var.worker_max_instances, processes = 2 + var.worker_max_concurrent_jobs, pool = var.database_pools.worker }
    console = { instances = var.console_max_instances, processes = 1, pool = var.database_pools.console }
    migrate = { instances = 1, processes = 1, pool = var.database_pools.jobs }
    drill   = { instances = 1, processes = 1, pool = var.database_pools.jobs }
  }
  database_connections_worst_case = sum([
    for role in values(local.database_processes) : role.instances * role.processes * (role.pool.size + role.pool.overflow + 1)
  ])
  # The pool settings of each container (run.tf, console.tf).
  database_pool_env = {
    for name, role in local.database_processes : name => {
      SPECIALISTS_DB_POOL_SIZE    = role.pool.size
      SPECIALISTS_DB_MAX_OVERFLOW = role.pool.overflow
    }
  }
}
