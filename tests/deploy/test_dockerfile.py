"""The Dockerfile and .dockerignore, checked against the code (no Docker engine runs here).

What is read: the stages, the user, the installed dependencies, the ports and hosts, the entry point
and the health check. What is run: the health check's own command against the roles started from
Terraform's environment, and `specialists --help` for the roles the image is used for.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib

import pytest

from core.settings import PROJECT_ROOT
from core.settings_doc import settings_fields
from tests.deploy.manifests import DOCKERFILE, DOCKERIGNORE, ENTRYPOINT, Stage, dockerfile_stages
from tests.deploy.roles import IMAGE_ROOT, clean_environment, free_port

pytestmark = pytest.mark.timeout(60, func_only=True)

COMPILERS = re.compile(r"\b(gcc|g\+\+|cc|clang|make|build-essential|libc6-dev|python3-dev)\b")
SETTING_NAMES = {env for _, _, _, env in settings_fields()}


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return dockerfile_stages()


@pytest.fixture(scope="module")
def final(stages) -> Stage:
    return stages[-1]


def copies(stage: Stage) -> list[tuple[str | None, list[str], str]]:
    """(from stage, sources, destination) of each COPY."""
    found = []
    for instruction in stage.all("COPY"):
        words = instruction.args.split()
        origin = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
        paths = [w for w in words if not w.startswith("--")]
        found.append((origin, paths[:-1], paths[-1]))
    return found


def test_the_image_is_built_in_a_builder_stage_and_the_final_stage_is_the_distroless_python(stages, final):
    assert len(stages) == 2
    builder = stages[0]
    # The final base carries Debian 12's python3.11 at /usr/bin and nothing else (no shell, no package manager);
    # the builder makes the venv with that same Debian interpreter, so the venv's links hold in the final image.
    assert final.base.startswith("gcr.io/distroless/python3-debian12@")
    assert builder.base.startswith("debian@")
    assert re.search(r"apt-get install -y --no-install-recommends python3-venv=\S+", " ".join(
        i.args for i in builder.all("RUN")))
    assert final.base not in {stage.name for stage in stages}
    from_builder = {(origin, tuple(sources)) for origin, sources, _ in copies(final)}
    assert from_builder == {(builder.name, ("/opt/venv",)), (builder.name, ("/app",))}
    for instruction in final.all("RUN"):  # the base has no shell: exec form only, and nothing installed
        assert instruction.exec_form() is not None, instruction.args
        assert not COMPILERS.search(instruction.args), instruction.args
        assert "pip" not in instruction.args and "apt-get" not in instruction.args


def test_dependencies_come_from_the_runtime_lock_alone_as_wheels(stages):
    builder = stages[0]
    copied = {source for _, sources, _ in copies(builder) for source in sources}
    assert {"requirements.lock", "requirements-build.lock"} <= copied
    assert not {source for source in copied if "dev" in source}, "the development lock never enters the image"
    installs = [i.args for i in builder.all("RUN") if "pip install" in i.args]
    locked = [run for run in installs if re.search(r"pip install( --no-compile)? --no-deps --only-binary=:all: --require-hashes -r \S*requirements\.lock", run)]
    assert locked, "the runtime lock, wheels only (no compiler in the builder either)"
    for run in installs:  # nothing is resolved at build time: every install is --no-deps
        for command in re.findall(r"pip install[^&|;]*", run):
            assert "--no-deps" in command, command
    assert any("pip check" in run for run in installs)
    assert not [i for i in builder.all("RUN") if COMPILERS.search(i.args)]


def test_the_final_venv_keeps_neither_pip_nor_the_build_backend(stages):
    builder = stages[0]
    editable = next(i.args for i in builder.all("RUN") if "-e ." in i.args)
    assert re.search(r"pip uninstall -y( -q)? setuptools pip", editable)


def warm_modules(builder: Stage) -> set[str]:
    """The modules the build imports to write their bytecode: what the roles import at start."""
    from core.telemetry import SDK_MODULES
    from ops.image_bytecode import MODULES

    return set(MODULES) | set(SDK_MODULES)


def test_the_bytecode_written_covers_what_every_role_and_job_process_imports_at_start(stages, final):
    import importlib.util

    from workers.isolation import PRELOAD

    builder = stages[0]
    warm = next(i.args for i in builder.all("RUN") if "python -m compileall -q /app" in i.args)
    assert "pip install --no-compile" in warm and "compileall -q /app /opt/venv" not in warm
    assert "python -m ops.image_bytecode" in warm
    # Again in the final stage, by the base's interpreter: the standard library's bytecode (the base has none).
    assert [i.exec_form() for i in final.all("RUN")] == [["/opt/venv/bin/python", "-m", "ops.image_bytecode"]]
    modules = warm_modules(builder)
    assert set(PRELOAD) <= modules, "the job processes' forkserver preload"
    assert {"opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"} <= modules  # on in production
    # The modules of each role's command (ops/cli.py's serve, worker, dispatcher, db upgrade, console; the drill job).
    assert {"app.assembly", "app.grpc_binding", "workers.assembly", "workers.server", "workers.dispatch.process",
            "ops.cli", "ops.drill.cli", "ops.console.app", "alembic.command"} <= modules
    for module in sorted(modules):
        assert importlib.util.find_spec(module) is not None, f"{module} is not a module any more"


# Modules a dependency imports only if they are installed (``try: import … except ImportError``), so a development
# environment loads them and the image does without: module -> the dependency's module that tries it.
OPTIONAL_IMPORTS = {"psutil": "opentelemetry.sdk.resources"}  # a process's resource attributes, when present


def test_every_distribution_the_roles_import_at_start_is_in_the_runtime_lock(stages):
    # The image has the runtime lock alone: a role importing a distribution that only ./dev installed (a
    # development dependency, or one installed by hand) would start here and fail in the image.
    import importlib.metadata
    import importlib.util

    from packaging.utils import canonicalize_name

    from tests.deploy.test_locks import OURS, RUNTIME_LOCK, pins

    # What the interpreter loaded before (site's own, a venv's .pth hooks) is not the roles'.
    code = ("import importlib, json, sys\nbefore = set(sys.modules)\n"
            "[importlib.import_module(m) for m in sys.argv[1:]]\n"
            "print(json.dumps(sorted({name.split('.')[0] for name in set(sys.modules) - before})))")
    done = subprocess.run([sys.executable, "-c", code, *sorted(warm_modules(stages[0]))], env=clean_environment(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    by_module = importlib.metadata.packages_distributions()
    runtime = set(pins(RUNTIME_LOCK)) | OURS
    outside = {name: sorted(canonicalize_name(d) for d in by_module[name])
               for name in json.loads(done.stdout) if name in by_module
               and not {canonicalize_name(d) for d in by_module[name]} & runtime}
    for module, importer in OPTIONAL_IMPORTS.items():  # tried, and done without when missing (as in the image)
        outside.pop(module, None)
        assert importlib.util.find_spec(importer) is not None, f"{importer} is gone: is {module} still optional?"
    assert not outside, f"imported at start but not in requirements.lock (module: distributions): {outside}"


def test_every_stage_starts_from_a_base_pinned_by_digest_with_its_tag_beside_it(stages):
    lines = DOCKERFILE.read_text().splitlines()
    for stage in stages:
        assert re.fullmatch(r"[\w./-]+@sha256:[0-9a-f]{64}", stage.base), f"{stage.base}: by its digest"
        from_line = next(i for i, line in enumerate(lines) if line.startswith(f"FROM {stage.base}"))
        tag = lines[from_line - 1].removeprefix("# ").strip()
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", tag) and stage.base.startswith(tag.rsplit(":", 1)[0] + "@"), (
            f"the tag the digest was taken from, as a comment above FROM {stage.base}")
    before_first_stage = DOCKERFILE.read_text().split("\nFROM ", 1)[0]
    assert not re.search(r"^ARG\s", before_first_stage, re.MULTILINE), (
        "no build argument for the base: checkov cannot resolve one, and the pin would be a default only")


def test_the_image_runs_as_an_unprivileged_user(final):
    user = final.last("USER").args
    # The distroless base's nonroot user, by number (a name would need the base's passwd to mean the same).
    assert user == "65532:65532"
    assert final.env()["HOME"] == "/home/nonroot"
    after_user = final.instructions[final.instructions.index(final.last("USER")):]
    assert not [i for i in after_user if i.keyword == "RUN"], "nothing runs as root after the switch"


def test_the_image_listens_on_port_on_every_interface_and_sets_only_real_settings(final):
    env = final.env()
    assert final.last("EXPOSE").args == env["PORT"]
    assert env["SPECIALISTS_EDGE_HOST"] == env["SPECIALISTS_WORKER_HOST"] == env["SPECIALISTS_CONSOLE_HOST"] == "0.0.0.0"
    assert {name for name in env if name.startswith("SPECIALISTS_")} <= SETTING_NAMES


def test_the_image_holds_the_project_where_the_settings_look_for_it(stages, final):
    builder = stages[0]
    assert final.last("WORKDIR").args == IMAGE_ROOT == builder.last("WORKDIR").args
    copied = {source.rstrip("/") for _, sources, _ in copies(builder) for source in sources}
    pyproject = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    packages = {pattern.rstrip("*") for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied, "every package of pyproject.toml is in the image"
    assert {"specs", "migrations", "pyproject.toml", "infra/model_routes.toml"} <= copied
    # Editable at the same path in both stages: PROJECT_ROOT (core/settings.py) is /app in the image.
    assert any(re.search(r"pip install( --no-compile)? --no-deps( --no-build-isolation)? -e \./library -e \.", i.args) for i in builder.all("RUN"))


def test_the_entry_point_runs_the_specialists_command_and_every_role_is_one_of_its_commands(final):
    assert final.last("ENTRYPOINT").exec_form() == ENTRYPOINT == ["/opt/venv/bin/python", "-m", "ops.entrypoint"]
    assert final.last("CMD").exec_form() == ["serve"]
    env = clean_environment()
    top = subprocess.run(["specialists", "--help"], env=env, capture_output=True, text=True, timeout=30)
    database = subprocess.run(["specialists", "db", "--help"], env=env, capture_output=True, text=True, timeout=30)
    assert top.returncode == 0 and database.returncode == 0
    for role in ("serve", "worker", "dispatcher", "db", "console"):
        assert re.search(rf"^\s+{role}\s", top.stdout, re.MULTILINE), role
    assert re.search(r"^\s+upgrade\s", database.stdout, re.MULTILINE)


def test_the_health_check_passes_on_both_listening_roles_and_fails_when_nothing_answers(
    final, api_from_terraform, worker_from_terraform
):
    check = final.last("HEALTHCHECK").exec_form()
    assert check and "/healthz" in check[-1]

    def health(port: int) -> int:
        return subprocess.run(check, env=clean_environment(PORT=str(port)), capture_output=True, timeout=15).returncode

    assert health(api_from_terraform.port) == 0
    assert health(worker_from_terraform.port) == 0
    assert health(free_port()) != 0


# --- .dockerignore ---------------------------------------------------------------------------------


def ignored(path: str, rules: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path (or a folder above it) decides; ``!`` re-includes."""
    verdict = False
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for rule in rules:
        negated = rule.startswith("!")
        pattern = rule[1:] if negated else rule
        regex = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, candidate) for candidate in candidates):
            verdict = not negated
    return verdict


def test_the_build_context_keeps_out_local_state_and_secrets_but_not_what_the_image_needs(stages):
    rules = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    for private in (".git", ".venv", ".venv-emulator", ".data", ".data/local-secrets.json", "infra/terraform.tfstate",
                    "tests", "app/__pycache__/service.cpython-311.pyc",
                    # the evaluation packs' planted secrets and vulnerable samples: scanners would flag the image
                    "library/rlmfamily/eval/packs/pilot/pack.toml"):
        assert ignored(private, rules), private
    for _, sources, _ in copies(stages[0]):
        for source in sources:
            assert not ignored(source.rstrip("/"), rules), f"{source} is copied but ignored"
