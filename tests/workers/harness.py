"""Serving an ASGI app on 127.0.0.1 in a thread, and a worker set up for tests (real HTTP, real PostgreSQL)."""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn
from sqlalchemy import Engine

from core.settings import Settings
from tests import http_calls
from tests.workers.conftest import WORKER_SECRET
from workers.auth import JobSigner
from workers.runs import ScriptedRunner, ScriptStep
from workers.server import JOBS_PATH, create_worker_app
from workers.assembly import build_worker_service


class Served:
    """An app served by uvicorn on a free loopback port until the block ends."""

    def __init__(self, app: Any) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "Served":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.server.started, "uvicorn did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def worker_settings(database_url: str, **sections: dict[str, Any]) -> Settings:
    """A worker's settings; ``sections`` override fields section by section (``worker={"lease_s": 2.0}``)."""
    options: dict[str, dict[str, Any]] = {
        "database": {"url": database_url},
        "worker": {
            "job_secrets": [WORKER_SECRET],
            "oidc_verify": False,
            # Twenty-five heartbeats a lease: a loaded machine that starves the worker's loop for seconds does not
            # lose its claims. The test of renewal itself runs past a shorter lease of its own.
            "lease_s": 5.0,
            "heartbeat_s": 0.2,
            "cancel_grace_s": 0.5,
            # TestWorker's runners hold in-process callbacks (StepLog.holding); tests of the process model set
            # "process" and script their jobs instead.
            "job_isolation": "thread",
        },
    }
    for section, fields in sections.items():
        options.setdefault(section, {}).update(fields)
    return Settings(**options)


class StepLog:
    """Records every scripted step a worker starts, so a test can count real runs.

    A job under ``holding(job_id)`` stops at its first step until the block ends: a test that needs the job
    to be running while something else happens (another delivery, a full worker) holds it there, instead of
    hoping a sleep in the script lasts long enough.
    """

    # A held job waits at most this long, so that a test that forgets to let go cannot hang its worker.
    MAX_HOLD_S = 60.0

    def __init__(self) -> None:
        self.steps: list[tuple[str, int, str]] = []
        self._lock = threading.Lock()
        self._held: dict[str, threading.Event] = {}

    def __call__(self, job_id: str, index: int, step: ScriptStep) -> None:
        with self._lock:
            self.steps.append((job_id, index, step.op))
            released = self._held.get(job_id) if index == 0 else None
        if released is not None:
            released.wait(self.MAX_HOLD_S)

    def runs(self, job_id: str) -> int:
        with self._lock:
            return sum(1 for j, index, _ in self.steps if j == job_id and index == 0)

    def wait_for_run(self, job_id: str, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while self.runs(job_id) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.runs(job_id), f"job {job_id} never started within {timeout_s:g} s"

    @contextlib.contextmanager
    def holding(self, job_id: str) -> Iterator[None]:
        """Within the block, the job's run waits at its first step (after it is recorded); it goes on after."""
        released = threading.Event()
        with self._lock:
            self._held[job_id] = released
        try:
            yield
        finally:
            released.set()
            with self._lock:
                del self._held[job_id]


class TestWorker:
    """A worker app with a scripted runner, served on loopback.

    With ``job_isolation`` ``thread`` (``worker_settings``' default) its runners are objects of this process and
    ``log`` is a ``StepLog``; with ``process`` the worker serves its default runners, each job in a process of
    its own, and ``log`` is the ``on_step`` given (a picklable ``tests.workers.step_file.StepFile``)."""

    __test__ = False  # not a test class

    def __init__(self, settings: Settings, engine: Engine, **service_options: Any) -> None:
        self.settings = settings
        if settings.worker.job_isolation == "thread":
            self.log: Any = StepLog()
            runners = service_options.pop("runners", None) or {"scripted": ScriptedRunner(on_step=self.log)}
            self.service = build_worker_service(settings, engine, runners=runners, **service_options)
        else:
            self.log = service_options["on_step"]
            self.service = build_worker_service(settings, engine, **service_options)
        self.served = Served(create_worker_app(self.service))
        self.signer = JobSigner.from_settings(settings)
        self.counter = collections.Counter()

    def __enter__(self) -> "TestWorker":
        self.served.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.served.__exit__(*exc)
        self.service.jobs.close()  # what the app's lifespan does, which Served turns off

    @property
    def jobs_url(self) -> str:
        return self.served.url + JOBS_PATH

    def body(self, job_id: str, steps: list[dict[str, Any]], *, deadline_s: float = 30, specialist_id: str = "scripted") -> bytes:
        return self.signer.sign(
            job_id=job_id, specialist_id=specialist_id, deadline_s=deadline_s, payload={"script": {"steps": steps}}
        )

    def post(self, body: bytes, *, headers: dict[str, str] | None = None, timeout_s: float = 30) -> httpx.Response:
        return http_calls.post(
            self.jobs_url,
            content=body,
            headers={"Content-Type": "application/vnd.specialists.job", **(headers or {})},
            timeout=timeout_s,
        )
