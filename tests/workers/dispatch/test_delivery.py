"""Delivering over HTTP to a real worker: each kind of answer maps to what the queue must do."""

from __future__ import annotations

import secrets
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import Engine

from tests.workers.harness import TestWorker, worker_settings
from workers.dispatch.base import DispatchJob
from workers.dispatch.delivery import deliver_over_http, retry_delay_s

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def worker(database_url: str, engine: Engine):
    with TestWorker(worker_settings(database_url), engine) as served:
        yield served


def dispatch(worker: TestWorker, job_id: str, steps: list[dict], url: str | None = None) -> DispatchJob:
    return DispatchJob(job_id, "scripted", worker.body(job_id, steps), url or worker.jobs_url, 30)


def test_finished_busy_and_unknown_answers_tell_the_queue_what_to_do(worker: TestWorker) -> None:
    job = "job-" + secrets.token_hex(8)
    running = dispatch(worker, job, [{"op": "complete"}])
    with httpx.Client() as client, ThreadPoolExecutor(1) as pool:
        with worker.log.holding(job):  # the first delivery's run goes on only once the second one is answered
            first = pool.submit(deliver_over_http, running, client=client, timeout_s=30)
            worker.log.wait_for_run(job)
            busy = deliver_over_http(running, client=client, timeout_s=30)
        done = first.result(timeout=30)
        again = deliver_over_http(running, client=client, timeout_s=30)
    assert (busy.verdict, busy.status, busy.code) == ("retry", 503, "job_busy") and busy.retry_after_s >= 1
    assert (done.verdict, done.code) == ("done", "job_finished")
    assert (again.verdict, again.code) == ("done", "job_already_finished")


def test_a_refused_delivery_is_not_retried_blindly(worker: TestWorker) -> None:
    forged = DispatchJob("job-x", "scripted", b"v1.deadbeef.forged", worker.jobs_url, 30)
    with httpx.Client() as client:
        result = deliver_over_http(forged, client=client, timeout_s=10)
    assert (result.verdict, result.status, result.code) == ("refused", 401, "job_body_unknown_secret")


def test_an_unreachable_worker_is_retried(worker: TestWorker) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with httpx.Client() as client:
        result = deliver_over_http(dispatch(worker, "job-y", [], f"http://127.0.0.1:{port}/jobs"), client=client, timeout_s=2)
    assert (result.verdict, result.status, result.code) == ("retry", None, "worker_unreachable")


def test_a_delivery_that_outlives_its_deadline_is_retried_later(worker: TestWorker) -> None:
    job = "job-" + secrets.token_hex(8)
    with httpx.Client() as client:
        with worker.log.holding(job):  # the worker answers only after the delivery has given up on it
            result = deliver_over_http(dispatch(worker, job, [{"op": "complete"}]), client=client, timeout_s=0.3)
    assert (result.verdict, result.code) == ("retry", "worker_timed_out")


def test_backoff_grows_is_capped_and_never_undercuts_retry_after() -> None:
    for attempt in range(12):
        delay = retry_delay_s(attempt, None, base_s=0.5, max_s=30)
        assert 0 <= delay <= min(30, 0.5 * 2**attempt)
    assert retry_delay_s(0, 7, base_s=0.5, max_s=30) == 7
    assert retry_delay_s(0, 300, base_s=0.5, max_s=30) == 30
