"""The operator console's production side (infra/console.tf): who reaches it, what its account may do, what it
is given, and the operators' list a deployment must name.

Two gates stand before every console page: IAP, enabled on the Cloud Run service itself, lets through only the
accounts granted on it; then the console verifies IAP's signed header and checks the email against
SPECIALISTS_CONSOLE_OPERATORS. Both come from the one variable ``console_operators``, so they cannot disagree.
The grants in general are test_infra_policy.py's (every account exactly what its container uses); here, what is
particular to the console.
"""

from __future__ import annotations

import re

import pytest

from core.settings import PROJECT_ROOT, ConsoleSettings
from tests import http_calls
from tests.deploy.conftest import settings_from, terraform_environment
from tests.deploy.iap import IAP_HEADER
from tests.deploy.manifests import (
    CONSOLE_OPERATORS,
    PROJECT_NUMBER,
    container,
    container_env,
    plan_variables,
    revision_template,
)

pytestmark = pytest.mark.timeout(90, func_only=True)

SERVICE = "google_cloud_run_v2_service"
IAP_ACCESSOR = "roles/iap.httpsResourceAccessor"
# What only other roles hold: the console never signs job bodies, resumes checkpoints, signs push notifications
# or scrapes metrics.
NEVER_THE_CONSOLES = {"worker_job", "checkpoint_key", "push_signing", "metrics_token", "database_password", "model_key"}
# Settings of the A2A path's plumbing (Cloud Tasks, the relay, the workers): none is the console's.
PLUMBING = re.compile(r"^SPECIALISTS_(DISPATCH|CLOUD_TASKS|WORKER|SERVE|GRPC|EDGE|PUSH|METRICS)_")


def test_the_console_is_its_own_service_behind_iap_on_cloud_run_from_the_pinned_beta_provider(tf):
    console = tf.resource(SERVICE, "console")
    assert console["iap_enabled"] is True
    assert tf.resolve(console["name"]) == tf.default("console_service_name")
    assert tf.resolve(container(tf, SERVICE, "console")["args"]) == ["console"]
    # In provider 6.x, `iap_enabled` and the IAP grants on a Cloud Run service are the beta provider's.
    beta_only = [console, *tf.of_type("google_iap_web_cloud_run_service_iam_member").values(),
                 *tf.of_type("google_project_service_identity").values()]
    assert all(body.get("provider") == "google-beta" for body in beta_only)
    providers = tf.files["versions.tf"]["terraform"][0]["required_providers"][0]
    assert providers["google-beta"]["source"] == "hashicorp/google-beta"
    assert re.fullmatch(r"~> 6\.\d+", providers["google-beta"]["version"]), "pinned to a major, like the others"
    assert {p["project"] for p in tf.files["versions.tf"]["provider"][0].values()} == {"${var.project_id}"}
    apis = tf.resource("google_project_service", "apis")["for_each"]
    assert '"iap.googleapis.com"' in apis


def test_iap_lets_through_exactly_the_console_operators_and_the_console_lists_the_same_accounts(tf):
    grants = tf.of_type("google_iap_web_cloud_run_service_iam_member")
    assert list(grants) == ["operators_open_console"], "the one IAP grant of infra/"
    grant = grants["operators_open_console"]
    assert grant["for_each"] == "${toset(var.console_operators)}"
    assert grant["member"] == "user:${each.value}" and grant["role"] == IAP_ACCESSOR
    assert grant["cloud_run_service_name"] == "${google_cloud_run_v2_service.console.name}"
    env = container_env(tf, SERVICE, "console").plain
    assert env["SPECIALISTS_CONSOLE_AUTH"] == "iap"
    assert env["SPECIALISTS_CONSOLE_OPERATORS"].split(",") == CONSOLE_OPERATORS == tf.default("console_operators")
    # Nobody else is granted IAP access, on anything.
    iap_roles = [(kind, name) for (kind, name), body in tf.resources.items()
                 if kind.endswith("_iam_member") and "roles/iap." in str(body.get("role"))]
    assert iap_roles == [("google_iap_web_cloud_run_service_iam_member", "operators_open_console")]


def test_behind_iap_only_iaps_service_agent_may_invoke_the_console(tf):
    invokers = [body for body in tf.of_type("google_cloud_run_v2_service_iam_member").values()
                if body["name"] == "${google_cloud_run_v2_service.console.name}"]
    assert [(b["role"], b["member"]) for b in invokers] == [
        ("roles/run.invoker", "serviceAccount:${google_project_service_identity.iap.email}")
    ]
    assert tf.resolve(tf.resource("google_project_service_identity", "iap")["service"]) == "iap.googleapis.com"
    assert "allUsers" not in str(invokers) and "allAuthenticatedUsers" not in str(invokers)


def test_the_iap_audience_the_console_checks_is_the_one_iap_signs_for_this_service(tf):
    env = container_env(tf, SERVICE, "console").plain
    expected = f"/projects/{PROJECT_NUMBER}/locations/{tf.default('region')}/services/{tf.default('console_service_name')}"
    assert env["SPECIALISTS_CONSOLE_IAP_AUDIENCE"] == expected == tf.resolve(tf.outputs["console_iap_audience"]["value"])
    # Its forms are posted only from its own run.app URL (the Origin check's one allowed origin).
    assert env["SPECIALISTS_CONSOLE_ALLOWED_ORIGINS"] == (
        f"https://{tf.default('console_service_name')}-{PROJECT_NUMBER}.{tf.default('region')}.run.app")
    # IAP's keys come from the settings' default address: nothing overrides it in production.
    assert "SPECIALISTS_CONSOLE_IAP_CERTS_URL" not in env


def test_the_console_reads_the_database_the_key_signing_secrets_and_its_session_secrets_and_nothing_else(tf):
    given = container_env(tf, SERVICE, "console")
    assert {variable: secret for variable, (secret, _) in given.secrets.items()} == {
        "DATABASE_URL": "database_url_operator",  # the operator's DML-only user
        "SPECIALISTS_KEY_SIGNING_SECRETS": "key_signing",
        "SPECIALISTS_CONSOLE_SESSION_SECRETS": "console_session",
    }
    assert not {secret for secret, _ in given.secrets.values()} & NEVER_THE_CONSOLES
    assert not [name for name in given.plain if PLUMBING.match(name)], "no Cloud Tasks, worker or edge setting"
    # The keys it issues are the API's: signed with the same secrets, of the same environment.
    api = container_env(tf, SERVICE, "api")
    assert given.secrets["SPECIALISTS_KEY_SIGNING_SECRETS"] == api.secrets["SPECIALISTS_KEY_SIGNING_SECRETS"]
    assert given.plain["SPECIALISTS_KEY_ENVIRONMENT"] == api.plain["SPECIALISTS_KEY_ENVIRONMENT"]
    # Its account: Cloud SQL, and exactly those secrets; nothing on a queue, an account or another service.
    email = "${google_service_account.console.email}"
    granted = {(kind, body["role"]) for (kind, _), body in tf.resources.items()
               if kind.endswith("_iam_member") and email in str(body.get("member")) + str(body.get("for_each"))}
    assert granted == {("google_project_iam_member", "roles/cloudsql.client"),
                       ("google_secret_manager_secret_iam_member", "roles/secretmanager.secretAccessor")}
    assert revision_template(tf, SERVICE, "console")["service_account"] == email


def test_the_session_secrets_are_generated_in_secret_manager_and_readable_by_the_console_alone(tf):
    secret = tf.resource("google_secret_manager_secret", "console_session")
    assert tf.resolve(secret["secret_id"]) == "specialists-console-session-secrets"
    version = tf.resource("google_secret_manager_secret_version", "console_session")
    assert version["secret_data"] == "${random_password.console_session.result}"
    assert int(tf.resolve(tf.resource("random_password", "console_session")["length"])) >= 64
    readers = [body["member"] for body in tf.of_type("google_secret_manager_secret_iam_member").values()
               if "google_secret_manager_secret.console_session.id" in str(body["for_each"])]
    assert readers == ["serviceAccount:${google_service_account.console.email}"]


def test_the_console_reaches_cloud_sql_through_its_socket_and_scales_to_a_few_instances(tf):
    template = revision_template(tf, SERVICE, "console")
    sockets = [v for v in template["volumes"] if "cloud_sql_instance" in v]
    assert sockets and container(tf, SERVICE, "console")["volume_mounts"][0]["mount_path"] == "${local.cloudsql_mount}"
    assert template["vpc_access"][0]["egress"] == "PRIVATE_RANGES_ONLY", "IAP's keys are fetched directly"
    assert int(tf.resolve(template["scaling"][0]["min_instance_count"])) == 0
    assert 1 <= int(tf.resolve(template["scaling"][0]["max_instance_count"])) <= 10
    probes = container(tf, SERVICE, "console")
    assert probes["startup_probe"][0]["http_get"][0]["path"] == "/healthz"
    assert "template[0].containers[0].image" in str(tf.resource(SERVICE, "console")["lifecycle"][0]["ignore_changes"])


def test_the_consoles_url_is_an_output(tf):
    assert tf.outputs["console_url"]["value"] == "${google_cloud_run_v2_service.console.uri}"


# --- the console, started from what Terraform gives it, behind a stand-in for IAP -----------------------


def page(console, path: str = "/", assertion: str | None = None) -> int:
    """The status a browser ends on, IAP's assertion on every request (IAP adds it to each one it lets through)."""
    headers = {IAP_HEADER: assertion} if assertion is not None else {}
    answer = http_calls.get(f"{console.url}{path}", headers=headers, timeout=30, follow_redirects=True)
    assert answer.url.path != "/login", "with IAP, the identity is IAP's: no login form"
    return answer.status_code


def test_the_console_starts_from_terraforms_environment_with_everything_it_refuses_to_start_without(
    tf, database_url, monkeypatch
):
    from ops import local_secrets
    from ops.console.auth import check_console_settings

    settings = settings_from(terraform_environment(tf, SERVICE, "console", database_url), monkeypatch)
    assert not settings.database.embedded
    assert settings.console.auth == "iap"
    check_console_settings(settings.console)
    local_secrets.require(settings, ["key_signing_secrets"])
    assert settings.console.operators == CONSOLE_OPERATORS
    assert settings.keys.environment == tf.default("key_environment")
    # The secret Terraform generates is long enough for the console to start with.
    length = int(tf.resolve(tf.resource("random_password", "console_session")["length"]))
    assert length >= ConsoleSettings.model_fields["min_secret_chars"].default


def test_without_iaps_assertion_the_console_answers_its_health_and_nothing_else(console_from_terraform):
    assert page(console_from_terraform, "/healthz") == 200  # Cloud Run's probes reach the container directly
    assert page(console_from_terraform, "/") == 401


def test_a_console_operator_let_through_by_iap_gets_the_console(tf, console_from_terraform, fake_iap):
    audience = container_env(tf, SERVICE, "console").plain["SPECIALISTS_CONSOLE_IAP_AUDIENCE"]
    assert page(console_from_terraform, "/", fake_iap.assertion(CONSOLE_OPERATORS[0], audience)) == 200


def test_an_account_iap_let_through_but_not_in_console_operators_is_refused(tf, console_from_terraform, fake_iap):
    audience = container_env(tf, SERVICE, "console").plain["SPECIALISTS_CONSOLE_IAP_AUDIENCE"]
    assert page(console_from_terraform, "/", fake_iap.assertion("mallory@example.com", audience)) == 403


def test_an_assertion_iap_signed_for_another_service_is_refused(tf, console_from_terraform, fake_iap):
    # The same project's API, behind IAP, would carry this audience: it opens nothing here.
    other = f"/projects/{PROJECT_NUMBER}/locations/{tf.default('region')}/services/{tf.default('api_service_name')}"
    assert page(console_from_terraform, "/", fake_iap.assertion(CONSOLE_OPERATORS[0], other)) == 401


# --- the operators' list, validated by Terraform itself ------------------------------------------------


def test_terraform_accepts_a_list_of_operators_emails(tmp_path):
    planned = plan_variables(tmp_path, console_operators='["alice@example.com", "ops.bob+console@corp.example.co"]')
    assert planned.returncode == 0, planned.stdout + planned.stderr


@pytest.mark.parametrize("operators, refusal", [
    ("[]", "names at least one operator"),
    ('["Alice@example.com"]', "in lower case"),
    ('["user:alice@example.com"]', "without a member prefix"),
    ('["alice@example.com,bob@example.com"]', "Google account's email address"),
    ('["alice"]', "Google account's email address"),
    ('["alice@example.com", "alice@example.com"]', "each account once"),
])
def test_terraform_refuses_operators_that_are_no_list_of_distinct_lower_case_emails(tmp_path, operators, refusal):
    planned = plan_variables(tmp_path, console_operators=operators)
    assert planned.returncode != 0
    said = " ".join((planned.stdout + planned.stderr).split())
    assert "Invalid value for variable" in said and refusal in said, said


# --- docs/OPERATIONS.md, "The console in production" ---------------------------------------------------


def production_section() -> str:
    text = (PROJECT_ROOT / "docs" / "OPERATIONS.md").read_text()
    return text.split("### The console in production\n", 1)[1].split("\n### ", 1)[0]


def test_the_docs_rotation_commands_name_the_secret_and_the_service_terraform_declares(tf):
    section = production_section()
    commands = [line for block in re.findall(r"```\n(.*?)```", section, re.DOTALL) for line in block.splitlines()]
    secret_id = tf.resolve(tf.resource("google_secret_manager_secret", "console_session")["secret_id"])
    service = tf.default("console_service_name")
    assert any(f"gcloud secrets versions add {secret_id} " in command for command in commands)
    services = {re.search(r"gcloud run services [\w-]+ (\S+)", command).group(1)
                for command in commands if command.startswith("gcloud run services ")}
    assert services == {service}
    # Newest first: the new secret, then the old one.
    assert any(command.startswith("printf '%s,%s' \"$NEW\" \"$OLD\"") for command in commands)


def test_the_docs_name_both_gates_and_everything_the_consoles_account_may_read(tf):
    section = production_section()
    for gate in ("console_operators", "roles/iap.httpsResourceAccessor", "SPECIALISTS_CONSOLE_OPERATORS",
                 "SPECIALISTS_CONSOLE_IAP_AUDIENCE"):
        assert gate in section, gate
    for variable, (secret, secret_id) in container_env(tf, SERVICE, "console").secrets.items():
        assert f"`{secret_id}`" in section, f"{variable}: its secret {secret_id} is not named"
