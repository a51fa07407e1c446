"""Issue 46's Terraform, each change as a property of infra/ (parsed; no GCP here): the gRPC service's own account,
Cloud SQL reachable on this instance only, the connection budget, the workers' egress, CPU allocation chosen per
service, pinned secret versions in the region, and the subnets' room for a rollout."""

from __future__ import annotations

import ipaddress
import re
import tomllib
from urllib.parse import urlparse

import pytest

from tests.deploy.manifests import INFRA, Terraform, container, container_env, revision_template, sidecars
from tests.deploy.test_infra_policy import grants

SERVICE = "google_cloud_run_v2_service"
JOB = "google_cloud_run_v2_job"
SERVICES = ("api", "grpc", "worker", "console")
# Direct VPC egress holds an address per instance; during a rollout the old and the new revisions' instances both
# hold theirs, and Google asks for room beyond that (released addresses come back after a delay): 4 per instance.
SUBNET_ADDRESSES_PER_INSTANCE = 4
# Connections per process beyond its pool and overflow: the LISTEN connection (taskstate/notify.py, the dispatcher).
LISTEN_CONNECTIONS = 1


@pytest.fixture(scope="module")
def tf() -> Terraform:
    return Terraform()


def max_instances(tf: Terraform, name: str) -> int:
    return int(tf.resolve(revision_template(tf, SERVICE, name)["scaling"][0]["max_instance_count"]))


# --- accounts and roles ------------------------------------------------------------------------------


def test_the_grpc_service_runs_as_its_own_account_which_cannot_enqueue_act_as_the_invoker_or_read_the_relays_secret(tf):
    assert revision_template(tf, SERVICE, "grpc")["service_account"] == "${google_service_account.grpc.email}"
    of_grpc = {(g.role, g.target) for g in grants(tf) if g.member == "account:grpc"}
    assert ("roles/cloudtasks.enqueuer", "queue:jobs") not in of_grpc
    assert not [t for r, t in of_grpc if t == "service_account:invoker"]
    assert ("roles/secretmanager.secretAccessor", "secret:worker_job") not in of_grpc
    assert {t for r, t in of_grpc if r == "roles/secretmanager.secretAccessor"} == {
        "secret:database_url_edge", "secret:key_signing", "secret:metrics_token", "secret:push_signing",
        "secret:otel_collector_config"}  # its collector sidecar's configuration


def test_cloud_sql_client_is_granted_on_this_instance_only(tf):
    binding = tf.resource("google_project_iam_member", "cloudsql_client")
    condition = binding["condition"][0]
    expression = tf.resolve(condition["expression"])
    assert f'resource.name == "projects/{tf.default("project_id")}/instances/{tf.default("database_instance_name")}"' in expression
    assert 'resource.service == "sqladmin.googleapis.com"' in expression


def test_each_serving_role_connects_as_a_database_user_that_is_not_the_schema_owner(tf):
    owner = tf.resolve(tf.resource("google_sql_user", "app")["name"])
    migrate = container_env(tf, JOB, "migrate").secrets["DATABASE_URL"][0]
    assert migrate == "database_url"
    for kind, name in ((SERVICE, "api"), (SERVICE, "grpc"), (SERVICE, "worker"), (SERVICE, "console"), (JOB, "drill")):
        secret = container_env(tf, kind, name).secrets["DATABASE_URL"][0]
        assert secret != "database_url", f"{name} connects as the schema owner {owner}"
        user = secret.removeprefix("database_url_")
        assert tf.resolve(tf.resource("google_sql_user", user)["name"]) == f"specialists_{user}" != owner


# --- the connection budget ---------------------------------------------------------------------------


def pool(tf: Terraform, kind: str, name: str) -> int:
    env = container_env(tf, kind, name).plain
    assert {"SPECIALISTS_DB_POOL_SIZE", "SPECIALISTS_DB_MAX_OVERFLOW"} <= set(env), f"{name}: its pool is not explicit"
    return int(env["SPECIALISTS_DB_POOL_SIZE"]) + int(env["SPECIALISTS_DB_MAX_OVERFLOW"]) + LISTEN_CONNECTIONS


def test_every_process_at_every_services_maximum_instances_fits_in_max_connections(tf):
    # Processes per instance: the API's edge and its relay child; a worker, one process per concurrent job, and the
    # job process forked ahead of the next job (it connects while it waits, workers.assembly.connect_ahead).
    processes = {"api": 2, "grpc": 1, "console": 1,
                 "worker": 2 + int(tf.resolve(container_env(tf, SERVICE, "worker").plain["SPECIALISTS_WORKER_MAX_CONCURRENT_JOBS"]))}
    worst = sum(max_instances(tf, name) * processes[name] * pool(tf, SERVICE, name) for name in SERVICES)
    worst += sum(pool(tf, JOB, name) for name in ("migrate", "drill"))  # one task each
    flags = {f["name"]: f["value"] for f in tf.resource("google_sql_database_instance", "main")["settings"][0]["database_flags"]}
    assert flags["max_connections"] == "${tostring(var.database_max_connections)}"
    limit = int(tf.default("database_max_connections"))
    reserved = int(tf.reference("local.database_reserved_connections"))
    assert worst <= limit - reserved, f"{worst} connections at worst against max_connections {limit} less {reserved}"
    # Terraform's own sum (the instance's precondition) counts the same processes.
    for name, count in processes.items():
        assert tf.locals["database_processes"][name]["processes"] in (count, "${2 + var.worker_max_concurrent_jobs}")


# --- the workers' egress ------------------------------------------------------------------------------


def test_every_packet_a_worker_sends_goes_through_its_own_subnet_where_only_the_model_hosts_are_let_out(tf):
    access = revision_template(tf, SERVICE, "worker")["vpc_access"][0]
    assert access["egress"] == "ALL_TRAFFIC"
    assert access["network_interfaces"][0]["subnetwork"] == "${local.worker_vpc_egress.subnetwork}"
    subnet = tf.default("worker_subnet_cidr")
    assert tf.resolve(tf.resource("google_compute_subnetwork", "worker")["ip_cidr_range"]) == subnet
    nat = tf.resource("google_compute_router_nat", "worker")
    assert nat["source_subnetwork_ip_ranges_to_nat"] == "LIST_OF_SUBNETWORKS"
    assert [s["name"] for s in nat["subnetwork"]] == ["${google_compute_subnetwork.worker.id}"]
    rules = tf.of_type("google_compute_network_firewall_policy_rule")
    egress = sorted((r for r in rules.values() if r["direction"] == "EGRESS"), key=lambda r: r["priority"])
    assert all(tf.resolve(r["match"][0]["src_ip_ranges"][0]) == subnet for r in egress)
    last = egress[-1]
    assert last["action"] == "deny" and last["match"][0]["dest_ip_ranges"] == ["0.0.0.0/0"]
    internet = [r for r in egress[:-1] if "dest_fqdns" in r["match"][0]]
    assert len(internet) == 1 and internet[0]["action"] == "allow"
    assert internet[0]["match"][0]["layer4_configs"][0]["ports"] == ["443"]
    others = [r for r in egress[:-1] if r is not internet[0]]
    assert all("dest_fqdns" not in r["match"][0] and "0.0.0.0/0" not in str(r["match"][0]) for r in others)
    association = tf.resource("google_compute_network_firewall_policy_association", "vpc")
    assert association["attachment_target"] == "${google_compute_network.vpc.id}"


def test_the_hosts_workers_may_reach_are_exactly_the_hosts_of_the_model_routes(tf):
    routes = tomllib.loads((INFRA / "model_routes.toml").read_text())["routes"]
    hosts = {urlparse(route["base_url"]).hostname for route in routes.values()}
    assert set(tf.default("worker_egress_hosts")) == hosts


def test_the_services_that_run_no_model_code_send_only_private_ranges_into_the_vpc(tf):
    for name in ("api", "grpc", "console"):
        assert revision_template(tf, SERVICE, name)["vpc_access"][0]["egress"] == "PRIVATE_RANGES_ONLY", name


# --- CPU allocation -------------------------------------------------------------------------------------

# Each service's choice: always allocated where work runs between requests, per request where none does.
CPU_IDLE = {
    "api": False,  # the relay, the lease sweeper and the LISTEN connection
    "worker": False,  # the beat and the jobs' lease heartbeats
    "grpc": True,  # no relay, no sweeper: only calls and streams
    "console": True,  # pages only
}


@pytest.mark.parametrize("name", sorted(CPU_IDLE))
def test_each_service_and_its_sidecars_set_cpu_allocation_deliberately_and_alike(tf, name):
    for spec in [container(tf, SERVICE, name), *sidecars(tf, SERVICE, name)]:
        resources = spec["resources"][0]
        assert "cpu_idle" in resources, f"{name}/{spec.get('name')}: cpu_idle unset means always allocated, by accident"
        assert resources["cpu_idle"] is CPU_IDLE[name], name


# --- secrets ---------------------------------------------------------------------------------------------


def test_no_revision_reads_a_secret_at_latest_and_every_secret_stays_in_the_region(tf):
    text = "\n".join(path.read_text() for path in sorted(INFRA.glob("*.tf")))
    assert not re.search(r'version\s*=\s*"latest"', text)
    for name, secret in tf.of_type("google_secret_manager_secret").items():
        replication = secret["replication"][0]
        assert "auto" not in replication, name
        locations = [r["location"] for r in replication["user_managed"][0]["replicas"]]
        assert locations == ["${var.region}"], name


def test_every_secret_a_container_reads_is_pinned_through_the_versions_map(tf):
    for (kind, name) in [(SERVICE, n) for n in SERVICES] + [(JOB, "migrate"), (JOB, "drill")]:
        spec = container(tf, kind, name)
        for dynamic in spec.get("dynamic", []):
            content = dynamic.get("env", {}).get("content", [{}])[0]
            if "value_source" in content:
                version = content["value_source"][0]["secret_key_ref"][0]["version"]
                assert version.startswith("${local.secret_versions[env.value"), (name, version)


# --- the subnets ---------------------------------------------------------------------------------------------


def test_each_subnet_holds_its_services_during_a_rollout(tf):
    run = ipaddress.ip_network(tf.default("run_subnet_cidr")).num_addresses
    on_run = sum(max_instances(tf, n) for n in ("api", "grpc", "console")) + 2  # and the two jobs' tasks
    assert run >= SUBNET_ADDRESSES_PER_INSTANCE * on_run
    worker = ipaddress.ip_network(tf.default("worker_subnet_cidr")).num_addresses
    assert worker >= SUBNET_ADDRESSES_PER_INSTANCE * max_instances(tf, "worker")
    assert not ipaddress.ip_network(tf.default("run_subnet_cidr")).overlaps(ipaddress.ip_network(tf.default("worker_subnet_cidr")))


def test_only_the_public_api_has_an_uptime_check(tf):
    checks = tf.of_type("google_monitoring_uptime_check_config")
    assert set(checks) == {"api"}
    assert checks["api"]["http_check"][0]["path"] == "/healthz"
    assert "containerscanning.googleapis.com" in str(tf.resource("google_project_service", "apis")["for_each"])

