# The workers' egress (issue 46): they run model-driven jobs, so nothing they run may reach the internet beyond the
# model endpoints their routes name.
#
# The worker service sends ALL its traffic into the VPC through a subnet of its own (infra/run.tf,
# `egress = "ALL_TRAFFIC"`). From there the internet is reached only through Cloud NAT, and a network firewall
# policy decides what may leave that subnet:
#   - the hosts of var.worker_egress_hosts (every route's base_url host in infra/model_routes.toml) on tcp 443,
#     by FQDN (the policy resolves the names with Cloud DNS and follows their addresses);
#   - the Google APIs the worker's collector sidecar writes to (Cloud Trace, Cloud Monitoring), on tcp 443;
#   - Cloud SQL's private range (the /cloudsql connection);
#   - nothing else: a last rule denies all other egress from the subnet.
# The API, gRPC, console and the jobs keep PRIVATE_RANGES_ONLY on the other subnet: they run no model-driven code.
#
# Adding a route whose host is new: add the host to worker_egress_hosts, `terraform apply`, then deploy the route
# (docs/OPERATIONS.md "Worker egress"). tests/deploy/test_infra_changes.py checks the hosts against the routes.

locals {
  # Where the worker's collector sidecar exports (infra/observability.tf); empty without telemetry.
  worker_google_api_hosts = var.otel_enabled ? ["cloudtrace.googleapis.com", "monitoring.googleapis.com"] : []
}

resource "google_compute_subnetwork" "worker" {
  name                     = "specialists-worker"
  region                   = var.region
  network                  = google_compute_network.vpc.id
  ip_cidr_range            = var.worker_subnet_cidr
  private_ip_google_access = true

  # What left the workers, and to where: the record an operator reads when a job is suspected of exfiltration.
  log_config {
    aggregation_interval = "INTERVAL_5_SEC"
    flow_sampling        = 1.0
    metadata             = "INCLUDE_ALL_METADATA"
  }
}

resource "google_compute_router" "egress" {
  name    = "specialists-egress"
  region  = var.region
  network = google_compute_network.vpc.id
}

# NAT for the workers' subnet only: the other subnet sends nothing but private ranges into the VPC.
resource "google_compute_router_nat" "worker" {
  name                               = "specialists-worker-nat"
  router                             = google_compute_router.egress.name
  region                             = var.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "LIST_OF_SUBNETWORKS"

  subnetwork {
    name                    = google_compute_subnetwork.worker.id
    source_ip_ranges_to_nat = ["ALL_IP_RANGES"]
  }

  log_config {
    enable = true
    filter = "ERRORS_ONLY"
  }
}

resource "google_compute_network_firewall_policy" "vpc" {
  name        = "specialists"
  description = "What may leave the workers' subnet: the model endpoints, the telemetry APIs and Cloud SQL."
  depends_on  = [google_project_service.apis]
}

resource "google_compute_network_firewall_policy_association" "vpc" {
  name              = "specialists"
  attachment_target = google_compute_network.vpc.id
  firewall_policy   = google_compute_network_firewall_policy.vpc.name
}

resource "google_compute_network_firewall_policy_rule" "worker_to_models" {
  firewall_policy = google_compute_network_firewall_policy.vpc.name
  description     = "Workers reach the model endpoints their routes name (var.worker_egress_hosts)."
  priority        = 1000
  direction       = "EGRESS"
  action          = "allow"
  enable_logging  = true

  match {
    src_ip_ranges = [var.worker_subnet_cidr]
    dest_fqdns    = concat(var.worker_egress_hosts, local.worker_google_api_hosts)
    layer4_configs {
      ip_protocol = "tcp"
      ports       = ["443"]
    }
  }
}

resource "google_compute_network_firewall_policy_rule" "worker_to_cloud_sql" {
  firewall_policy = google_compute_network_firewall_policy.vpc.name
  description     = "Workers reach Cloud SQL's private addresses (the /cloudsql connection)."
  priority        = 1010
  direction       = "EGRESS"
  action          = "allow"

  match {
    src_ip_ranges  = [var.worker_subnet_cidr]
    dest_ip_ranges = ["${google_compute_global_address.sql_private_range.address}/${google_compute_global_address.sql_private_range.prefix_length}"]
    layer4_configs {
      ip_protocol = "tcp"
    }
  }
}

resource "google_compute_network_firewall_policy_rule" "worker_deny_rest" {
  firewall_policy = google_compute_network_firewall_policy.vpc.name
  description     = "Nothing else leaves the workers' subnet."
  priority        = 65000
  direction       = "EGRESS"
  action          = "deny"
  enable_logging  = true

  match {
    src_ip_ranges  = [var.worker_subnet_cidr]
    dest_ip_ranges = ["0.0.0.0/0"]
    layer4_configs {
      ip_protocol = "all"
    }
  }
}
