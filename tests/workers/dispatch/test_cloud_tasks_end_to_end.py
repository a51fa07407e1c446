"""The Cloud Tasks path end to end: the real client, the emulator, a real worker on loopback, PostgreSQL."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

import pytest
from sqlalchemy import Engine

from tests.workers.conftest import cloud_tasks_settings
from tests.workers.harness import TestWorker, worker_settings
from taskstate import claims
from workers.dispatch.base import DispatchJob
from workers.dispatch.cloud_tasks import CloudTasksDispatcher

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


# The emulator delivers on its own schedule: a generous deadline, since only "never" is a failure.
DELIVERY_TIMEOUT_S = 60.0


def wait_for_claim(engine: Engine, job_id: str, condition: Callable[[dict], bool], what: str) -> dict:
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    row = None
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            row = claims.get(conn, job_id)
        if row is not None and condition(row):
            return row
        time.sleep(0.05)
    raise AssertionError(f"job {job_id}: {what} within {DELIVERY_TIMEOUT_S:g} s; its claim is {row}")


def test_a_job_enqueued_twice_through_the_emulator_runs_once_on_the_worker(emulator, database_url, engine) -> None:
    """The emulator delivers a duplicate task name twice (real Cloud Tasks would refuse it): the claim holds."""
    with TestWorker(worker_settings(database_url), engine) as worker:
        dispatcher = CloudTasksDispatcher.from_settings(cloud_tasks_settings(
            emulator.host,
            worker={"oidc_verify": False},
        ))
        job = "job-" + secrets.token_hex(8)
        signed = worker.body(job, [{"op": "progress", "text": "working"}, {"op": "complete", "text": "via cloud tasks"}],
                             deadline_s=10)
        dispatch = DispatchJob(job, "scripted", signed, worker.jobs_url, 10)
        dispatcher.enqueue(dispatch)
        dispatcher.enqueue(dispatch)  # the relay crashed after the first enqueue and sent it again
        wait_for_claim(engine, job, lambda row: row["state"] == "finished", "never finished")
        row = wait_for_claim(engine, job, lambda row: row["deliveries"] >= 2, "the second delivery never came")
    assert row["state"] == "finished" and row["outcome"] == "completed"
    assert row["outcome_detail"]["message"] == "via cloud tasks"
    assert row["deliveries"] == 2 and worker.log.runs(job) == 1
