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

RELEASE_ORDER = ["checks", "terraform", "test-image", "test", "build", "smoke", "push", "migrate", "deploy-worker", "deploy-api", "deploy-grpc",
                 "deploy-console", "drill", "traffic"]
# Built-in substitutions Cloud Build fills in itself.
BUILT_IN = {"PROJECT_ID", "SHORT_SHA", "COMMIT_SHA", "BUILD_ID", "LOCATION", "PROJECT_NUMBER"}
# What a trigger gives a build, and a tag URL as the deploy-api step writes it (Cloud Run's form).
TRIGGER = {"PROJECT_ID": "acme-specialists", "SHORT_SHA": "abc1234"}
TAG_URL = "https://r-abc1234---specialists-api-x7kq2lmn3a-ew.a.run.app"
WORKER_TAG_URL = "https://r-abc1234---specialists-worker-x7kq2lmn3a-ew.a.run.app"
# The pushed image by digest, as the push step writes it for every later step.
IMAGE_REF = "europe-west1-docker.pkg.dev/acme-specialists/specialists/specialists@sha256:" + "c" * 64

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


def document_value(text: str) -> str:
    """A step's image (or argument) with the build's substitutions put in."""
    return substitute(text, substitutions(cloudbuild(), **TRIGGER))


@pytest.fixture(scope="module")
def steps(document) -> dict[str, BuildStep]:
    return {step.id: step for step in build_steps(document)}


def test_the_release_runs_its_steps_in_order_one_after_another(document, steps):
    assert list(steps) == RELEASE_ORDER
    for step in document["steps"]:
        assert not {"waitFor", "allowFailure", "allowExitCodes"} & set(step), f"{step['id']} would not stop the release"


def test_every_multi_command_step_stops_at_its_first_failing_command(steps):
    for step in steps.values():
        if step.bash_script is not None:
            assert step.command.lstrip().startswith("set -euo pipefail"), step.id
            assert "|| true" not in step.command, step.id


def test_the_tests_are_the_readmes_and_cis_test_command(steps):
    assert "./dev test" in steps["test"].command
    assert "./dev test" in (PROJECT_ROOT / ".ci" / "run").read_text()


def test_the_image_is_built_pushed_and_the_same_image_is_deployed_everywhere_by_digest(document, steps):
    assert steps["build"].args[0] == "build" and "${_IMAGE}" in steps["build"].args
    assert "DOCKER_BUILDKIT=1" in steps["build"].raw["env"], "the Dockerfile's RUN --mount needs BuildKit"
    assert 'docker push "${_IMAGE}"' in steps["push"].command
    assert "> /workspace/image_ref" in steps["push"].command
    for step_id in ("migrate", "deploy-worker", "deploy-api", "deploy-grpc", "deploy-console", "drill"):
        command = steps[step_id].command.replace('"', "")
        assert "image_ref" in command and "--image=${_IMAGE}" not in command, f"{step_id} deploys by tag"
    for step_id in ("deploy-worker", "deploy-api", "deploy-grpc"):  # beside a collector: the image is app's
        assert "--container=app --image=" in steps[step_id].command.replace('"', ""), step_id
    # Cloud Build records the image's digest and its provenance.
    assert document["images"] == ["${_IMAGE}"]
    assert document["options"]["requestedVerifyOption"] == "VERIFIED"


def test_every_step_image_is_pinned_by_a_digest_the_trigger_must_give(document, steps):
    values = document["substitutions"]
    for step in steps.values():
        assert re.fullmatch(r"\$\{_STEP_\w+\}", step.name), f"{step.id}: {step.name} is not a pinned step image"
        reference = values[step.name[2:-1]]
        built_here = step.name == "${_STEP_TEST}"
        assert built_here or re.fullmatch(r"[\w./:-]+@\$\{_DIGEST_\w+\}", reference), reference
    smoke_database = next(a for a in steps["smoke"].args if a.startswith("--database-image="))
    assert smoke_database == "--database-image=${_STEP_POSTGRES}"
    # Unset, a digest leaves a reference Cloud Build refuses (it ends in "@"): never a mutable tag's pull.
    given = substitutions(document, **TRIGGER)
    assert given["_STEP_PYTHON"].endswith("@") and given["_STEP_CLOUD_SDK"].endswith("@")
    digest = "sha256:" + "d" * 64
    by_trigger = {**document, "substitutions": {name: digest if name.startswith("_DIGEST_") else value
                                                for name, value in values.items()}}
    pinned = substitutions(by_trigger, **TRIGGER)
    assert all(pinned[name].endswith("@" + digest) for name in values if name.startswith("_STEP_") and name != "_STEP_TEST")


def test_the_suite_runs_in_the_python_image_with_git_and_terraform_added(steps):
    build = steps["test-image"]
    assert build.args[:3] == ["build", "--file", "infra/release/test-step.Dockerfile"]
    assert "PYTHON_IMAGE=${_STEP_PYTHON}" in build.args and "TERRAFORM_IMAGE=${_STEP_TERRAFORM}" in build.args
    assert build.args[build.args.index("--tag") + 1] == steps["test"].name == "${_STEP_TEST}"
    dockerfile = (PROJECT_ROOT / "infra" / "release" / "test-step.Dockerfile").read_text()
    assert re.search(r"apt-get install [^\n]*\bgit\b", dockerfile)
    assert "COPY --from=terraform /bin/terraform /usr/local/bin/terraform" in dockerfile
    # Its PID 1 reaps: the embedded servers the suite stops are orphaned to it (a bash PID 1 left them zombies).
    assert re.search(r"apt-get install [^\n]*\btini\b", dockerfile)
    assert steps["test"].entrypoint == "tini" and steps["test"].bash_script == steps["test"].command


def test_migrations_run_as_the_cloud_run_job_and_are_waited_for_before_any_deploy(steps):
    command = steps["migrate"].command.replace('"', "")
    assert "gcloud run jobs update ${_MIGRATE_JOB}" in command
    assert re.search(r"gcloud run jobs execute \$\{_MIGRATE_JOB\} .*--wait", command)


def test_the_worker_is_deployed_private_as_a_tagged_revision_without_traffic_which_the_new_api_dispatches_to(steps):
    deploy = steps["deploy-worker"].command.replace('"', "")
    assert "gcloud run deploy ${_WORKER_SERVICE}" in deploy
    assert "--ingress=internal" in deploy and "--no-allow-unauthenticated" in deploy
    assert " --allow-unauthenticated" not in deploy
    assert "--no-traffic" in deploy and "--tag=${_REVISION_TAG}" in deploy
    assert "> /workspace/worker_tag_url" in deploy
    api = steps["deploy-api"].command.replace('"', "")
    assert "--update-env-vars=SPECIALISTS_DISPATCH_WORKER_URL=$$worker/jobs" in api
    assert RELEASE_ORDER.index("deploy-worker") < RELEASE_ORDER.index("deploy-api") < RELEASE_ORDER.index("drill")


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
    (workspace / "image_ref").write_text(IMAGE_REF + "\n")
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
        ["run", "jobs", "update", job, region, f"--image={IMAGE_REF}"],
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
                      f"--image={IMAGE_REF}", "--no-traffic", f"--tag={values['_REVISION_TAG']}"]]


# Stands in for gcloud in the traffic step: each service's traffic is all on "<service>-old"; update-traffic fails
# for the services named in FAKE_GCLOUD_FAILS.
FAKE_GCLOUD_TRAFFIC = """\
import json, os, sys
with open(os.environ["FAKE_GCLOUD_CALLS"], "a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[3] == "describe":
    print(json.dumps({"status": {"traffic": [{"revisionName": sys.argv[4] + "-old", "percent": 100},
                                             {"revisionName": sys.argv[4] + "-new", "tag": "r-abc1234"}]}}))
sys.exit(1 if sys.argv[3] == "update-traffic" and sys.argv[4] in os.environ.get("FAKE_GCLOUD_FAILS", "").split()
         and "--to-tags" in " ".join(sys.argv) else 0)
"""


def run_traffic(document: dict, steps: dict, tmp_path: Path, fails: str = "") -> tuple[int, list[list[str]], Path]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    bin_dir, calls = stand_in(tmp_path, "gcloud", FAKE_GCLOUD_TRAFFIC)
    script = substitute(steps["traffic"].command, substitutions(document, **TRIGGER)).replace("/workspace/", f"{workspace}/")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_GCLOUD_CALLS": str(calls), "FAKE_GCLOUD_FAILS": fails}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=20, cwd=PROJECT_ROOT)
    return done.returncode, [json.loads(line) for line in calls.read_text().splitlines()], workspace / "traffic_before.json"


def test_only_the_last_step_moves_traffic_worker_first_and_only_to_the_drilled_tag(document, steps, tmp_path):
    traffic_moves = [step.id for step in steps.values() if "update-traffic" in step.command or "traffic.py" in step.command]
    assert traffic_moves == ["traffic"]
    assert list(steps)[-1] == "traffic"
    status, calls, record = run_traffic(document, steps, tmp_path)
    assert status == 0
    names = substitutions(document, **TRIGGER)
    services = [names["_WORKER_SERVICE"], names["_API_SERVICE"], names["_GRPC_SERVICE"], names["_CONSOLE_SERVICE"]]
    moves = [call for call in calls if call[2] == "update-traffic"]
    assert [call[3] for call in moves] == services
    assert all(f"--to-tags={names['_REVISION_TAG']}=100" in call for call in moves)
    assert json.loads(record.read_text())["traffic"] == {service: {f"{service}-old": 100} for service in services}


def test_a_failed_traffic_move_puts_back_the_previous_traffic_of_every_service_moved_and_fails(document, steps, tmp_path):
    names = substitutions(document, **TRIGGER)
    status, calls, _ = run_traffic(document, steps, tmp_path, fails=names["_GRPC_SERVICE"])
    assert status != 0
    moves = [call for call in calls if call[2] == "update-traffic"]
    assert [(call[3], call[-1].split("=")[0]) for call in moves] == [
        (names["_WORKER_SERVICE"], "--to-tags"), (names["_API_SERVICE"], "--to-tags"), (names["_GRPC_SERVICE"], "--to-tags"),
        (names["_GRPC_SERVICE"], "--to-revisions"), (names["_API_SERVICE"], "--to-revisions"),
        (names["_WORKER_SERVICE"], "--to-revisions"),
    ]
    assert moves[3][-1] == f"--to-revisions={names['_GRPC_SERVICE']}-old=100"
    assert not [call for call in moves if call[3] == names["_CONSOLE_SERVICE"]], "nothing moves after a failure"


def test_an_operators_rollback_puts_back_what_the_release_recorded(document, steps, tmp_path):
    status, _, record = run_traffic(document, steps, tmp_path)
    assert status == 0
    bin_dir = tmp_path / "bin"
    calls = tmp_path / "gcloud-calls"
    calls.write_text("")
    names = substitutions(document, **TRIGGER)
    done = subprocess.run([sys.executable, str(PROJECT_ROOT / "infra" / "release" / "traffic.py"), "rollback",
                           f"--record={record}", names["_API_SERVICE"]], capture_output=True, text=True, timeout=20,
                          env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_GCLOUD_CALLS": str(calls)})
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in calls.read_text().splitlines()] == [
        ["run", "services", "update-traffic", names["_API_SERVICE"], f"--region={names['_REGION']}",
         f"--to-revisions={names['_API_SERVICE']}-old=100"]]


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
    assert document_value(steps["terraform"].name).startswith("hashicorp/terraform:")
    for command in ("terraform fmt -check -recursive infra", "init -backend=false", "terraform -chdir=infra validate"):
        assert command in terraform
    assert steps["terraform"].args[1].lstrip().startswith("set -eu"), "sh (the image has no bash) stops at a failure"


def test_the_smoke_tests_the_built_image_and_writes_the_verdict_the_push_reads(steps):
    smoke = steps["smoke"]
    assert smoke.entrypoint == "python3" and smoke.args[0] == "infra/release/smoke.py"
    assert {"--engine=docker", "--no-build", "--image=${_IMAGE}", "--network=cloudbuild"} <= set(smoke.args)
    database = next(arg.split("=", 1)[1] for arg in smoke.args if arg.startswith("--database-image="))
    assert document_value(database).startswith("postgres:16"), "Cloud SQL's major version"
    verdict = next(arg.split("=", 1)[1] for arg in smoke.args if arg.startswith("--verdict-file="))
    assert verdict in steps["push"].command


FAKE_DOCKER = """\
import json, os, sys
with open(os.environ["FAKE_DOCKER_CALLS"], "a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["image", "inspect"]:
    print(os.environ["FAKE_REPO_DIGEST"] if "RepoDigests" in " ".join(sys.argv) else os.environ["FAKE_IMAGE_ID"])
"""


def run_push(document: dict, steps: dict, tmp_path: Path, verdict: str | None) -> tuple[int, list[list[str]]]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    if verdict is not None:
        (workspace / "smoke_passed").write_text(verdict + "\n")
    bin_dir, calls = stand_in(tmp_path, "docker", FAKE_DOCKER)
    script = substitute(steps["push"].command, substitutions(document, **TRIGGER)).replace("/workspace/", f"{workspace}/")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_DOCKER_CALLS": str(calls),
           "FAKE_IMAGE_ID": "sha256:" + "a" * 64, "FAKE_REPO_DIGEST": IMAGE_REF}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=20)
    return done.returncode, [json.loads(line) for line in calls.read_text().splitlines()]


def test_the_push_sends_the_image_the_smoke_passed(document, steps, tmp_path):
    status, calls = run_push(document, steps, tmp_path, verdict="sha256:" + "a" * 64)
    assert status == 0
    assert ["push", substitutions(document, **TRIGGER)["_IMAGE"]] in calls
    assert (tmp_path / "workspace" / "image_ref").read_text().strip() == IMAGE_REF


@pytest.mark.parametrize("verdict", [None, "", "sha256:" + "b" * 64])
def test_the_push_refuses_an_image_the_smoke_did_not_pass(document, steps, tmp_path, verdict):
    status, calls = run_push(document, steps, tmp_path, verdict=verdict)
    assert status != 0
    assert not [call for call in calls if call[:1] == ["push"]]
