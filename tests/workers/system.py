"""The service as separate processes on 127.0.0.1, on a database of its own: API instances, workers, dispatchers.

``System`` starts real `specialists serve` edges (the edge alone), worker
processes (``tests.workers.worker_process``: the real worker, logging every
scripted step to a shared file so tests can count real executions) and real
`specialists dispatcher` processes, all with short leases. Its database is
created for it and dropped afterwards, so no other process of the test session
(the app tests' dispatcher, say) takes its outbox rows.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy import Engine, create_engine, text

from core import db
from core.settings import PROJECT_ROOT, Settings
from ops.topology import READY_FD, Ready, Role, StartBounds, ops_cli, stop
from tests import http_calls
from tests.app.conftest import EdgeProcess, edge_env, start_edge, stop_edge
from tests.conftest import migrated_database
from tests.workers.conftest import WORKER_SECRET

# Twenty heartbeats a lease: a worker starved for seconds on a loaded machine keeps its claim. Tests that need a
# dead worker's lease to pass wait for it as an observable event (the claim row), never for a fixed time.
LEASE_S = 5.0
HEARTBEAT_S = 0.25
CANCEL_GRACE_S = 0.5
SWEEP_INTERVAL_S = 0.3
DELIVERY_LEASE_S = 2.0
SCRIPTED_TARIFF = 3

SCRIPTED_SPEC = f"""\
id: scripted
name: Scripted specialist
description: "Runs the steps, delays and failures a test puts in the message (a data part with a script)."
# Run by workers; the worker picks its runner by the specialist id (ScriptedRunner).
executor: rlm
tariff_credits: {SCRIPTED_TARIFF}
skill:
  id: scripted
  name: Scripted
  description: Runs the script it is given.
input_modes: [application/json, text/plain]
output_modes: [text/plain]
"""


def fresh_database(server_url: str) -> str:
    """A database of its own at the migrations' head (a copy of the run's migrated template)."""
    return migrated_database(server_url, f"specialists_system_{secrets.token_hex(4)}")


def drop_database(server_url: str, url: str) -> None:
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE "{urlsplit(url).path.lstrip("/")}" WITH (FORCE)'))
    admin.dispose()


# How long a process this harness starts may go without progress (ops/topology.py): a start-up bound for a loaded
# machine, not one the product promises. A worker took two minutes to start at load 14, computing all along.
START_BOUNDS = StartBounds(stall_s=60)
STOP_GRACE_S = 10.0


@dataclass
class Worker:
    role: Role
    url: str  # the jobs endpoint

    @property
    def process(self) -> subprocess.Popen:
        assert self.role.popen is not None
        return self.role.popen

    def post(self, body: bytes, timeout_s: float = 30) -> httpx.Response:
        return http_calls.post(self.url, content=body, timeout=timeout_s)

    def kill(self) -> None:
        self.role.kill()

    def stop(self) -> None:
        self.role.stop()


@dataclass
class Dispatcher:
    role: Role

    @property
    def process(self) -> subprocess.Popen:
        assert self.role.popen is not None
        return self.role.popen

    def log_text(self) -> str:
        return self.role.log_text()

    def stop(self) -> None:
        self.role.stop()


@dataclass
class System:
    database_url: str
    folder: Path
    engine: Engine
    settings: dict[str, str] = field(default_factory=dict)
    edges: list[EdgeProcess] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    dispatchers: list[Dispatcher] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.specs_dir = self.folder / "specs"
        self.specs_dir.mkdir(exist_ok=True)
        shutil.copy(PROJECT_ROOT / "specs" / "conformance.yaml", self.specs_dir / "conformance.yaml")
        (self.specs_dir / "scripted.yaml").write_text(SCRIPTED_SPEC)
        self.step_log = self.folder / "steps.log"
        self.step_log.touch()
        self.settings = {
            "worker_job_secrets": WORKER_SECRET,
            "worker_oidc_verify": "false",
            "worker_lease_s": str(LEASE_S),
            "worker_heartbeat_s": str(HEARTBEAT_S),
            "worker_cancel_grace_s": str(CANCEL_GRACE_S),
            "worker_drain_s": "0",
            "dispatch_poll_interval_s": "0.2",
            "dispatch_delivery_lease_s": str(DELIVERY_LEASE_S),
            "dispatch_sweep_interval_s": str(SWEEP_INTERVAL_S),
            "dispatch_retry_base_s": "0.1",
            "dispatch_retry_max_s": "1",
            "conformance_hold_working_s": "1",
            # Few idle connections per process: the whole test session shares one PostgreSQL (100 connections).
            "db_pool_size": "2",
            "db_max_overflow": "8",
        }

    def env(self, database_url: str | None = None, **overrides: str) -> dict[str, str]:
        """The processes' environment; ``database_url`` instead of the system's (a statement counter's proxy)."""
        return edge_env(database_url or self.database_url, self.specs_dir, **{**self.settings, **overrides})

    # --- processes --------------------------------------------------------------------

    def start(self, *, workers: int, edges: tuple[str, ...]) -> None:
        """Workers and API instances side by side (each is a Python start-up), then a dispatcher to the workers."""
        with ThreadPoolExecutor(workers + len(edges)) as pool:
            starting = [pool.submit(self.start_worker) for _ in range(workers)]
            starting += [pool.submit(self.start_edge, name) for name in edges]
            for future in starting:
                future.result()
        self.start_dispatcher()

    def start_edge(self, name: str) -> EdgeProcess:
        edge = start_edge(self.database_url, self.specs_dir, self.folder, name, **self.settings)
        self.edges.append(edge)
        return edge

    def start_worker(self, database_url: str | None = None, **overrides: str) -> Worker:
        """The real worker (tests.workers.worker_process), ready once it prints the port it listens on."""
        role = Role(f"worker-{len(self.workers)}",
                    [sys.executable, "-m", "tests.workers.worker_process", str(self.step_log)],
                    self.env(database_url, **overrides), Ready.line("LISTENING "),
                    self.folder / f"worker-{len(self.workers)}.log", bounds=START_BOUNDS,
                    stop_grace_s=STOP_GRACE_S).run()
        worker = Worker(role, f"http://127.0.0.1:{int(role.ready_line.split()[1])}/jobs")
        self.workers.append(worker)
        return worker

    def start_dispatcher(self, *, worker_urls: list[str] | None = None, wait: bool = True,
                         database_url: str | None = None, **overrides: str) -> Dispatcher:
        """A `specialists dispatcher` to ``worker_urls`` (the live workers); with ``wait``, once its loop runs
        (``role.wait_ready()`` otherwise)."""
        urls = worker_urls or [w.url for w in self.workers if w.process.poll() is None]
        role = Role(f"dispatcher-{len(self.dispatchers)}", ops_cli("dispatcher", "--ready-fd", READY_FD),
                    self.env(database_url, dispatch_worker_url=",".join(urls), **overrides),
                    Ready.pipe(), self.folder / f"dispatcher-{len(self.dispatchers)}.log", bounds=START_BOUNDS,
                    stop_grace_s=STOP_GRACE_S)
        dispatcher = Dispatcher(role)
        self.dispatchers.append(dispatcher)
        role.start()
        if wait:
            role.wait_ready()
        return dispatcher

    def live_worker(self) -> Worker:
        return next(w for w in self.workers if w.process.poll() is None)

    def replace_dead_workers(self, *, restart_dispatchers: bool = True) -> None:
        """Start a worker for each that died, and (``restart_dispatchers``) dispatchers that deliver to the live
        ones; without, the dispatchers are stopped and the next ``dispatching`` starts one."""
        dead = [w for w in self.workers if w.process.poll() is not None]
        for worker in dead:
            self.workers.remove(worker)
            self.start_worker()
        if dead:
            self.stop_dispatchers()
            if restart_dispatchers:
                self.start_dispatcher()

    def dispatching(self) -> None:
        """The default dispatcher (to the live workers) running: started here when none runs. Tests that run
        dispatchers of their own stop them all on their way out and leave the default one to the next test that
        needs it, instead of each restoring it for a next test that may stop it at once."""
        if not self.dispatchers:
            self.start_dispatcher()

    def stop_dispatchers(self) -> None:
        stop([d.role for d in self.dispatchers])
        self.dispatchers.clear()

    def stop(self) -> None:
        self.stop_dispatchers()
        stop([w.role for w in self.workers])
        for edge in self.edges:
            stop_edge(edge)

    # --- what tests look at -----------------------------------------------------------

    def runs(self, job_id: str) -> list[str]:
        """The pids of the worker processes that started running the job (its first scripted step)."""
        return [line.split()[0] for line in self.step_log.read_text().splitlines() if line.split()[1:3] == [job_id, "0"]]

    def steps(self, job_id: str) -> list[str]:
        return [line.split()[3] for line in self.step_log.read_text().splitlines() if line.split()[1] == job_id]

    def job_of(self, task_id: str) -> str:
        with self.engine.connect() as conn:
            dispatch_id = conn.execute(
                text("SELECT max(dispatch_id) FROM dispatch_outbox WHERE task_id = :t"), {"t": task_id}
            ).scalar_one()
        return f"{task_id}.{dispatch_id}"

    def wait_for(
        self, what: str, check: Any, timeout_s: float = 15, interval_s: float = 0.05, explain: Any = None
    ) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(interval_s)
        raise AssertionError(f"timed out waiting for {what}" + (f": {explain()}" if explain else ""))


def script_message(steps: list[dict[str, Any]], *, message_id: str | None = None, **configuration: Any) -> dict:
    """A SendMessageRequest (HTTP+JSON) for the scripted specialist."""
    body: dict[str, Any] = {
        "message": {
            "messageId": message_id or f"m-{uuid.uuid4()}",
            "role": "ROLE_USER",
            "parts": [{"data": {"script": {"steps": steps}}}],
        }
    }
    if configuration:
        body["configuration"] = configuration
    return body


@contextmanager
def system_on_its_own_database(
    server_url: str,
    folder: Path,
    *,
    workers: int,
    edges: tuple[str, ...],
    settings: dict[str, str] | None = None,
    prepare: Callable[["System"], None] | None = None,
) -> Iterator["System"]:
    """A started ``System`` on a database created for it, stopped and dropped afterwards.

    ``settings`` and ``prepare`` (specs, routes files) apply before any process starts.
    """
    url = fresh_database(server_url)
    # Few idle connections: the whole test session shares one PostgreSQL (100 connections).
    engine = db.make_engine(url, Settings(database={"url": url, "pool_size": 2, "max_overflow": 8}))
    running = System(url, folder, engine)
    running.settings.update(settings or {})
    try:
        if prepare is not None:
            prepare(running)
        running.start(workers=workers, edges=edges)
        yield running
    finally:
        running.stop()
        engine.dispose()
        drop_database(server_url, url)
