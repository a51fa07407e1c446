"""`specialists serve` as an operator runs it on one machine (edge, dispatcher, worker), on a database of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from core.settings import PROJECT_ROOT
from tests import http_calls
from tests.app.conftest import edge_env, free_port
from tests.workers.hosted_rlm import support
from tests.workers.conftest import WORKER_SECRET
from tests.workers.system import drop_database, fresh_database


@dataclass(frozen=True)
class RunningService:
    base_url: str
    env: dict[str, str]  # the service's environment: run `specialists` commands against its database with it
    log_path: Path


@contextmanager
def running_service(server_url: str, log_dir: Path, ready_timeout_s: float = 60,
                    extra_env: dict[str, str] | None = None) -> Iterator[RunningService]:
    """The shipped specs and the scripted demo routes, served until the block ends (then SIGINT, as Ctrl-C)."""
    url = fresh_database(server_url)
    port = free_port()
    # An external database needs scripted routes allowed explicitly.
    env = edge_env(url, PROJECT_ROOT / "specs", serve_worker="true", serve_dispatcher="true",
                   worker_job_secrets=WORKER_SECRET, worker_port=str(free_port()), worker_drain_s="1",
                   model_routes_allow_scripted="true", specialist_checkpoint_key=support.CHECKPOINT_KEY.decode(),
                   db_pool_size="3", db_max_overflow="6",
                   serve_child_start_timeout_s=str(ready_timeout_s))  # a loaded machine's worker start-up
    env.update(extra_env or {})
    log_path = log_dir / "serve.log"
    serve = subprocess.Popen([sys.executable, "-m", "ops.cli", "serve", "--port", str(port)], env=env,
                             cwd=PROJECT_ROOT, stdout=log_path.open("wb"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            assert serve.poll() is None, log_path.read_text()
            try:
                if http_calls.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the service did not become ready:\n" + log_path.read_text()
            time.sleep(0.1)
        yield RunningService(base_url=base, env=env, log_path=log_path)
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGINT)
            try:
                serve.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait()
        drop_database(server_url, url)
