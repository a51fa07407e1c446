"""Workers as real processes: kill -9 mid-job, and concurrent deliveries across processes."""

from __future__ import annotations

import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text

from ops.topology import Ready, Role, stop
from tests import http_calls
from tests.workers.conftest import WORKER_SECRET
from tests.workers.system import START_BOUNDS
from taskstate import claims
from workers.auth import JobSigner

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

# Long enough that the "busy" answer right after the kill holds on a loaded machine; the wait for it to pass is
# a wait on the claim row, not a sleep.
LEASE_S = 5.0


class WorkerProcess:
    """The real worker (tests.workers.worker_process), an ops/topology.py role ready on its LISTENING line."""

    def __init__(self, env: dict[str, str], step_log: Path) -> None:
        self.role = Role("worker", [sys.executable, "-m", "tests.workers.worker_process", str(step_log)], env,
                         Ready.line("LISTENING "), step_log.with_name(f"worker-{secrets.token_hex(3)}.log"),
                         bounds=START_BOUNDS, stop_grace_s=10).run()
        self.url = f"http://127.0.0.1:{int(self.role.ready_line.split()[1])}/jobs"

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


@pytest.fixture
def step_log(tmp_path: Path) -> Path:
    path = tmp_path / "steps.log"
    path.touch()
    return path


@pytest.fixture
def spawn(service_env: dict[str, str], step_log: Path) -> Iterator:
    env = dict(service_env)
    env.update(
        SPECIALISTS_WORKER_JOB_SECRETS=WORKER_SECRET,
        SPECIALISTS_WORKER_OIDC_VERIFY="false",
        SPECIALISTS_WORKER_LEASE_S=str(LEASE_S),
        SPECIALISTS_WORKER_HEARTBEAT_S="0.2",
        SPECIALISTS_WORKER_CANCEL_GRACE_S="0.5",
    )
    started: list[WorkerProcess] = []

    def start_one() -> WorkerProcess:
        worker = WorkerProcess(env, step_log)
        started.append(worker)
        return worker

    def start(count: int) -> list[WorkerProcess]:
        """``count`` workers, started side by side (each is a Python start-up of its own)."""
        with ThreadPoolExecutor(count) as pool:
            return list(pool.map(lambda _: start_one(), range(count)))

    yield start
    stop([worker.role for worker in started])  # asked at once, waited for together


def runs(step_log: Path, job_id: str) -> list[str]:
    """The pids of the processes that started running the job."""
    return [line.split()[0] for line in step_log.read_text().splitlines() if line.split()[1:3] == [job_id, "0"]]


def lease_passed(engine: Engine, job_id: str) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(text("SELECT lease_expires_at < clock_timestamp() FROM job_claims WHERE job_id = :j"),
                                 {"j": job_id}).scalar())


def body(job_id: str, steps: list[dict]) -> bytes:
    signer = JobSigner([WORKER_SECRET], audience="specialists-worker", max_age_s=3600)
    return signer.sign(job_id=job_id, specialist_id="scripted", deadline_s=60, payload={"script": {"steps": steps}})


def test_a_worker_killed_mid_job_leaves_it_unknown_and_no_later_delivery_runs_it(spawn, step_log, engine: Engine) -> None:
    job = "job-" + secrets.token_hex(8)
    signed = body(job, [{"op": "sleep", "seconds": 30}, {"op": "complete"}])
    first, second = spawn(2)

    cut_off: list[BaseException] = []

    def deliver_to_the_doomed_worker() -> None:
        try:
            first.post(signed)
        except httpx.HTTPError as exc:  # the connection dies with the process
            cut_off.append(exc)

    in_flight = threading.Thread(target=deliver_to_the_doomed_worker, daemon=True)
    in_flight.start()
    deadline = time.monotonic() + 10
    while not runs(step_log, job) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert runs(step_log, job) == [str(first.process.pid)]

    first.kill()
    busy = second.post(signed)  # the dead worker's lease is still live: come back later
    assert busy.status_code == 503 and busy.json()["code"] == "job_busy"

    deadline = time.monotonic() + LEASE_S + 30
    while not lease_passed(engine, job):  # by the database's clock, which the claim decides by
        assert time.monotonic() < deadline, "the dead worker's lease never passed"
        time.sleep(0.05)
    later = second.post(signed)
    assert later.status_code == 200 and later.json()["code"] == "job_outcome_unknown"
    assert second.post(signed).json()["code"] == "job_outcome_unknown"
    assert runs(step_log, job) == [str(first.process.pid)]  # it ran once, in the killed process
    with engine.connect() as conn:
        row = claims.get(conn, job)
    assert row["state"] == "unknown" and row["claims"] == 1 and row["fencing_token"] == 1
    in_flight.join(5)
    assert cut_off, "the killed worker answered; it should have died mid-job"


def test_five_concurrent_deliveries_across_two_worker_processes_run_the_job_once(spawn, step_log, engine) -> None:
    job = "job-" + secrets.token_hex(8)
    signed = body(job, [{"op": "sleep", "seconds": 0.5}, {"op": "complete", "text": "once"}])
    workers = spawn(2)
    barrier = threading.Barrier(5)
    answers: list[httpx.Response] = []

    def deliver(i: int) -> None:
        barrier.wait()
        answers.append(workers[i % 2].post(signed))

    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(a.json()["code"] for a in answers) == ["job_busy"] * 4 + ["job_finished"]
    assert len(runs(step_log, job)) == 1
    with engine.connect() as conn:
        assert claims.get(conn, job)["outcome"] == "completed"
