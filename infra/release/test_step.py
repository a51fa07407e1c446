#!/usr/bin/env python3
"""Run the release's `test` step as Cloud Build runs it, here: its exact command, in a container of its image
(infra/release/test-step.Dockerfile) built on local stand-ins for the two images it starts from.

    python3 infra/release/test_step.py [--engine podman] [-- PYTEST ARGS]

    python:3.11-slim-bookworm  stand-in: the smoke's Debian bookworm base (debootstrap) with Debian's python3.11,
                               venv and pip, and no git (as the real image)
    hashicorp/terraform:1.11.4 stand-in: an image holding this machine's terraform at /bin/terraform (the version
                               the step pins)

Both stand-ins and the step image are made once and reused while their inputs are unchanged (the step image is
labelled with the sha256 of test-step.Dockerfile; `podman rmi` one to make it again). The command is the
`test` step's script from cloudbuild.yaml, substitutions put in, run by bash in /workspace: a fresh clone of this
repository's HEAD (as Cloud Build checks a commit out; never this working tree or its .venv). PYTEST ARGS, when
given, are appended to its `./dev test` (a subset, to try the environment first); without them it is the step's
exact command. Packages come from this machine's indexes (mounted read-only, with its certificate authority for
the package index; no container registry is reachable here), and
the container is privileged, as Cloud Build's step containers are (the suite's container tests run podman).
Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import smoke  # noqa: E402  (the stand-ins' makers: same folder, standard library only)

ROOT = smoke.ROOT
STEP_DOCKERFILE = ROOT / "infra" / "release" / "test-step.Dockerfile"
PYTHON_STAND_IN = "localhost/specialists-step:python-3.11-slim-bookworm"
TERRAFORM_STAND_IN = "localhost/specialists-step:terraform-1.11.4"
STEP_IMAGE = "localhost/specialists-step:test"
TERRAFORM_VERSION = "1.11.4"
LOCAL_INDEXES = ("/opt/pypi", "/opt/pypi-more", "/opt/wheels")
RUN_TIMEOUT_S = 3600.0  # the whole suite: about 12 minutes alone here, far more beside other work


def cloudbuild_test_script() -> str:
    """The `test` step's bash script, with the substitutions it uses put in (a release name as a trigger gives)."""
    text = (ROOT / "cloudbuild.yaml").read_text()
    block = text.split("  - id: test\n", 1)[1].split("\n  - id:", 1)[0]
    script = block.split("      - |\n", 1)[1]
    lines = []
    for line in script.splitlines():
        if line.strip() and not line.startswith(" " * 8):
            break  # the script's block ended (a comment of the next step)
        lines.append(line[8:])
    return "\n".join(lines).strip().replace("${_RELEASE}", "local").replace("$$", "$") + "\n"


def make_python_stand_in(engine: str, env: dict[str, str], folder: Path) -> str:
    if smoke.image_exists(engine, env, PYTHON_STAND_IN):
        return PYTHON_STAND_IN
    base = smoke.make_builder_base(engine, env, folder)
    print("step: the python:3.11-slim-bookworm stand-in (Debian's python3.11, venv, pip) ...", file=sys.stderr, flush=True)
    name = f"specialists-step-python-{os.getpid()}"
    install = ("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
               "python3 python3-venv python3-pip ca-certificates >/dev/null && rm -rf /var/lib/apt/lists/* "
               "&& ln -sf /usr/bin/python3 /usr/local/bin/python")
    done = subprocess.run([engine, "run", "--name", name, "--network", "host", base, "sh", "-euc", install], env=env,
                          capture_output=True, text=True, timeout=smoke.BUILD_TIMEOUT_S)
    try:
        if done.returncode != 0:
            raise smoke.SmokeError(f"the python stand-in could not be made:\n{(done.stdout + done.stderr)[-2000:]}")
        subprocess.run([engine, "commit", "-q", "--change", 'CMD ["python3"]', name, PYTHON_STAND_IN], env=env,
                       check=True, capture_output=True)
    finally:
        subprocess.run([engine, "rm", "-f", name], env=env, capture_output=True)
    return PYTHON_STAND_IN


def make_terraform_stand_in(engine: str, env: dict[str, str], folder: Path) -> str:
    if smoke.image_exists(engine, env, TERRAFORM_STAND_IN):
        return TERRAFORM_STAND_IN
    terraform = shutil.which("terraform")
    version = subprocess.run([terraform, "version"], capture_output=True, text=True).stdout if terraform else ""
    if f"v{TERRAFORM_VERSION}" not in version:
        raise smoke.SmokeError(f"no terraform {TERRAFORM_VERSION} on this machine to stand in for hashicorp/terraform")
    rootfs = folder / "terraform-rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy2(terraform, rootfs / "bin" / "terraform")
    smoke.import_rootfs(engine, env, rootfs, TERRAFORM_STAND_IN, ['ENTRYPOINT ["/bin/terraform"]'])
    return TERRAFORM_STAND_IN


def build_step_image(engine: str, env: dict[str, str], python: str, terraform: str) -> str:
    digest = hashlib.sha256(STEP_DOCKERFILE.read_bytes()).hexdigest()[:16]
    found = subprocess.run([engine, "image", "inspect", "--format", '{{index .Labels "dockerfile"}}', STEP_IMAGE],
                           env=env, capture_output=True, text=True)
    if found.returncode == 0 and found.stdout.strip() == digest:
        print(f"step: {STEP_IMAGE} (built earlier from this test-step.Dockerfile)", file=sys.stderr, flush=True)
        return STEP_IMAGE
    print("step: building the test step's image ...", file=sys.stderr, flush=True)
    done = subprocess.run([engine, "build", "--network", "host", "--file", str(STEP_DOCKERFILE), "--label",
                           f"dockerfile={digest}", "--build-arg", f"PYTHON_IMAGE={python}", "--build-arg",
                           f"TERRAFORM_IMAGE={terraform}", "--tag", STEP_IMAGE, str(STEP_DOCKERFILE.parent)],
                          env=env, capture_output=True, text=True, timeout=smoke.BUILD_TIMEOUT_S)
    if done.returncode != 0:
        raise smoke.SmokeError(f"the step image did not build:\n{(done.stdout + done.stderr)[-2000:]}")
    return STEP_IMAGE


def run_step(engine: str, env: dict[str, str], image: str, script: str, workspace: Path) -> int:
    mounts = [arg for index in LOCAL_INDEXES if Path(index).is_dir() for arg in ("-v", f"{index}:{index}:ro")]
    indexes = {"PIP_EXTRA_INDEX_URL": "file:///opt/pypi/simple file:///opt/pypi-more/simple",
               "PIP_FIND_LINKS": "/opt/wheels", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if smoke.MACHINE_CA.exists():  # the package index's certificate authority on this kind of machine, as the smoke's
        mounts += ["-v", f"{smoke.MACHINE_CA}:{smoke.MACHINE_CA}:ro"]
        indexes["PIP_CERT"] = str(smoke.MACHINE_CA)
    argv = [engine, "run", "--rm", "--privileged", "--network", "host", "-v", f"{workspace}:/workspace",
            "-w", "/workspace", *mounts, *[a for k, v in indexes.items() for a in ("-e", f"{k}={v}")],
            image, "tini", "--", "bash", "-c", script]  # as cloudbuild.yaml's entrypoint
    print(f"step: {' '.join(argv[:-1])} <the test step's script>", file=sys.stderr, flush=True)
    return subprocess.run(argv, env=env, timeout=RUN_TIMEOUT_S).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["podman"], default="podman",
                        help="podman (the stand-ins are imported into it, as the smoke's)")
    parser.add_argument("pytest_args", nargs="*", help="appended to ./dev test (after --); none: the exact command")
    args = parser.parse_args(argv)
    script = cloudbuild_test_script()
    if args.pytest_args:
        script = re.sub(r"\./dev test\s*$", "./dev test " + " ".join(args.pytest_args), script, flags=re.M)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="specialists-test-step-", dir="/var/tmp") as folder:
        try:
            engine = smoke.find_engine(args.engine)
            env = smoke.podman_conf(Path(folder))
            python = make_python_stand_in(engine, env, Path(folder))
            terraform = make_terraform_stand_in(engine, env, Path(folder))
            image = build_step_image(engine, env, python, terraform)
        except smoke.SmokeError as exc:
            print(f"\nverdict: FAIL ({exc})", file=sys.stderr)
            return 1
        workspace = Path(folder) / "workspace"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(workspace)], check=True)
        status = run_step(engine, env, image, script, workspace)
    print(f"\ntest step: exit {status} in {time.monotonic() - started:.0f} s; verdict: {'pass' if status == 0 else 'FAIL'}",
          file=sys.stderr)
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
