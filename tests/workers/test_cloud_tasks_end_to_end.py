"""The Cloud Tasks path end to end: the real client, the emulator, a real worker on loopback, PostgreSQL."""

from __future__ import annotations

import secrets
import time

import pytest
from sqlalchemy import Engine

from tests.workers.conftest import cloud_tasks_settings
from tests.workers.harness import TestWorker, worker_settings
from workers import claims
from workers.dispatch.base import DispatchJob
from workers.dispatch.cloud_tasks import CloudTasksDispatcher

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def wait_for_state(engine: Engine, job_id: str, timeout_s: float = 20) -> dict | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            row = claims.get(conn, job_id)
        if row and row["state"] == "finished":
            return row
        time.sleep(0.05)
    return None


def test_a_job_enqueued_twice_through_the_emulator_runs_once_on_the_worker(emulator, database_url, engine) -> None:
    """The emulator delivers a duplicate task name twice (real Cloud Tasks would refuse it): the claim holds."""
    with TestWorker(worker_settings(database_url), engine) as worker:
        dispatcher = CloudTasksDispatcher.from_settings(cloud_tasks_settings(emulator.host, worker_oidc_verify=False))
        job = "job-" + secrets.token_hex(8)
        signed = worker.body(job, [{"op": "progress", "text": "working"}, {"op": "complete", "text": "via cloud tasks"}],
                             deadline_s=10)
        dispatch = DispatchJob(job, "scripted", signed, worker.jobs_url, 10)
        dispatcher.enqueue(dispatch)
        dispatcher.enqueue(dispatch)  # the relay crashed after the first enqueue and sent it again
        row = wait_for_state(engine, job)
        deadline = time.monotonic() + 10
        while (row is None or row["deliveries"] < 2) and time.monotonic() < deadline:
            time.sleep(0.05)
            with engine.connect() as conn:
                row = claims.get(conn, job)
    assert row["state"] == "finished" and row["outcome"] == "completed"
    assert row["outcome_detail"]["message"] == "via cloud tasks"
    assert row["deliveries"] == 2 and worker.log.runs(job) == 1
