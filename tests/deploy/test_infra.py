"""infra/ (Terraform) checked against the code: what each service is given, who may do what, the limits.

Nothing can be applied from here. The services are started for real from the environment Terraform
gives them (tests/deploy/conftest.py); the rest is read from the parsed Terraform and compared with
the settings, the specs, the routes and the worker's endpoint.
"""

from __future__ import annotations

import json
import re
import tomllib
import uuid
from pathlib import Path

import psycopg
import pytest

from taskstate.notify import libpq_url
from core import db
from core.settings import PROJECT_ROOT, WorkerSettings
from core.settings_doc import settings_fields
from core.specs import load_specs
from ops.cli import build_parser, cmd_console, cmd_db_upgrade, cmd_serve, cmd_worker
from ops.drill.cli import cmd_drill
from tests import http_calls
from tests.deploy.conftest import settings_from, terraform_environment
from tests.deploy.manifests import (
    Terraform,
    container,
    container_env,
    dockerfile_stages,
    mounted_secrets,
    revision_template,
    sidecars,
)
from tests.deploy.roles import free_port, on_this_machine, run_command_here, run_role, start_role
from tests.deploy.test_infra_policy import grants
from workers.server import JOBS_PATH

pytestmark = pytest.mark.timeout(90, func_only=True)

SERVICE = "google_cloud_run_v2_service"
JOB = "google_cloud_run_v2_job"
ROLES = {"api": (SERVICE, "api"), "grpc": (SERVICE, "grpc"), "worker": (SERVICE, "worker"), "migrate": (JOB, "migrate"),
         "drill": (JOB, "drill"), "console": (SERVICE, "console")}
# Which runtime service account each role runs as (the gRPC binding has its own: it runs no relay).
RUNS_AS = {"api": "api", "grpc": "grpc", "worker": "worker", "migrate": "migrate", "drill": "drill", "console": "console"}
# The bounds the drill checks: it must run with the values the services run with.
DRILL_BOUNDS = (
    "SPECIALISTS_WORKER_HEARTBEAT_S",
    "SPECIALISTS_WORKER_CANCEL_GRACE_S",
    "SPECIALISTS_WORKER_LEASE_S",
    "SPECIALISTS_DISPATCH_SWEEP_INTERVAL_S",
    "SPECIALISTS_REVOCATION_CACHE_S",
)
SETTING_NAMES = {env for _, _, _, env in settings_fields()}


def rlm_specs() -> dict:
    return {sid: loaded for sid, loaded in load_specs(PROJECT_ROOT / "specs").items() if loaded.spec.executor == "rlm"}


def production_routes(tf: Terraform) -> dict:
    routes_file = container_env(tf, SERVICE, "worker").plain["SPECIALISTS_MODEL_ROUTES_FILE"]
    return tomllib.loads(Path(on_this_machine(routes_file)).read_text())["routes"]


def members(tf: Terraform, type_name: str, role: str, resource: str) -> set[str]:
    """Members granted ``role`` by ``type_name`` bindings that name ``resource`` (an expression prefix)."""
    found = set()
    for body in tf.of_type(type_name).values():
        target = " ".join(str(body.get(key, "")) for key in ("name", "secret_id", "service_account_id", "repository"))
        if body["role"] == role and resource in target:
            found.add(tf.resolve(body["member"]) if "each." not in body["member"] else body["member"])
    return found


def account(tf: Terraform, name: str) -> str:
    return "serviceAccount:" + tf.reference(f"google_service_account.{name}.email")


# --- the services start from what Terraform gives them -----------------------------------------------


def test_the_worker_starts_from_terraforms_environment_and_serves_every_specialist(worker_from_terraform):
    ready = http_calls.get(f"{worker_from_terraform.url}/readyz")
    assert ready.status_code == 200, ready.text
    assert set(rlm_specs()) <= set(ready.json()["specialists"])
    assert ready.json()["problems"] == []


def test_the_api_starts_from_terraforms_environment_with_its_relay_and_publishes_the_public_url(tf, api_from_terraform):
    assert http_calls.get(f"{api_from_terraform.url}/readyz").status_code == 200
    card = http_calls.get(f"{api_from_terraform.url}/specialists/conformance/.well-known/agent-card.json").json()
    public_url = container_env(tf, SERVICE, "api").plain["SPECIALISTS_EDGE_PUBLIC_URL"]
    assert public_url == tf.reference("local.api_run_url")
    http_bindings = [i for i in card["supportedInterfaces"] if i["protocolBinding"] != "GRPC"]
    assert http_bindings and all(interface["url"].startswith(public_url) for interface in http_bindings)
    # The gRPC binding is its own service; the API's cards name it, with the specialist as the tenant.
    grpc_interfaces = [i for i in card["supportedInterfaces"] if i["protocolBinding"] == "GRPC"]
    assert [(i["url"], i["tenant"]) for i in grpc_interfaces] == [
        (tf.reference("local.grpc_public_url"), "conformance")
    ]
    # The relay to Cloud Tasks started as the edge's child (production mode), with the worker as its target.
    assert "cloud_tasks to " + tf.reference("local.worker_url") + JOBS_PATH in api_from_terraform.log_text()


def test_the_migration_job_upgrades_the_database_from_its_environment(tf, database_url, tmp_path):
    env = terraform_environment(tf, JOB, "migrate", database_url)
    done = run_role(tf.resolve(container(tf, JOB, "migrate")["args"]), env, tmp_path / "migrate.log")
    assert done.returncode == 0, (tmp_path / "migrate.log").read_text()
    assert "schema already at head" in (tmp_path / "migrate.log").read_text()


@pytest.mark.parametrize(
    "role, command",
    [("api", cmd_serve), ("grpc", cmd_serve), ("worker", cmd_worker), ("migrate", cmd_db_upgrade), ("drill", cmd_drill),
     ("console", cmd_console)],
)
def test_each_container_runs_a_real_command_of_the_image(tf, role, command):
    args = tf.resolve(container(tf, *ROLES[role])["args"])
    assert build_parser().parse_args(args).func is command


def test_a_key_and_credits_the_drill_job_gives_from_its_environment_are_honoured_by_the_api(
    tf, deploy_database, api_from_terraform, monkeypatch
):
    # What the drill does first in target mode: issue a key and grant credits to a `drill-…` customer,
    # with the database and the key-signing secrets and environment the job is given.
    env = terraform_environment(tf, JOB, "drill", deploy_database)
    customer = f"drill-deploy-{uuid.uuid4().hex[:8]}"
    added = run_command_here(["customers", "add", "--customer", customer, "--reason", "deploy test"], env, monkeypatch)
    assert added.returncode == 0, added.stderr
    issued = run_command_here(["keys", "issue", "--customer", customer, "--ttl-days", "1", "--json"], env, monkeypatch)
    assert issued.returncode == 0, issued.stderr
    granted = run_command_here(["credits", "grant", "--customer", customer, "--credits", "7", "--reason", "deploy test"],
                               env, monkeypatch)
    assert granted.returncode == 0, granted.stderr
    key = json.loads(issued.stdout)["key"]
    assert key.startswith(f"sk_{tf.default('key_environment')}_")
    card = http_calls.get(
        f"{api_from_terraform.url}/specialists/conformance/extendedAgentCard",
        headers={"Authorization": f"Bearer {key}", "A2A-Version": "1.0"},
        timeout=5,
    )
    assert card.status_code == 200, card.text
    assert card.json()["capabilities"]["extensions"][0]["params"]["availableCredits"] == 7


def test_the_drill_job_has_the_apis_key_signing_secrets_and_key_environment(tf, database_url, monkeypatch):
    from ops import local_secrets

    drill = container_env(tf, JOB, "drill")
    api = container_env(tf, SERVICE, "api")
    assert drill.secrets["SPECIALISTS_KEY_SIGNING_SECRETS"] == api.secrets["SPECIALISTS_KEY_SIGNING_SECRETS"]
    assert drill.plain["SPECIALISTS_KEY_ENVIRONMENT"] == api.plain["SPECIALISTS_KEY_ENVIRONMENT"]
    settings = settings_from(terraform_environment(tf, JOB, "drill", database_url), monkeypatch)
    assert not settings.database.embedded
    local_secrets.require(settings, ["key_signing_secrets"])


def test_the_drill_job_checks_the_bounds_the_services_run_with(tf):
    assert set(DRILL_BOUNDS) <= SETTING_NAMES
    drill = container_env(tf, JOB, "drill")
    services = {name: container_env(tf, SERVICE, name).plain for name in ("api", "worker")}
    for bound in DRILL_BOUNDS:
        values = {name: env[bound] for name, env in services.items() if bound in env}
        assert len(set(values.values())) <= 1, f"the services run with different {bound}: {values}"
        # Not set on the services: they run with the setting's default, and so must the drill.
        assert drill.plain.get(bound) == next(iter(values.values()), None), (
            f"{bound}: the drill job runs with {drill.plain.get(bound)!r}, the services with {values or 'the default'}"
        )
        assert bound not in drill.secrets


def test_the_drill_job_runs_once_per_execution_within_its_timeout(tf):
    template = revision_template(tf, JOB, "drill")
    assert template["max_retries"] == 0, "a failed drill must fail the release, not be run again"
    assert tf.resolve(template["timeout"]) == f"{tf.default('drill_timeout_s')}s"
    assert tf.resolve(tf.resource(JOB, "drill")["template"][0]["task_count"]) == 1
    # The release changes the image; Terraform must not put the placeholder back.
    assert "template[0].template[0].containers[0].image" in str(tf.resource(JOB, "drill")["lifecycle"][0]["ignore_changes"])


def test_the_grpc_service_serves_a2a_over_grpc_on_its_container_port_from_terraforms_environment(tf, database_url,
                                                                                                tmp_path, collector):
    import grpc
    from a2a.types import a2a_pb2_grpc
    from a2a.types.a2a_pb2 import GetTaskRequest

    spec = container(tf, SERVICE, "grpc")
    env = container_env(tf, SERVICE, "grpc").plain
    # Cloud Run sends HTTP/2 without TLS to the one port it routes, and the binding listens there; the
    # edge's HTTP port is another, set explicitly so that the entry point does not give it PORT.
    assert spec["ports"][0]["name"] == "h2c"
    assert str(tf.resolve(spec["ports"][0]["container_port"])) == env["SPECIALISTS_GRPC_PORT"]
    assert env["SPECIALISTS_EDGE_PORT"] != env["SPECIALISTS_GRPC_PORT"]
    assert env["SPECIALISTS_SERVE_DISPATCHER"] == "false", "the API's relay sends every admitted job"
    # Otherwise the API's edge: the same settings (the same cards and keys) but its pool, and the API's secrets but
    # the relay's (the worker job secrets).
    api = container_env(tf, SERVICE, "api")
    own = {"SPECIALISTS_GRPC_PORT", "SPECIALISTS_EDGE_PORT", "SPECIALISTS_SERVE_DISPATCHER", "SPECIALISTS_DB_POOL_SIZE",
           "SPECIALISTS_DB_MAX_OVERFLOW"}
    assert {k: v for k, v in env.items() if k not in own} == {k: v for k, v in api.plain.items() if k not in own}
    relay_only = {"SPECIALISTS_WORKER_JOB_SECRETS"}
    assert container_env(tf, SERVICE, "grpc").secrets == {k: v for k, v in api.secrets.items() if k not in relay_only}
    grpc_port, http_port = free_port(), free_port()
    running = start_role(["serve"], terraform_environment(
        tf, SERVICE, "grpc", database_url, collector_url=collector.url, PORT=str(grpc_port),
        SPECIALISTS_GRPC_PORT=str(grpc_port), SPECIALISTS_EDGE_PORT=str(http_port),
    ), tmp_path / "grpc.log", port=http_port, ready_path="/readyz")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = a2a_pb2_grpc.A2AServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.GetTask(GetTaskRequest(id="t-1", tenant="conformance"), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value.details()
    finally:
        running.stop()


# --- every setting a service needs in production is set -----------------------------------------------


@pytest.mark.parametrize("role", sorted(ROLES))
def test_every_variable_terraform_sets_is_a_real_setting_or_a_model_key(tf, role):
    given = container_env(tf, *ROLES[role])
    model_keys = set(tf.default("model_key_env_names"))
    unknown = given.names - SETTING_NAMES - model_keys
    assert not unknown, f"{role}: not settings of core/settings.py: {sorted(unknown)}"


def test_the_api_gets_everything_serve_and_its_relay_refuse_to_start_without(tf, database_url, monkeypatch):
    from ops import local_secrets
    from workers.dispatch.process import check_dispatcher_settings

    settings = settings_from(terraform_environment(tf, SERVICE, "api", database_url), monkeypatch)
    assert not settings.database.embedded
    local_secrets.require(settings, ["key_signing_secrets", "worker_job_secrets"])
    check_dispatcher_settings(settings)
    assert settings.serve.dispatcher and not settings.serve.worker
    assert settings.serve.console is False, "the console is a service of its own (infra/console.tf)"
    # The settings validated the Cloud Tasks setup as a whole; these are the values it has.
    assert settings.dispatch.backend == "cloud_tasks"
    assert settings.dispatch.cloud_tasks_queue == tf.resolve(tf.resource("google_cloud_tasks_queue", "jobs")["name"])
    assert settings.dispatch.cloud_tasks_location == tf.resolve(tf.resource("google_cloud_tasks_queue", "jobs")["location"])
    assert settings.dispatch.cloud_tasks_project == tf.default("project_id")
    assert settings.keys.environment == "live"
    assert settings.edge.public_url and settings.edge.url.startswith("https://")
    assert settings.push.enabled and not settings.push.allow_loopback  # the JWKS, the relay child signs


def test_the_worker_gets_everything_it_refuses_to_start_or_serve_without(tf, database_url, monkeypatch):
    from workers.assembly import check_worker_settings
    from workers.hosted_rlm.serving import check_readiness

    env = terraform_environment(tf, SERVICE, "worker", database_url)
    settings = settings_from(env, monkeypatch)
    check_worker_settings(settings)
    assert settings.worker.oidc_verify, "production workers check the Cloud Tasks OIDC token"
    assert settings.hosted.checkpoint_key is not None
    assert not settings.hosted.model_routes_allow_scripted
    assert check_readiness(settings, environ=env) == []


def test_the_api_and_the_workers_agree_on_the_worker_url_audience_account_and_job_secret(tf):
    api = container_env(tf, SERVICE, "api")
    worker = container_env(tf, SERVICE, "worker")
    audience = worker.plain["SPECIALISTS_WORKER_AUDIENCE"]
    assert api.plain["SPECIALISTS_WORKER_AUDIENCE"] == audience
    # The worker's audience is its own Cloud Run URL (Cloud Run's IAM checks the token's audience too).
    assert audience == tf.reference("local.worker_url")
    assert re.fullmatch(rf"https://{tf.default('worker_service_name')}-\d+\.{tf.default('region')}\.run\.app", audience)
    assert api.plain["SPECIALISTS_DISPATCH_WORKER_URL"] == audience + JOBS_PATH
    invoker = tf.reference("google_service_account.invoker.email")
    assert api.plain["SPECIALISTS_DISPATCH_SERVICE_ACCOUNT"] == worker.plain["SPECIALISTS_DISPATCH_SERVICE_ACCOUNT"] == invoker
    assert api.secrets["SPECIALISTS_WORKER_JOB_SECRETS"] == worker.secrets["SPECIALISTS_WORKER_JOB_SECRETS"]


def test_ports_and_hosts_come_from_the_image_and_cloud_run_not_from_terraform(tf):
    expose = dockerfile_stages()[-1].last("EXPOSE").args
    for role in ("api", "worker", "console"):
        spec = container(tf, *ROLES[role])
        assert str(spec["ports"][0]["container_port"]) == expose
        assert not container_env(tf, *ROLES[role]).names & {
            "PORT", "SPECIALISTS_EDGE_PORT", "SPECIALISTS_WORKER_PORT", "SPECIALISTS_EDGE_HOST", "SPECIALISTS_WORKER_HOST",
            "SPECIALISTS_CONSOLE_PORT", "SPECIALISTS_CONSOLE_HOST",
        }


def test_every_specialists_route_is_a_real_endpoint_whose_key_the_worker_gets_from_secret_manager(tf):
    routes = production_routes(tf)
    worker = container_env(tf, SERVICE, "worker")
    for specialist_id, loaded in rlm_specs().items():
        route = routes[loaded.spec.model_route]
        assert route["kind"] == "openai", f"{specialist_id}: no scripted route in production"
        assert route["api_key_env"] in worker.secrets, f"{route['api_key_env']} is not set on the worker"
        assert worker.secrets[route["api_key_env"]][0] == "model_key"


# --- the database -----------------------------------------------------------------------------------


def test_the_database_has_a_private_ip_only_backups_and_point_in_time_recovery(tf):
    instance = tf.resource("google_sql_database_instance", "main")
    settings = instance["settings"][0]
    network = settings["ip_configuration"][0]
    assert network["ipv4_enabled"] is False and network["private_network"]
    backups = settings["backup_configuration"][0]
    assert backups["enabled"] is True and backups["point_in_time_recovery_enabled"] is True
    assert tf.resolve(backups["transaction_log_retention_days"]) >= 1
    assert instance["database_version"].startswith("POSTGRES_")
    assert instance["deletion_protection"] is True and settings["deletion_protection_enabled"] is True


# Which database user each role connects as (its DATABASE_URL's secret): the migration job owns the schema; the
# serving roles are DML-only users of migrations/grants.sql (tests/deploy/test_database_roles.py).
DATABASE_USER_OF = {"migrate": ("database_url", "app"), "api": ("database_url_edge", "edge"),
                    "grpc": ("database_url_edge", "edge"), "worker": ("database_url_worker", "worker"),
                    "console": ("database_url_operator", "operator"), "drill": ("database_url_operator", "operator")}


def test_database_url_reaches_the_cloud_sql_socket_every_container_mounts_as_its_roles_own_user(tf):
    connection_name = tf.reference("google_sql_database_instance.main.connection_name")
    mount = tf.reference("local.cloudsql_mount")
    for secret, user in set(DATABASE_USER_OF.values()):
        url = tf.resolve(tf.resource("google_secret_manager_secret_version", secret)["secret_data"])
        password = tf.resource("google_sql_user", user)["password"]
        assert tf.resource(*tf.name_of(password))["special"] is False, "the password goes into the URL unescaped"
        conninfo = psycopg.conninfo.conninfo_to_dict(libpq_url(db.sqlalchemy_url(url)))
        assert conninfo["host"] == f"{mount}/{connection_name}"
        assert conninfo["dbname"] == tf.default("database_name")
        assert conninfo["user"] == tf.resolve(tf.resource("google_sql_user", user)["name"])
    assert tf.resolve(tf.resource("google_sql_user", "app")["name"]) == tf.default("database_user")
    for role, (type_name, name) in ROLES.items():
        assert container_env(tf, type_name, name).secrets["DATABASE_URL"][0] == DATABASE_USER_OF[role][0], role
        volumes = {v["name"]: v for v in revision_template(tf, type_name, name)["volumes"]}
        mounted = {m["name"]: tf.resolve(m["mount_path"]) for m in container(tf, type_name, name)["volume_mounts"]}
        sockets = [n for n, v in volumes.items() if "cloud_sql_instance" in v]
        assert sockets and mounted[sockets[0]] == mount, role
        assert tf.resolve(volumes[sockets[0]]["cloud_sql_instance"][0]["instances"][0]) == connection_name


# --- Cloud Tasks and the limits it must respect ------------------------------------------------------


def test_the_dispatch_deadline_outlives_every_specialists_deadline_and_the_worker_request_outlives_it(tf):
    worker = container_env(tf, SERVICE, "worker").plain
    api = container_env(tf, SERVICE, "api").plain
    dispatch_deadline_s = int(api["SPECIALISTS_DISPATCH_DEADLINE_S"])
    assert dispatch_deadline_s == int(worker["SPECIALISTS_DISPATCH_DEADLINE_S"])
    assert 15 <= dispatch_deadline_s <= 1800, "Cloud Tasks' range"
    grace_s = WorkerSettings.model_fields["cancel_grace_s"].default
    longest_s = max(
        [float(api["SPECIALISTS_DISPATCH_JOB_DEADLINE_S"])]
        + [loaded.spec.limits.deadline_s for loaded in load_specs(PROJECT_ROOT / "specs").values()]
    )
    assert dispatch_deadline_s > longest_s + grace_s
    timeout_s = int(tf.resolve(revision_template(tf, SERVICE, "worker")["timeout"]).removesuffix("s"))
    assert timeout_s > dispatch_deadline_s, "Cloud Run would end a delivery before Cloud Tasks' deadline"


def test_the_queue_retries_as_long_as_a_job_body_is_valid_and_never_sends_more_than_workers_run(tf):
    queue = tf.resource("google_cloud_tasks_queue", "jobs")
    worker = container_env(tf, SERVICE, "worker").plain
    retry = queue["retry_config"][0]
    assert tf.resolve(retry["max_attempts"]) == -1
    assert int(tf.resolve(retry["max_retry_duration"]).removesuffix("s")) <= int(worker["SPECIALISTS_WORKER_JOB_MAX_AGE_S"])
    limits = queue["rate_limits"][0]
    template = revision_template(tf, SERVICE, "worker")
    per_instance = int(tf.resolve(template["max_instance_request_concurrency"]))
    assert per_instance == int(worker["SPECIALISTS_WORKER_MAX_CONCURRENT_JOBS"])
    most = per_instance * int(tf.resolve(template["scaling"][0]["max_instance_count"]))
    assert 0 < int(tf.resolve(limits["max_concurrent_dispatches"])) <= most
    assert float(tf.resolve(limits["max_dispatches_per_second"])) > 0


def test_the_api_always_has_an_instance_with_cpu_for_the_relay_and_the_lease_sweeper(tf):
    template = revision_template(tf, SERVICE, "api")
    assert int(tf.resolve(template["scaling"][0]["min_instance_count"])) >= 1
    assert container(tf, SERVICE, "api")["resources"][0]["cpu_idle"] is False


# --- who may do what -------------------------------------------------------------------------------


def test_the_worker_is_private_and_only_the_invoker_account_may_call_it(tf):
    assert tf.resource(SERVICE, "worker")["ingress"] == "INGRESS_TRAFFIC_INTERNAL_ONLY"
    invokers = members(tf, "google_cloud_run_v2_service_iam_member", "roles/run.invoker", "google_cloud_run_v2_service.worker")
    assert invokers == {account(tf, "invoker")}


def test_nothing_but_the_api_and_its_grpc_binding_is_open_to_everyone_and_nothing_is_granted_to_all_users(tf):
    public = [
        (kind, name)
        for (kind, name), body in tf.resources.items()
        if kind.endswith(("_iam_member", "_iam_binding")) and re.search(r"allUsers|allAuthenticatedUsers", str(body))
    ]
    assert public == [], "domain-restricted sharing refuses allUsers: a public service sets invoker_iam_disabled"
    open_to_all = {name for name, body in tf.of_type(SERVICE).items() if body.get("invoker_iam_disabled") is True}
    assert open_to_all == {"api", "grpc"}


def test_the_api_may_enqueue_and_act_as_the_invoker_and_the_invoker_may_do_nothing_else(tf):
    assert members(tf, "google_cloud_tasks_queue_iam_member", "roles/cloudtasks.enqueuer", "google_cloud_tasks_queue.jobs") == {
        account(tf, "api")
    }
    assert members(tf, "google_service_account_iam_member", "roles/iam.serviceAccountUser", "google_service_account.invoker") == {
        account(tf, "api")
    }
    granted_to_invoker = [
        (kind, name) for (kind, name), body in tf.resources.items()
        if kind.endswith("_iam_member") and "google_service_account.invoker.email" in str(body.get("member"))
    ]
    assert granted_to_invoker == [("google_cloud_run_v2_service_iam_member", "invoker_calls_worker")]


def test_the_drill_account_may_reach_cloud_sql_and_read_its_secrets_and_nothing_else(tf):
    # Not enqueue on the jobs queue, act as the invoker or call the workers: a drill reaches the workers
    # only through the API, as a customer's job does.
    email = "google_service_account.drill.email"
    granted = {
        body["role"]
        for (kind, _), body in tf.resources.items()
        if kind.endswith(("_iam_member", "_iam_binding")) and email in str(body.get("member")) + str(body.get("for_each"))
    }
    assert granted == {"roles/cloudsql.client", "roles/secretmanager.secretAccessor"}
    assert account(tf, "drill") not in members(
        tf, "google_cloud_tasks_queue_iam_member", "roles/cloudtasks.enqueuer", "google_cloud_tasks_queue.jobs"
    )
    assert account(tf, "drill") not in members(
        tf, "google_cloud_run_v2_service_iam_member", "roles/run.invoker", "google_cloud_run_v2_service.worker"
    )


def test_the_roles_that_use_the_database_may_reach_cloud_sql(tf):
    binding = tf.resource("google_project_iam_member", "cloudsql_client")
    assert binding["role"] == "roles/cloudsql.client"
    reach = {tf.resolve(email) for email in binding["for_each"].values()}
    for role in ROLES:
        assert tf.reference(f"google_service_account.{RUNS_AS[role]}.email") in reach
    assert tf.reference("google_service_account.invoker.email") not in reach


@pytest.mark.parametrize("role", sorted(ROLES))
def test_each_role_runs_as_its_own_account_and_may_read_exactly_the_secrets_it_is_given(tf, role):
    type_name, name = ROLES[role]
    runs_as = revision_template(tf, type_name, name)["service_account"]
    assert runs_as == f"${{google_service_account.{RUNS_AS[role]}.email}}"
    # In its environment, or as files its containers mount (the collector sidecar's configuration).
    given = {secret for secret, _ in container_env(tf, type_name, name).secrets.values()}
    for spec in [container(tf, type_name, name), *sidecars(tf, type_name, name)]:
        given |= set(mounted_secrets(tf, type_name, name, spec).values())
    on_secrets = [g for g in grants(tf) if g.address.startswith("google_secret_manager_secret_iam_member.")]
    assert {g.role for g in on_secrets} == {"roles/secretmanager.secretAccessor"}
    readable = {g.target.removeprefix("secret:") for g in on_secrets if g.member == f"account:{RUNS_AS[role]}"}
    assert readable == given


def test_the_project_and_region_are_variables_and_the_urls_are_outputs(tf):
    assert "default" not in tf.variables["project_id"]
    assert tf.default("region")
    assert {"api_url", "worker_url", "api_public_url", "grpc_url", "grpc_public_url"} <= set(tf.outputs)
