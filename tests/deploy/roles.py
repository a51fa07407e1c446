"""Starting the image's roles as the container would: ``python -m ops.entrypoint <role>`` with a given environment.

There is no Docker engine here, so the entry point runs on this machine with the environment
running the tests first on PATH, and with the environment Terraform would give the container
(secrets replaced by test values, ``DATABASE_URL`` by this run's database, ``/app`` by the project).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from core.settings import PROJECT_ROOT
from tests import http_calls
from tests.app.conftest import free_port
from tests.deploy.manifests import ENTRYPOINT

# How long a listening role may take to answer after it is started: generous, since only "never" is a failure
# (`serve` took over 20 s at load 7 on 2 cores, and over 30 s at load 11). The tests time their own body only
# (``func_only``): a session's roles are started by fixtures, each bounded by this.
START_TIMEOUT_S = 90.0
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
class Role:
    process: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


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


def start_role(args: list[str], env: Mapping[str, str], log: Path, *, port: int, ready_path: str = "/healthz") -> Role:
    """Start a listening role and wait until ``ready_path`` answers 200 on ``port``."""
    out = log.open("wb")
    process = subprocess.Popen(
        [*ENTRY_POINT, *args], env=dict(env), cwd=PROJECT_ROOT, stdout=out, stderr=subprocess.STDOUT
    )
    role = Role(process=process, port=port, log=log)
    deadline = time.monotonic() + START_TIMEOUT_S
    last = "no answer"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{args} exited with {process.returncode}:\n{role.log_text()}")
        try:
            answer = http_calls.get(f"{role.url}{ready_path}", timeout=2)
            if answer.status_code == 200:
                return role
            last = f"{answer.status_code} {answer.text}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.1)
    role.stop()
    raise AssertionError(f"{args} did not answer {ready_path} on port {port} ({last}):\n{role.log_text()}")


__all__ = ["Role", "clean_environment", "free_port", "on_this_machine", "run_command", "run_role", "start_role"]
