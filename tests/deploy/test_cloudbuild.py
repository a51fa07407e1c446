"""cloudbuild.yaml checked against infra/ and the code: the order of the release, what stops it, the names.

Cloud Build runs the steps one after another and stops at the first that fails, unless a step says
otherwise (`waitFor`, `allowFailure`, `allowExitCodes`): so the order of the steps and the absence of
those keys are what make "a failed drill stops the rollout" true.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.settings import PROJECT_ROOT
from tests.deploy.manifests import (
    BuildStep,
    Terraform,
    build_steps,
    cloudbuild,
    container,
    revision_template,
    substitute,
    substitutions,
)

pytestmark = pytest.mark.timeout(30)

RELEASE_ORDER = ["checks", "terraform", "test", "build", "smoke", "push", "migrate", "deploy-worker", "deploy-api", "deploy-grpc",
                 "deploy-console", "drill", "traffic"]
# Built-in substitutions Cloud Build fills in itself.
BUILT_IN = {"PROJECT_ID", "SHORT_SHA", "COMMIT_SHA", "BUILD_ID", "LOCATION", "PROJECT_NUMBER"}
# What a trigger gives a build, and a tag URL as the deploy-api step writes it (Cloud Run's form).
TRIGGER = {"PROJECT_ID": "acme-specialists", "SHORT_SHA": "abc1234"}
TAG_URL = "https://r-abc1234---specialists-api-x7kq2lmn3a-ew.a.run.app"

# Stands in for gcloud, which cannot reach Google from here: records each call, one JSON list a line,
# and fails the calls whose subcommand (`update`, `execute`) is named in FAKE_GCLOUD_FAILS.
FAKE_GCLOUD = """\
import json, os, sys
with open(os.environ["FAKE_GCLOUD_CALLS"], "a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
sys.exit(1 if set(sys.argv[1:4]) & set(os.environ.get("FAKE_GCLOUD_FAILS", "").split()) else 0)
"""


@pytest.fixture(scope="module")
def document() -> dict:
    return cloudbuild()


@pytest.fixture(scope="module")
def steps(document) -> dict[str, BuildStep]:
    return {step.id: step for step in build_steps(document)}


def test_the_release_runs_its_steps_in_order_one_after_another(document, steps):
    assert list(steps) == RELEASE_ORDER
    for step in document["steps"]:
        assert not {"waitFor", "allowFailure", "allowExitCodes"} & set(step), f"{step['id']} would not stop the release"


def test_every_multi_command_step_stops_at_its_first_failing_command(steps):
    for step in steps.values():
        if step.entrypoint == "bash":
            assert step.command.lstrip().startswith("set -euo pipefail"), step.id
            assert "|| true" not in step.command, step.id


def test_the_tests_are_the_readmes_and_cis_test_command(steps):
    assert "./dev test" in steps["test"].command
    assert "./dev test" in (PROJECT_ROOT / ".ci" / "run").read_text()


def test_the_image_is_built_pushed_and_the_same_image_is_deployed_everywhere(steps):
    assert steps["build"].args[0] == "build" and "${_IMAGE}" in steps["build"].args
    assert "DOCKER_BUILDKIT=1" in steps["build"].raw["env"], "the Dockerfile's RUN --mount needs BuildKit"
    assert 'docker push "${_IMAGE}"' in steps["push"].command
    for step_id in ("migrate", "deploy-worker", "deploy-api", "deploy-grpc", "deploy-console", "drill"):
        assert "--image=${_IMAGE}" in steps[step_id].command.replace('"', ""), step_id
    for step_id in ("deploy-worker", "deploy-api", "deploy-grpc"):  # beside a collector: the image is app's
        assert "--container=app --image=${_IMAGE}" in steps[step_id].command.replace('"', ""), step_id


def test_migrations_run_as_the_cloud_run_job_and_are_waited_for_before_any_deploy(steps):
    command = steps["migrate"].command.replace('"', "")
    assert "gcloud run jobs update ${_MIGRATE_JOB}" in command
    assert re.search(r"gcloud run jobs execute \$\{_MIGRATE_JOB\} .*--wait", command)


def test_the_worker_is_deployed_private(steps):
    args = steps["deploy-worker"].args
    assert args[:3] == ["run", "deploy", "${_WORKER_SERVICE}"]
    assert "--ingress=internal" in args and "--no-allow-unauthenticated" in args
    assert "--allow-unauthenticated" not in args


def test_the_api_is_deployed_as_a_tagged_revision_without_traffic_and_drilled_through_its_tag(steps):
    deploy = steps["deploy-api"].command.replace('"', "")
    assert "gcloud run deploy ${_API_SERVICE}" in deploy
    assert "--no-traffic" in deploy and "--tag=${_REVISION_TAG}" in deploy
    assert "> /workspace/api_tag_url" in deploy, "the tag's URL is handed to the drill"


def test_the_grpc_binding_is_deployed_as_the_api_a_tagged_revision_without_traffic(steps):
    deploy = steps["deploy-grpc"].command.replace('"', "")
    assert "gcloud run deploy ${_GRPC_SERVICE}" in deploy
    assert "--no-traffic" in deploy and "--tag=${_REVISION_TAG}" in deploy


def test_the_console_is_deployed_as_the_api_a_tagged_revision_without_traffic_before_the_drill(steps):
    deploy = steps["deploy-console"].command.replace('"', "")
    assert "gcloud run deploy ${_CONSOLE_SERVICE}" in deploy
    assert "--no-traffic" in deploy and "--tag=${_REVISION_TAG}" in deploy
    # Who reaches it is Terraform's (IAP on the service, infra/console.tf): a deploy never opens it.
    assert "allow-unauthenticated" not in deploy and "--ingress" not in deploy and "--iap" not in deploy
    assert RELEASE_ORDER.index("deploy-console") < RELEASE_ORDER.index("drill")


# --- the drill step, run as Cloud Build runs it, with gcloud standing in for Google -------------------


def stand_in(tmp_path: Path, command: str, program: str) -> tuple[Path, Path]:
    """A folder for PATH holding ``command`` as ``program`` (Python), and the file its calls are recorded in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / command
    fake.write_text(f"#!{sys.executable}\n{program}")
    fake.chmod(0o755)
    calls = tmp_path / f"{command}-calls"
    calls.touch()
    return bin_dir, calls


def run_step(step: BuildStep, document: dict, tmp_path: Path, *, tag_url: str | None = TAG_URL, fails: str = "") -> tuple[int, list[list[str]]]:
    """The step's script after Cloud Build's substitutions, run by bash with /workspace in ``tmp_path``: its
    exit status, and the gcloud calls it made."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    if tag_url is not None:
        (workspace / "api_tag_url").write_text(tag_url + "\n")
    bin_dir, calls = stand_in(tmp_path, "gcloud", FAKE_GCLOUD)
    script = substitute(step.command, substitutions(document, **TRIGGER)).replace("/workspace/", f"{workspace}/")
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_GCLOUD_CALLS": str(calls), "FAKE_GCLOUD_FAILS": fails
    }
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=20)
    return done.returncode, [json.loads(line) for line in calls.read_text().splitlines()]


def test_the_drill_step_puts_the_released_image_on_the_drill_job_then_executes_it_against_the_tag_and_waits(
    document, steps, tmp_path
):
    status, calls = run_step(steps["drill"], document, tmp_path)
    assert status == 0
    values = substitutions(document, **TRIGGER)
    job, region = values["_DRILL_JOB"], f"--region={values['_REGION']}"
    assert calls == [
        ["run", "jobs", "update", job, region, f"--image={values['_IMAGE']}"],
        ["run", "jobs", "execute", job, region, "--wait", f"--args=drill,--target,{TAG_URL}"],
    ]


def test_a_failed_drill_execution_fails_the_step(document, steps, tmp_path):
    status, calls = run_step(steps["drill"], document, tmp_path, fails="execute")
    assert status != 0
    assert [call[2] for call in calls] == ["update", "execute"]


def test_the_drill_never_runs_an_older_image_when_the_jobs_update_fails(document, steps, tmp_path):
    status, calls = run_step(steps["drill"], document, tmp_path, fails="update")
    assert status != 0
    assert [call[2] for call in calls] == ["update"]


def test_without_the_revisions_tag_url_the_drill_step_fails_before_executing_anything(document, steps, tmp_path):
    status, calls = run_step(steps["drill"], document, tmp_path, tag_url=None)
    assert status != 0
    assert calls == []


def test_the_release_overrides_only_the_drill_jobs_target_which_by_hand_is_the_revision_with_the_traffic(
    document, steps, tf, tmp_path
):
    _, calls = run_step(steps["drill"], document, tmp_path)
    overridden = calls[-1][-1].removeprefix("--args=").split(",")
    own = [tf.resolve(arg) for arg in container(tf, "google_cloud_run_v2_job", "drill")["args"]]
    assert own == ["drill", "--target", tf.reference("local.api_run_url")]
    assert overridden == own[:2] + [TAG_URL]


def test_the_build_outlives_the_migration_and_the_drill_it_waits_for(document, tf):
    def task_timeout_s(job: str) -> int:
        return int(tf.resolve(revision_template(tf, "google_cloud_run_v2_job", job)["timeout"]).removesuffix("s"))

    build_timeout_s = int(document["timeout"].removesuffix("s"))
    assert build_timeout_s > task_timeout_s("migrate") + task_timeout_s("drill")


def test_the_console_step_deploys_the_released_image_under_the_releases_tag(document, steps, tmp_path):
    status, calls = run_step(steps["deploy-console"], document, tmp_path, tag_url=None)
    assert status == 0
    values = substitutions(document, **TRIGGER)
    assert calls == [["run", "deploy", values["_CONSOLE_SERVICE"], f"--region={values['_REGION']}",
                      f"--image={values['_IMAGE']}", "--no-traffic", f"--tag={values['_REVISION_TAG']}"]]


def test_only_the_last_step_moves_traffic_and_only_to_the_drilled_tag(document, steps, tmp_path):
    traffic_moves = [step.id for step in steps.values() if "update-traffic" in step.command or "--to-" in step.command]
    assert traffic_moves == ["traffic"]
    assert list(steps)[-1] == "traffic"
    status, calls = run_step(steps["traffic"], document, tmp_path)
    assert status == 0
    names = substitutions(document, **TRIGGER)
    assert [call[:4] for call in calls] == [
        ["run", "services", "update-traffic", names["_API_SERVICE"]],
        ["run", "services", "update-traffic", names["_GRPC_SERVICE"]],
        ["run", "services", "update-traffic", names["_CONSOLE_SERVICE"]],
    ]
    assert all(f"--to-tags={names['_REVISION_TAG']}=100" in call for call in calls)


def test_every_substitution_used_is_defined(document):
    defined = set(document["substitutions"]) | BUILT_IN
    used = set(re.findall(r"\$\{(\w+)\}", str(document)))
    assert used <= defined, sorted(used - defined)


def test_names_agree_with_terraform(document):
    tf = Terraform()
    names = document["substitutions"]
    assert names["_REGION"] == tf.default("region")
    assert names["_REPOSITORY"] == tf.resolve(tf.resource("google_artifact_registry_repository", "images")["repository_id"])
    assert names["_API_SERVICE"] == tf.resolve(tf.resource("google_cloud_run_v2_service", "api")["name"])
    assert names["_GRPC_SERVICE"] == tf.resolve(tf.resource("google_cloud_run_v2_service", "grpc")["name"])
    assert names["_WORKER_SERVICE"] == tf.resolve(tf.resource("google_cloud_run_v2_service", "worker")["name"])
    assert names["_CONSOLE_SERVICE"] == tf.resolve(tf.resource("google_cloud_run_v2_service", "console")["name"])
    assert names["_MIGRATE_JOB"] == tf.resolve(tf.resource("google_cloud_run_v2_job", "migrate")["name"])
    assert names["_DRILL_JOB"] == tf.resolve(tf.resource("google_cloud_run_v2_job", "drill")["name"])
    assert names["_DEPLOYER"] == tf.resolve(tf.resource("google_service_account", "deployer")["account_id"])
    # The image path Terraform tells operators about is the one the build pushes.
    image = names["_IMAGE"].replace("${_REGION}", names["_REGION"]).replace("${_REPOSITORY}", names["_REPOSITORY"])
    assert image.replace("${PROJECT_ID}", tf.default("project_id")).rsplit(":", 1)[0] == tf.resolve(
        tf.outputs["image_repository"]["value"]
    )


def test_the_build_runs_as_the_deployer_account_terraform_grants_what_the_release_does(document):
    tf = Terraform()
    assert document["serviceAccount"] == (
        "projects/${PROJECT_ID}/serviceAccounts/${_DEPLOYER}@${PROJECT_ID}.iam.gserviceaccount.com"
    )
    assert document["options"]["logging"] == "CLOUD_LOGGING_ONLY", "required with a user-chosen build account"
    roles = set(re.findall(r"roles/[\w.]+", tf.resource("google_project_iam_member", "deployer")["for_each"]))
    assert "roles/run.developer" in roles  # deploy revisions, move traffic, update and execute the jobs with overrides
    pushes = tf.resource("google_artifact_registry_repository_iam_member", "deployer_pushes")
    assert pushes["role"] == "roles/artifactregistry.writer"
    acts_as = set(tf.resource("google_service_account_iam_member", "deployer_acts_as")["for_each"])
    # Deploying a service's revision, or updating a job, needs actAs on the account it runs as.
    assert acts_as == {"api", "grpc", "worker", "migrate", "drill", "console"}


# --- the static checks, the smoke, and a push of only the smoke-tested image ---------------------------


def test_the_static_checks_and_terraforms_validation_run_before_anything_is_built(steps):
    checks = steps["checks"].command
    assert "pip install -q --no-deps -r infra/release/checks.lock" in checks
    assert re.search(r"python infra/release/checks\.py --tools \S+ --skip \"terraform fmt\"", checks)
    terraform = steps["terraform"].command
    assert steps["terraform"].name.startswith("hashicorp/terraform:")
    for command in ("terraform fmt -check -recursive infra", "init -backend=false", "terraform -chdir=infra validate"):
        assert command in terraform
    assert steps["terraform"].args[1].lstrip().startswith("set -eu"), "sh (the image has no bash) stops at a failure"


def test_the_smoke_tests_the_built_image_and_writes_the_verdict_the_push_reads(steps):
    smoke = steps["smoke"]
    assert smoke.entrypoint == "python3" and smoke.args[0] == "infra/release/smoke.py"
    assert {"--engine=docker", "--no-build", "--image=${_IMAGE}", "--network=cloudbuild"} <= set(smoke.args)
    assert any(arg.startswith("--database-image=postgres:16") for arg in smoke.args), "Cloud SQL's major version"
    verdict = next(arg.split("=", 1)[1] for arg in smoke.args if arg.startswith("--verdict-file="))
    assert verdict in steps["push"].command


FAKE_DOCKER = """\
import json, os, sys
with open(os.environ["FAKE_DOCKER_CALLS"], "a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["image", "inspect"]:
    print(os.environ["FAKE_IMAGE_ID"])
"""


def run_push(document: dict, steps: dict, tmp_path: Path, verdict: str | None) -> tuple[int, list[list[str]]]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    if verdict is not None:
        (workspace / "smoke_passed").write_text(verdict + "\n")
    bin_dir, calls = stand_in(tmp_path, "docker", FAKE_DOCKER)
    script = substitute(steps["push"].command, substitutions(document, **TRIGGER)).replace("/workspace/", f"{workspace}/")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_DOCKER_CALLS": str(calls),
           "FAKE_IMAGE_ID": "sha256:" + "a" * 64}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=20)
    return done.returncode, [json.loads(line) for line in calls.read_text().splitlines()]


def test_the_push_sends_the_image_the_smoke_passed(document, steps, tmp_path):
    status, calls = run_push(document, steps, tmp_path, verdict="sha256:" + "a" * 64)
    assert status == 0
    assert calls[-1] == ["push", substitutions(document, **TRIGGER)["_IMAGE"]]


@pytest.mark.parametrize("verdict", [None, "", "sha256:" + "b" * 64])
def test_the_push_refuses_an_image_the_smoke_did_not_pass(document, steps, tmp_path, verdict):
    status, calls = run_push(document, steps, tmp_path, verdict=verdict)
    assert status != 0
    assert not [call for call in calls if call[:1] == ["push"]]
