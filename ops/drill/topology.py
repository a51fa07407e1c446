"""The service as a deployment on 127.0.0.1, for `specialists drill --local` and `bench/load.py`.

``LocalTopology`` builds what production runs, as separate processes on this
machine: a database of its own on a PostgreSQL server (the machine's, from
``DATABASE_URL``, or the embedded one), two API instances (`specialists serve`,
the edge alone), two workers (`specialists worker`) and a dispatcher (the
embedded one, or the relay to the Cloud Tasks emulator). Every process listens
on a port fixed when the topology is built, so a process restarted after a
kill answers at the same address, as a Cloud Run service does. Leases,
heartbeats and sweeps are short (``LOCAL_BOUNDS``) so a drill of a crash takes
seconds, not minutes. ``stop`` ends every process and drops the database.
Each process is an ``ops.topology.Role``: started, waited for while it makes
progress, and stopped there, as `specialists serve` starts its children.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy import Engine, create_engine, text

from core import db
from core.settings import PROJECT_ROOT, Settings
from ledger.keys import KeySigner
from ops.topology import READY_FD, Ready, Role, StartBounds, ops_cli, stop

Progress = Callable[[str], None]
DispatcherKind = Literal["embedded", "cloud-tasks"]

# The demo's scripted routes, the reviewer's semantic calls slowed down (the resume drill kills a worker mid call).
DRILL_ROUTES = Path(__file__).with_name("routes.toml")
STOP_TIMEOUT_S = 15.0
# The emulator's retries of a delivery (about every 100 ms) must outlast a killed worker's restart.
EMULATOR_RETRY_S = 60.0
EMULATOR_QUEUE = "projects/drill-project/locations/drill-location/queues/drill-jobs"


@dataclass(frozen=True)
class Bounds:
    """The timing a deployment runs with: what the drill holds it to."""

    heartbeat_s: float
    cancel_grace_s: float
    lease_s: float
    sweep_interval_s: float
    revocation_cache_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> Bounds:
        return cls(
            heartbeat_s=settings.worker.heartbeat_s,
            cancel_grace_s=settings.worker.cancel_grace_s,
            lease_s=settings.worker.lease_s,
            sweep_interval_s=settings.dispatch.sweep_interval_s,
            revocation_cache_s=settings.keys.revocation_cache_s,
        )

    @property
    def cancel_s(self) -> float:
        """A cancel to the job stopped: the heartbeat that carries it, then the grace."""
        return self.heartbeat_s + self.cancel_grace_s

    @property
    def unknown_s(self) -> float:
        """A dead worker's job to unknown: its lease passes, then a sweep."""
        return self.lease_s + self.sweep_interval_s


# Short, so a crash drill takes seconds. The ratios are production's: heartbeat well inside the lease.
LOCAL_BOUNDS = Bounds(heartbeat_s=0.25, cancel_grace_s=0.5, lease_s=2.0, sweep_interval_s=0.3, revocation_cache_s=1.0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def server_url(settings: Settings) -> str:
    """The maintenance database of the PostgreSQL server to build on: ``DATABASE_URL``'s server, or the embedded."""
    if settings.database.url:
        return with_database(db.sqlalchemy_url(settings.database.url), "postgres")
    return with_database(db.database_url(settings), "postgres")


def drill_role(name: str, command: list[str], env: dict[str, str], log_path: Path, ready: Ready,
               bounds: StartBounds) -> Role:
    """One service process of the topology (`specialists <command>`), restartable at the same address with the
    same environment; its own process group, so a Ctrl-C at the drill's terminal is the drill's to handle."""
    return Role(name, ops_cli(*command), env, ready, log_path, bounds=bounds, stop_grace_s=STOP_TIMEOUT_S,
                new_session=True)


def url_of(role: Role) -> str:
    """The base URL of a role that answers over HTTP (its ready check's, without the path)."""
    return urlunsplit(urlsplit(role.ready.value)._replace(path=""))


@dataclass
class LocalTopology:
    """Two API instances, two workers and a dispatcher on a database of their own (see the module doc)."""

    folder: Path
    server: str  # the maintenance database's URL
    dispatcher_kind: DispatcherKind = "embedded"
    bounds: Bounds = LOCAL_BOUNDS
    apis: int = 2
    workers: int = 2
    extra_settings: dict[str, str] = field(default_factory=dict)
    progress: Progress = lambda line: None  # noqa: E731
    start_bounds: StartBounds = StartBounds()  # the drill's: StartBounds.from_settings (ops/topology.py)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.database = f"specialists_drill_{secrets.token_hex(4)}"
        self.database_url = with_database(self.server, self.database)
        self.signing_secret = secrets.token_urlsafe(48)
        self.worker_secret = secrets.token_urlsafe(48)
        self.push_secret = secrets.token_urlsafe(48)
        self.api: list[Role] = []
        self.worker: list[Role] = []
        self.dispatcher: Role | None = None
        self.emulator = None
        self.engine: Engine | None = None
        self._created = False

    # --- building it ------------------------------------------------------------------

    def settings_env(self) -> dict[str, str]:
        """What every process of the topology runs with."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECIALISTS_") and k != "DATABASE_URL"}
        settings = {
            "key_signing_secrets": self.signing_secret,
            "key_environment": "test",
            "worker_job_secrets": self.worker_secret,
            "specialist_checkpoint_key": secrets.token_urlsafe(48),
            "push_signing_secrets": self.push_secret,
            "push_allow_loopback": "true",  # the push drill's webhook is on 127.0.0.1
            "specs_dir": str(PROJECT_ROOT / "specs"),
            "model_routes_allow_scripted": "true",
            "model_routes_file": str(DRILL_ROUTES),
            "data_dir": str(self.folder / "data"),
            "serve_worker": "false",
            "serve_dispatcher": "false",
            "worker_oidc_verify": "false",
            "worker_lease_s": str(self.bounds.lease_s),
            "worker_heartbeat_s": str(self.bounds.heartbeat_s),
            "worker_cancel_grace_s": str(self.bounds.cancel_grace_s),
            "worker_drain_s": "5",
            "revocation_cache_s": str(self.bounds.revocation_cache_s),
            "dispatch_poll_interval_s": "0.2",
            "dispatch_delivery_lease_s": "2",
            "dispatch_sweep_interval_s": str(self.bounds.sweep_interval_s),
            "dispatch_retry_base_s": "0.1",
            "dispatch_retry_max_s": "1",
            # Few idle connections per process: five processes share the server's connections.
            "db_pool_size": "2",
            "db_max_overflow": "8",
            **self.extra_settings,
        }
        env.update({f"SPECIALISTS_{name.upper()}": value for name, value in settings.items()})
        env["DATABASE_URL"] = self.database_url
        return env

    def start(self) -> None:
        self.progress(f"creating database {self.database} on {db.redact_url(self.server)}")
        self._on_server(f'CREATE DATABASE "{self.database}"')
        self._created = True
        db.upgrade(self.database_url)
        env = self.settings_env()
        self.engine = db.make_engine(self.database_url, Settings(
            database={"url": self.database_url, "pool_size": 4, "max_overflow": 16},
        ))
        logs = self.folder / "logs"
        logs.mkdir(exist_ok=True)
        for index in range(self.workers):
            port = free_port()
            self.worker.append(drill_role(f"worker-{index + 1}", ["worker", "--port", str(port)], env,
                                          logs / f"worker-{index + 1}.log",
                                          Ready.http(f"http://127.0.0.1:{port}/healthz"), self.start_bounds))
        for index in range(self.apis):
            port = free_port()
            # Each instance serves gRPC too; its cards name it, and the cross-instance scenario creates through it.
            command = ["serve", "--port", str(port), "--grpc-port", str(free_port())]
            self.api.append(self.api_role(f"api-{index + 1}", env, logs / f"api-{index + 1}.log", port))
        self.dispatcher = self._dispatcher(env, logs)
        starting = self.worker + self.api + [self.dispatcher]
        self.progress(f"starting {self.workers} workers, {self.apis} API instances and the dispatcher "
                      f"({self.dispatcher_kind})")
        for process in starting:  # side by side: each is a Python start-up of a few seconds
            process.start()
        for process in starting:
            process.wait_ready()

    def api_role(self, name: str, env: dict[str, str], log_path: Path, port: int) -> Role:
        """An API instance (`specialists serve`, the edge alone) at ``port``; it serves gRPC too."""
        return drill_role(name, ["serve", "--port", str(port), "--grpc-port", str(free_port())], env, log_path,
                          Ready.http(f"http://127.0.0.1:{port}/readyz"), self.start_bounds)

    def _dispatcher(self, env: dict[str, str], logs: Path) -> Role:
        worker_urls = ",".join(self.worker_url(w) for w in self.worker)
        ready = ["dispatcher", "--ready-fd", READY_FD]  # a byte on a pipe once its loop runs
        if self.dispatcher_kind == "embedded":
            return drill_role("dispatcher", ready, {**env, "SPECIALISTS_DISPATCH_WORKER_URL": worker_urls},
                              logs / "dispatcher.log", Ready.pipe(), self.start_bounds)
        from workers.dispatch.emulator import CloudTasksEmulator

        self.progress("starting the Cloud Tasks emulator (its environment is built on first use)")
        # The emulator retries about every 100 ms and then drops the task for good (Cloud Tasks retries for
        # job_max_age_s): enough retries to outlast a killed worker's restart, or its jobs stay SUBMITTED.
        self.emulator = CloudTasksEmulator([EMULATOR_QUEUE], max_retries=int(EMULATOR_RETRY_S / 0.1),
                                           log_path=logs / "emulator.log")
        self.emulator.start()
        project, location, queue = EMULATOR_QUEUE.split("/")[1::2]
        relay_env = {
            **env,
            "SPECIALISTS_DISPATCH_BACKEND": "cloud_tasks",
            "SPECIALISTS_CLOUD_TASKS_PROJECT": project,
            "SPECIALISTS_CLOUD_TASKS_LOCATION": location,
            "SPECIALISTS_CLOUD_TASKS_QUEUE": queue,
            "SPECIALISTS_CLOUD_TASKS_EMULATOR_HOST": self.emulator.host,
            "SPECIALISTS_DISPATCH_SERVICE_ACCOUNT": "drill-dispatch@drill-project.iam.gserviceaccount.com",
            # Cloud Tasks calls one URL (the worker service's, in front of its instances); here the first worker.
            "SPECIALISTS_DISPATCH_WORKER_URL": self.worker_url(self.worker[0]),
        }
        return drill_role("relay", ready, relay_env, logs / "relay.log", Ready.pipe(), self.start_bounds)

    # --- what the drill uses ----------------------------------------------------------

    @property
    def api_urls(self) -> list[str]:
        return [url_of(p) for p in self.api]

    @staticmethod
    def worker_url(process: Role) -> str:
        return url_of(process) + "/jobs"

    def signer(self) -> KeySigner:
        return KeySigner([self.signing_secret], "test")

    def worker_running(self, job_id: str) -> Role | None:
        """The worker process holding the job's claim (its worker id carries its pid)."""
        assert self.engine is not None
        with self.engine.connect() as conn:
            worker_id = conn.execute(text("SELECT worker_id FROM job_claims WHERE job_id = :j"),
                                     {"j": job_id}).scalar_one_or_none()
        if not worker_id:
            return None
        pid = worker_id.split(":")[-2]
        return next((w for w in self.worker if str(w.pid) == pid), None)

    def stop(self) -> None:
        processes = ([self.dispatcher] if self.dispatcher else []) + self.worker + self.api
        self.progress(f"stopping {sum(p.alive for p in processes)} processes and dropping {self.database}")
        stop(processes, STOP_TIMEOUT_S, on_kill=lambda process: self.progress(
            f"{process.name} did not stop within {STOP_TIMEOUT_S:g} s of SIGTERM: SIGKILL (its log: {process.log_path})"))
        if self.emulator is not None:
            self.emulator.stop()
        if self.engine is not None:
            self.engine.dispose()
        if self._created:
            self._on_server(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')

    def _on_server(self, statement: str) -> None:
        admin = create_engine(self.server, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(statement))
        finally:
            admin.dispose()

    def __enter__(self) -> LocalTopology:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
