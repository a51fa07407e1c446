"""Starting the image's roles as the container would: ``python -m ops.entrypoint <role>`` with a given environment.

There is no Docker engine here, so the entry point runs on this machine with the environment
running the tests first on PATH, and with the environment Terraform would give the container
(secrets replaced by test values, ``DATABASE_URL`` by this run's database, ``/app`` by the project).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.settings import PROJECT_ROOT
from ops import topology
from tests.app.conftest import free_port
from tests.deploy.manifests import ENTRYPOINT

# How long a listening role may start without progress (ops/topology.py): `serve` took over 20 s at load 7 on 2
# cores and over 30 s at load 11, computing all along. The tests time their own body only (``func_only``): a
# session's roles are started by fixtures, each bounded by this.
START_BOUNDS = topology.StartBounds(stall_s=60)
IMAGE_ROOT = "/app"  # the Dockerfile's WORKDIR: where the project lives in the image
# The image's ENTRYPOINT, with the interpreter running the tests for the image's venv.
ENTRY_POINT = [sys.executable, *ENTRYPOINT[1:]]


def clean_environment(**overrides: str) -> dict[str, str]:
    """This process's environment without any of the service's settings, the project's environment first on PATH
    (the bin directory of the interpreter running the tests, which has the project installed)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("SPECIALISTS_") and key not in ("DATABASE_URL", "PORT")
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(overrides)
    return env


def on_this_machine(value: str) -> str:
    """A path inside the image, as it is on this machine."""
    return str(PROJECT_ROOT) + value[len(IMAGE_ROOT):] if value.startswith(IMAGE_ROOT + "/") else value


@dataclass
class Role(topology.Role):
    """A listening role of the image (ops/topology.py's, with the port it listens on)."""

    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def process(self) -> subprocess.Popen:
        assert self.popen is not None
        return self.popen


def run_role(args: list[str], env: Mapping[str, str], log: Path, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """A role that ends by itself (the migration job): run it to the end."""
    with log.open("wb") as out:
        return subprocess.run(
            [*ENTRY_POINT, *args], env=dict(env), cwd=PROJECT_ROOT, stdout=out, stderr=subprocess.STDOUT,
            timeout=timeout_s,
        )


def run_command(args: list[str], env: Mapping[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess:
    """A one-off command of the image (``specialists keys issue --json``...): its output for the test to read."""
    return subprocess.run(
        [*ENTRY_POINT, *args], env=dict(env), cwd=PROJECT_ROOT, capture_output=True, text=True,
        timeout=timeout_s,
    )


def run_command_here(args: list[str], env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch
                     ) -> subprocess.CompletedProcess:
    """``run_command`` in this process: the image's entry point with exactly ``env`` as its environment, its
    output captured. For a test of what several commands do with an environment: an interpreter's start-up per
    command is no part of it, and three of them took a test past its 90 s at load 15-30 (issue 40)."""
    from ops.entrypoint import main

    with monkeypatch.context() as patch:
        for name in list(os.environ):
            patch.delenv(name)
        for name, value in env.items():
            patch.setenv(name, value)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def start_role(args: list[str], env: Mapping[str, str], log: Path, *, port: int, ready_path: str = "/healthz") -> Role:
    """Start a listening role and wait until ``ready_path`` answers 200 on ``port`` (while it makes progress)."""
    role = Role(args[0], [*ENTRY_POINT, *args], env, topology.Ready.http(f"http://127.0.0.1:{port}{ready_path}"),
                log, bounds=START_BOUNDS, stop_grace_s=20, port=port)
    return role.run()  # type: ignore[return-value]


__all__ = ["Role", "clean_environment", "free_port", "on_this_machine", "run_command", "run_command_here", "run_role",
           "start_role"]
