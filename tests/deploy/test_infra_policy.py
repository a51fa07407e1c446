"""What checkov cannot see in infra/ (it has no checks for Cloud Run v2, Secret Manager or Cloud Tasks), over
every service, job and account Terraform declares, so that a new one is covered the day it is added.

- every Cloud Run service has a declared ingress and exactly the invokers declared for it;
- no secret reaches a container in plain environment;
- every service account is granted exactly what its processes use, read from their containers' environment
  (a database URL, secrets, a Cloud Tasks relay), from the secrets their containers mount, and from what their
  OpenTelemetry Collector sidecars export (Cloud Trace, Cloud Monitoring), plus the grants declared below for the
  accounts that run no container of their own;
- Cloud SQL has no public IP, requires client certificates, keeps its backups and logs what an operator reads.

Adding a service means adding its entry to INGRESS; adding an account that runs no container, its entry to
NO_CONTAINER_GRANTS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from pydantic import SecretStr

from core.settings_doc import settings_fields
from tests.deploy.manifests import (
    Terraform,
    collector_config,
    container,
    container_env,
    mounted_secrets,
    revision_template,
    sidecars,
)

SERVICE = "google_cloud_run_v2_service"
JOB = "google_cloud_run_v2_job"
INVOKER = "roles/run.invoker"
PUBLIC = "invoker_iam_disabled"  # anyone may invoke: Cloud Run's IAM check is off on the service
# Each Cloud Run service: who may reach it (ingress) and who may invoke it. "account:NAME" is a service account,
# "agent:NAME" a Google service agent (google_project_service_identity.NAME).
INGRESS = {
    # Customers' agents; the service checks their API keys. Public by Cloud Run's invoker check turned off
    # (invoker_iam_disabled), never by an allUsers grant, which domain-restricted sharing refuses: PUBLIC.
    "api": ("INGRESS_TRAFFIC_ALL", {PUBLIC}),
    "grpc": ("INGRESS_TRAFFIC_ALL", {PUBLIC}),  # the API's gRPC binding, the same keys in metadata
    "worker": ("INGRESS_TRAFFIC_INTERNAL_ONLY", {"account:invoker"}),  # Cloud Tasks' deliveries only
    # Operators' browsers from anywhere, but IAP (enabled on the service) lets only its grantees through, and
    # then calls the service as its agent: the one invoker (tests/deploy/test_console_infra.py).
    "console": ("INGRESS_TRAFFIC_ALL", {"agent:iap"}),
}
# Services behind IAP enabled on the service itself: all their ingress goes through IAP first.
BEHIND_IAP = {"console"}
# The accounts that run no container: what they do instead, and so what they are granted.
NO_CONTAINER_GRANTS = {
    # The identity of Cloud Tasks' deliveries (the API's relay names it): it invokes the worker, nothing else.
    "invoker": {(INVOKER, "run_service:worker")},
    # Cloud Build (cloudbuild.yaml): pushes the image, deploys revisions and updates and executes the jobs,
    # as each runtime account, and writes the build's logs.
    "deployer": {
        ("roles/artifactregistry.writer", "repository:images"),
        ("roles/run.developer", "project"),
        ("roles/logging.logWriter", "project"),
        *{("roles/iam.serviceAccountUser", f"service_account:{name}")
          for name in ("api", "grpc", "worker", "migrate", "drill", "console")},
    },
}
# Settings that carry a credential though their type is not SecretStr.
SECRET_BY_NAME = {"DATABASE_URL"}
# Secrets whose one version is a file of infra/ with nothing secret in it: Secret Manager is how Cloud Run mounts
# a file (the collector's configuration).
CONFIG_SECRETS = {"otel_collector_config"}
# The sidecars the policy knows: Google's build of the OpenTelemetry Collector.
COLLECTOR_IMAGE = re.compile(r"/google-cloud-opentelemetry-collector/otelcol-google[:@]")
# What a collector's exporter writes, by the signal of the pipeline it is in, and the role it writes with (the
# instance's account: Google's exporters use the metadata server's credentials).
EXPORTER_ROLES = {
    ("googlecloud", "traces"): "roles/cloudtrace.agent",
    ("googlecloud", "metrics"): "roles/monitoring.metricWriter",
    ("googlecloud", "logs"): "roles/logging.logWriter",
    ("googlemanagedprometheus", "metrics"): "roles/monitoring.metricWriter",
}


@pytest.fixture(scope="module")
def tf() -> Terraform:
    return Terraform()


def containers(tf: Terraform) -> dict[tuple[str, str], dict]:
    """Every Cloud Run service and job, by (type, name)."""
    return {(kind, name): body for (kind, name), body in tf.resources.items() if kind in (SERVICE, JOB)}


# --- IAM members, expanded over their for_each --------------------------------------------------------

TARGET_FIELD = {
    "google_project_iam_member": None,
    "google_secret_manager_secret_iam_member": "secret_id",
    "google_cloud_tasks_queue_iam_member": "name",
    "google_service_account_iam_member": "service_account_id",
    "google_cloud_run_v2_service_iam_member": "name",
    "google_cloud_run_v2_job_iam_member": "name",
    "google_artifact_registry_repository_iam_member": "repository",
    "google_iap_web_cloud_run_service_iam_member": "cloud_run_service_name",
}
# Grants on a resource's IAP gate rather than on the resource: "iap_run_service:NAME".
IAP_GATE = {"google_iap_web_cloud_run_service_iam_member"}
TARGET_KIND = {
    "google_secret_manager_secret": "secret",
    "google_cloud_tasks_queue": "queue",
    "google_service_account": "service_account",
    "google_cloud_run_v2_service": "run_service",
    "google_cloud_run_v2_job": "run_job",
    "google_artifact_registry_repository": "repository",
}


@dataclass(frozen=True)
class Grant:
    member: str  # "account:NAME", "allUsers", or the member as written
    role: str
    target: str  # "project", "secret:NAME", "queue:NAME", "run_service:NAME"...
    address: str  # the Terraform resource that grants it


def _instances(tf: Terraform, body: dict) -> list[dict[str, str]]:
    """The (each.key, each.value) a resource is instantiated with, as text to substitute."""
    for_each = body.get("for_each")
    if for_each is None:
        return [{}]
    if isinstance(for_each, dict):
        return [{"each.key": key, "each.value": value} for key, value in for_each.items()]
    listed = re.fullmatch(r"\$\{toset\(\[(.*)\]\)\}", for_each)
    if listed:
        return [{"each.key": item, "each.value": item} for item in re.findall(r'"([^"]*)"', listed.group(1))]
    variable = re.fullmatch(r"\$\{toset\(var\.(\w+)\)\}", for_each)
    if variable:  # a deployment's own list (the console's operators): the tests' made-up value
        return [{"each.key": item, "each.value": item} for item in tf.default(variable.group(1))]
    whole = re.fullmatch(r"\$\{(google_[\w]+)\.(\w+)\}", for_each)
    if whole:  # for_each over a resource that is itself for_each: each.value is one of its instances
        return [{"each.value": f"${{{whole.group(1)}.{whole.group(2)}}}"}]
    if re.fullmatch(r"\$\{local\.\w+\}", for_each):  # a map of locals (the telemetry writers: empty when off)
        named = tf.resolve(for_each)
        assert isinstance(named, dict), f"for_each over {for_each}, which is no map"
        return [{"each.key": key, "each.value": value} for key, value in named.items()]
    raise AssertionError(f"for_each the tests cannot expand: {for_each}")


def _substitute(text: str, each: dict[str, str]) -> str:
    for name, value in each.items():
        reference = value[2:-1] if value.startswith("${") and value.endswith("}") else None
        # ${each.value.id} over a resource instance -> ${google_x.y.id}; ${each.value} -> the value itself
        if reference:
            text = re.sub(r"\$\{" + re.escape(name) + r"(\.\w+)?\}", lambda m: "${" + reference + (m.group(1) or "") + "}", text)
            text = text.replace("${" + name + "}", value)
        else:
            text = text.replace("${" + name + "}", value)
    return text


def _member(text: str) -> str:
    account = re.fullmatch(r"serviceAccount:\$\{google_service_account\.(\w+)\.email\}", text)
    if account:
        return f"account:{account.group(1)}"
    agent = re.fullmatch(r"serviceAccount:\$\{google_project_service_identity\.(\w+)\.email\}", text)
    if agent:
        return f"agent:{agent.group(1)}"
    return text


def _target(kind: str, body: dict, each: dict[str, str]) -> str:
    field = TARGET_FIELD[kind]
    if field is None:
        return "project"
    expression = _substitute(str(body[field]), each)
    reference = re.fullmatch(r"\$\{(google_\w+)\.(\w+)\.\w+\}", expression)
    assert reference and reference.group(1) in TARGET_KIND, f"{kind}: cannot tell what {expression} is"
    prefix = "iap_" if kind in IAP_GATE else ""
    return f"{prefix}{TARGET_KIND[reference.group(1)]}:{reference.group(2)}"


def grants(tf: Terraform) -> list[Grant]:
    found = []
    for (kind, name), body in tf.resources.items():
        if kind.endswith(("_iam_binding", "_iam_policy")):
            raise AssertionError(f"{kind}.{name}: authoritative IAM would remove grants Terraform does not know of; "
                                 "use _iam_member")
        if not kind.endswith("_iam_member"):
            continue
        assert kind in TARGET_FIELD, f"{kind}.{name}: teach tests/deploy/test_infra_policy.py what it grants on"
        for each in _instances(tf, body):
            found.append(Grant(
                member=_member(_substitute(body["member"], each)),
                role=_substitute(body["role"], each),
                target=_target(kind, body, each),
                address=f"{kind}.{name}",
            ))
    return found


# --- who may reach each service ----------------------------------------------------------------------


def test_every_cloud_run_service_has_its_declared_ingress_and_exactly_its_declared_invokers(tf):
    services = tf.of_type(SERVICE)
    assert set(services) == set(INGRESS), "declare each service's ingress and invokers in INGRESS"
    all_grants = grants(tf)
    for name, body in services.items():
        ingress, invokers = INGRESS[name]
        assert body["ingress"] == ingress, name
        on_it = [g for g in all_grants if g.target == f"run_service:{name}"]
        public = body.get("invoker_iam_disabled", False) is True
        assert public == (PUBLIC in invokers), f"{name}: invoker_iam_disabled as declared in INGRESS"
        assert {g.member for g in on_it if g.role == INVOKER} | ({PUBLIC} if public else set()) == invokers, name
        assert {g.role for g in on_it} <= {INVOKER}, f"{name}: only invokers are granted on a service"
        assert bool(body.get("iap_enabled", False)) == (name in BEHIND_IAP), f"{name}: IAP as declared in BEHIND_IAP"
        if name in BEHIND_IAP:  # IAP calls it as its agent; whom IAP lets through is granted on its gate
            assert invokers == {"agent:iap"}, name
            assert {g.role for g in all_grants if g.target == f"iap_run_service:{name}"} == {"roles/iap.httpsResourceAccessor"}
        elif ingress == "INGRESS_TRAFFIC_ALL":
            assert invokers == {PUBLIC}, f"{name}: reachable from the internet, but by whom? (IAP, or public)"


def test_a_private_service_has_one_invoker_and_nothing_is_public_but_the_declared_services(tf):
    assert not [g.address for g in grants(tf) if g.member in ("allUsers", "allAuthenticatedUsers")], \
        "public services turn Cloud Run's invoker check off (invoker_iam_disabled); allUsers is refused by domain-restricted sharing"
    for name, (ingress, members) in INGRESS.items():
        if ingress != "INGRESS_TRAFFIC_ALL":
            assert len(members) == 1 and PUBLIC not in members, name


# --- secrets ---------------------------------------------------------------------------------------


def secret_settings() -> set[str]:
    return {env for _, _, field, env in settings_fields() if "SecretStr" in repr(field.annotation)
            or field.annotation is SecretStr} | SECRET_BY_NAME


def test_no_secret_reaches_any_container_in_plain_environment(tf):
    secret_names = secret_settings() | set(tf.default("model_key_env_names"))
    assert "SPECIALISTS_KEY_SIGNING_SECRETS" in secret_names and "SPECIALISTS_METRICS_TOKEN" in secret_names
    for (kind, name) in containers(tf):
        given = container_env(tf, kind, name)
        plain_secrets = set(given.plain) & secret_names
        assert not plain_secrets, f"{name}: {sorted(plain_secrets)} in plain environment; give it from Secret Manager"
        for variable, value in given.plain.items():
            assert not re.search(r"random_password|secret_version|secret_data", value), (name, variable)
    # Nor in the raw Terraform of a container: a value computed from a password or a secret's data.
    for (kind, name), body in containers(tf).items():
        for env in container(tf, kind, name).get("env", []):
            assert "random_password" not in str(env.get("value", "")), (name, env["name"])


def test_every_secret_value_is_generated_or_given_as_a_sensitive_variable(tf):
    for name, version in tf.of_type("google_secret_manager_secret_version").items():
        data = str(version["secret_data"])
        if data.startswith("${file("):
            assert name in CONFIG_SECRETS, f"{name}: a secret's value in a file of the repository"
            continue
        references = re.findall(r"\$\{([^}]*)\}", data)
        assert references, f"{name}: a literal secret in Terraform"
        for reference in references:
            if reference.startswith("var."):
                assert tf.variables[reference.split(".")[1].split("[")[0]].get("sensitive") is True, (name, reference)


# --- least privilege -----------------------------------------------------------------------------------


def needs(tf: Terraform, kind: str, name: str) -> set[tuple[str, str]]:
    """What one container's process reaches, read from the environment Terraform gives it."""
    given = container_env(tf, kind, name)
    needed: set[tuple[str, str]] = set()
    if "DATABASE_URL" in given.secrets:
        needed.add(("roles/cloudsql.client", "project"))
    for secret, _ in given.secrets.values():
        needed.add(("roles/secretmanager.secretAccessor", f"secret:{secret}"))
    relays = given.plain.get("SPECIALISTS_DISPATCH_BACKEND") == "cloud_tasks" and (
        given.plain.get("SPECIALISTS_SERVE_DISPATCHER", "true") != "false"
        or tf.resolve(container(tf, kind, name).get("args", ["serve"]))[:1] == ["dispatcher"]
    )
    if relays:  # the Cloud Tasks relay: enqueues on its queue, as the account its tasks' OIDC tokens name
        queues = [q for q, body in tf.of_type("google_cloud_tasks_queue").items()
                  if tf.resolve(body["name"]) == given.plain["SPECIALISTS_CLOUD_TASKS_QUEUE"]]
        assert len(queues) == 1, f"{name}: its queue {given.plain['SPECIALISTS_CLOUD_TASKS_QUEUE']} is not in infra/"
        needed.add(("roles/cloudtasks.enqueuer", f"queue:{queues[0]}"))
        accounts = [a for a in tf.of_type("google_service_account")
                    if tf.reference(f"google_service_account.{a}.email") == given.plain["SPECIALISTS_DISPATCH_SERVICE_ACCOUNT"]]
        assert len(accounts) == 1, f"{name}: SPECIALISTS_DISPATCH_SERVICE_ACCOUNT is not an account of infra/"
        needed.add(("roles/iam.serviceAccountUser", f"service_account:{accounts[0]}"))
    for spec in [container(tf, kind, name), *sidecars(tf, kind, name)]:
        for secret in mounted_secrets(tf, kind, name, spec).values():
            needed.add(("roles/secretmanager.secretAccessor", f"secret:{secret}"))
    for spec in sidecars(tf, kind, name):
        assert COLLECTOR_IMAGE.search(str(tf.resolve(spec["image"]))), (
            f"{name}: a sidecar the policy does not know ({tf.resolve(spec['image'])}); teach it what it writes")
        needed |= collector_needs(collector_config(tf, kind, name, spec))
    return needed


def collector_needs(config: dict) -> set[tuple[str, str]]:
    """The roles a collector's exporters write with, from the pipelines of its configuration."""
    needed = set()
    for pipeline, body in config["service"]["pipelines"].items():
        signal = pipeline.split("/")[0]
        for exporter in body["exporters"]:
            role = EXPORTER_ROLES.get((exporter.split("/")[0], signal))
            assert role, f"the collector's {exporter} in its {pipeline} pipeline: teach EXPORTER_ROLES its role"
            needed.add((role, "project"))
    return needed


def runs_as(tf: Terraform, kind: str, name: str) -> str:
    account = re.fullmatch(r"\$\{google_service_account\.(\w+)\.email\}", revision_template(tf, kind, name)["service_account"])
    assert account, f"{name} runs as an account of infra/, not the default compute account"
    return account.group(1)


@pytest.mark.parametrize("given", [{}, {"otel_enabled": False}], ids=["as_deployed", "without_telemetry"])
def test_every_service_account_is_granted_exactly_what_its_processes_use(given):
    tf = Terraform(given=given)
    granted: dict[str, set[tuple[str, str]]] = {}
    for grant in grants(tf):
        if grant.member.startswith("account:"):
            granted.setdefault(grant.member.removeprefix("account:"), set()).add((grant.role, grant.target))
    needed: dict[str, set[tuple[str, str]]] = {name: set() for name in tf.of_type("google_service_account")}
    for kind, name in containers(tf):
        needed[runs_as(tf, kind, name)] |= needs(tf, kind, name)
    running = {runs_as(tf, kind, name) for kind, name in containers(tf)}
    assert not running & set(NO_CONTAINER_GRANTS), "an account that runs a container has its grants derived"
    for account, declared in NO_CONTAINER_GRANTS.items():
        needed[account] |= declared
    for account in needed:
        assert granted.get(account, set()) == needed[account], (
            f"{account}: granted beyond its use {sorted(granted.get(account, set()) - needed[account])}, "
            f"missing {sorted(needed[account] - granted.get(account, set()))}"
        )
    assert set(granted) <= set(needed), "a grant to an account infra/ does not declare"


def test_the_relay_names_the_invoker_and_targets_the_private_service(tf):
    api = container_env(tf, SERVICE, "api").plain
    assert api["SPECIALISTS_DISPATCH_SERVICE_ACCOUNT"] == tf.reference("google_service_account.invoker.email")
    assert NO_CONTAINER_GRANTS["invoker"] == {(INVOKER, "run_service:worker")}
    assert api["SPECIALISTS_DISPATCH_WORKER_URL"].startswith(tf.reference("local.worker_url"))
    assert INGRESS["worker"][0] == "INGRESS_TRAFFIC_INTERNAL_ONLY"


def test_every_project_wide_role_is_one_no_narrower_resource_can_hold(tf):
    # Cloud SQL connections, Cloud Run deployments, log, trace and metric writing exist only at the project level.
    project_roles = {g.role for g in grants(tf) if g.target == "project"}
    assert project_roles <= {"roles/cloudsql.client", "roles/run.developer", "roles/logging.logWriter",
                             "roles/cloudtrace.agent", "roles/monitoring.metricWriter"}
    assert not {r for r in project_roles if re.search(r"owner|editor|admin", r, re.IGNORECASE)}


# --- Cloud SQL -------------------------------------------------------------------------------------


def test_cloud_sql_has_no_public_ip_requires_client_certificates_and_keeps_its_backups(tf):
    for name, instance in tf.of_type("google_sql_database_instance").items():
        settings = instance["settings"][0]
        network = settings["ip_configuration"][0]
        assert network["ipv4_enabled"] is False and network["private_network"], name
        assert not network.get("authorized_networks"), name
        # Cloud Run's Cloud SQL connection (the Auth Proxy) presents the client certificate; nothing else can.
        assert network["ssl_mode"] == "TRUSTED_CLIENT_CERTIFICATE_REQUIRED", name
        backups = settings["backup_configuration"][0]
        assert backups["enabled"] is True and backups["point_in_time_recovery_enabled"] is True, name
        retention = backups["backup_retention_settings"][0]
        assert retention["retention_unit"] == "COUNT" and int(tf.resolve(retention["retained_backups"])) >= 7, name
        assert instance["deletion_protection"] is True and settings["deletion_protection_enabled"] is True, name


def test_cloud_sql_logs_connections_disconnections_and_lock_waits(tf):
    for name, instance in tf.of_type("google_sql_database_instance").items():
        flags = {flag["name"]: flag["value"] for flag in instance["settings"][0].get("database_flags", [])}
        for flag in ("log_connections", "log_disconnections", "log_lock_waits", "log_checkpoints"):
            assert flags.get(flag) == "on", f"{name}: {flag}"


def test_every_container_reaches_cloud_sql_only_through_its_socket(tf):
    # TRUSTED_CLIENT_CERTIFICATE_REQUIRED holds only if every client comes through the Cloud SQL connection.
    for (kind, name) in containers(tf):
        if "DATABASE_URL" not in container_env(tf, kind, name).secrets:
            continue
        volumes = [v for v in revision_template(tf, kind, name).get("volumes", []) if "cloud_sql_instance" in v]
        assert volumes, f"{name}: a database URL without the Cloud SQL connection"
