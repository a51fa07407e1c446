"""A worker's clean stop (issue 44 §4): what it has not started goes back at once, what it leaves running is decided.

From a stop signal on (``WorkerService.begin_stop``, which the worker's SIGTERM/SIGINT handler calls) a delivery
claims nothing and is answered ``worker_stopping``; a job claimed as the signal came is released before its run
starts. Either way another worker runs it at once: no lease to wait out, one run. A job still running when the
worker stops (past its drain) had started, so it is recorded unknown then (``abandon_running``), never run again.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, event

from tests.rlm.holds import wait_until
from tests.workers.conftest import WORKER_SECRET
from tests.workers.harness import TestWorker, worker_settings
from tests.workers.test_server import ANSWER_TIMEOUT_S, RecordingSettlement, claim_row, new_job_id, settlements
from tests.workers.test_worker_crash import WorkerProcess, body, runs


@pytest.fixture
def two_workers(database_url: str, engine: Engine) -> Iterator[tuple[TestWorker, TestWorker]]:
    with TestWorker(worker_settings(database_url), engine) as stopping, \
            TestWorker(worker_settings(database_url), engine) as other:
        yield stopping, other


def test_a_stopping_worker_claims_nothing_and_another_worker_runs_the_job_at_once(two_workers, engine: Engine) -> None:
    stopping, other = two_workers
    job = new_job_id()
    body = stopping.body(job, [{"op": "complete", "text": "ran on the other worker"}])
    stopping.service.begin_stop()

    handed_back = stopping.post(body)
    assert (handed_back.status_code, handed_back.json()["code"]) == (503, "worker_stopping")
    assert "Retry-After" not in handed_back.headers  # nothing to wait for: deliver it elsewhere now
    assert claim_row(engine, job) is None  # no claim, so no lease stands between the job and another worker

    assert other.post(body).json()["code"] == "job_finished"
    row = claim_row(engine, job)
    assert (row["state"], row["outcome"], row["claims"], row["unknown_at"]) == ("finished", "completed", 1, None)
    assert (stopping.log.runs(job), other.log.runs(job)) == (0, 1)


def test_a_job_claimed_as_its_worker_began_to_stop_is_given_back_before_it_runs(two_workers, engine: Engine) -> None:
    stopping, other = two_workers
    job = new_job_id()
    body = stopping.body(job, [{"op": "complete", "text": "ran on the other worker"}])

    def stop_during_the_claim(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        # the signal arrives while the claim commits (a first delivery's: job_claim_first, in autocommit)
        if ("job_claim(" in statement or "job_claim_first(" in statement) and job in str(parameters):
            stopping.service.begin_stop()

    event.listen(engine, "after_cursor_execute", stop_during_the_claim)
    try:
        handed_back = stopping.post(body)
    finally:
        event.remove(engine, "after_cursor_execute", stop_during_the_claim)
    assert (handed_back.status_code, handed_back.json()["code"]) == (503, "worker_stopping")
    row = claim_row(engine, job)
    assert (row["state"], row["fencing_token"], row["lease_expires_at"]) == ("released", 1, None)

    assert other.post(body).json()["code"] == "job_finished"  # claimed again at once (token 2), no lease passed
    row = claim_row(engine, job)
    assert (row["state"], row["fencing_token"], row["claims"], row["unknown_at"]) == ("finished", 2, 2, None)
    assert (stopping.log.runs(job), other.log.runs(job)) == (0, 1)


def test_a_job_still_running_when_its_worker_stops_is_recorded_unknown_then(database_url: str, engine: Engine) -> None:
    with TestWorker(worker_settings(database_url), engine, settlement=RecordingSettlement(engine)) as worker:
        job = new_job_id()
        with ThreadPoolExecutor(1) as pool:
            with worker.log.holding(job):  # running, and still running when the worker gives it up
                pending = pool.submit(worker.post, worker.body(job, [{"op": "complete"}]))
                worker.log.wait_for_run(job)
                worker.service.begin_stop()
                assert worker.service.abandon_running() == [job]
                assert worker.service.abandon_running() == []  # decided once
            answer = pending.result(timeout=ANSWER_TIMEOUT_S)
    # The run that went on anyway reports into a claim that is no longer its own: kept for operators, no money.
    assert answer.json()["code"] == "job_result_stale"
    row = claim_row(engine, job)
    assert row["state"] == "unknown" and "stopped before it ended" in row["unknown_reason"]
    assert row["outcome"] is None and row["claims"] == 1
    # Marked unknown with the claim (the late result's finish marks it again: the mark is idempotent), never settled.
    assert settlements(engine, job)[0] == ("unknown", 1) and set(settlements(engine, job)) == {("unknown", 1)}


@pytest.mark.timeout(90)
def test_a_worker_stopped_by_sigterm_records_the_job_it_leaves_running_unknown_as_it_stops(
        service_env: dict[str, str], tmp_path: Path, engine: Engine) -> None:
    step_log = tmp_path / "steps.log"
    step_log.touch()
    env = {**service_env, "SPECIALISTS_WORKER_JOB_SECRETS": WORKER_SECRET, "SPECIALISTS_WORKER_OIDC_VERIFY": "false",
           # A lease longer than the test: only the worker's own stop can decide the job.
           "SPECIALISTS_WORKER_LEASE_S": "600", "SPECIALISTS_WORKER_HEARTBEAT_S": "0.2",
           "SPECIALISTS_WORKER_CANCEL_GRACE_S": "0.5", "SPECIALISTS_WORKER_DRAIN_S": "0"}
    worker = WorkerProcess(env, step_log)
    job = new_job_id()

    def deliver() -> None:
        try:
            worker.post(body(job, [{"op": "sleep", "seconds": 60}, {"op": "complete"}]))
        except httpx.HTTPError:  # the request ends with the worker
            pass

    in_flight = threading.Thread(target=deliver, daemon=True)
    in_flight.start()
    wait_until(lambda: runs(step_log, job), "the job's run to start on the worker")
    worker.process.send_signal(signal.SIGTERM)  # a clean stop: its drain (0 s) passes with the job still running
    worker.process.wait(60)  # uvicorn raises the signal again once it stopped: this harness exits by it
    row = claim_row(engine, job)
    assert row["state"] == "unknown" and "stopped before it ended" in row["unknown_reason"]
    assert row["claims"] == 1 and runs(step_log, job) == [str(worker.process.pid)]
    in_flight.join(5)
