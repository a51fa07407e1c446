"""Delivering over HTTP to a real worker: each kind of answer maps to what the queue must do."""

from __future__ import annotations

import secrets
import socket
import threading
from contextlib import closing
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import Engine

from tests.workers.harness import TestWorker, worker_settings
from workers.dispatch.base import DispatchJob
from workers.dispatch.delivery import WorkerConnections, deliver_over_http, retry_delay_s
from workers.dispatch.embedded import DeliveryThreads
from taskstate.outbox import OutboxRow

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
    with closing(WorkerConnections(max_idle_per_url=2)) as client, ThreadPoolExecutor(1) as pool:
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
    with closing(WorkerConnections(max_idle_per_url=2)) as client:
        result = deliver_over_http(forged, client=client, timeout_s=10)
    assert (result.verdict, result.status, result.code) == ("refused", 401, "job_body_unknown_secret")


def test_an_unreachable_worker_is_retried(worker: TestWorker) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with closing(WorkerConnections(max_idle_per_url=2)) as client:
        result = deliver_over_http(dispatch(worker, "job-y", [], f"http://127.0.0.1:{port}/jobs"), client=client, timeout_s=2)
    assert (result.verdict, result.status, result.code) == ("retry", None, "worker_unreachable")


def test_a_delivery_that_outlives_its_deadline_is_retried_later(worker: TestWorker) -> None:
    job = "job-" + secrets.token_hex(8)
    with closing(WorkerConnections(max_idle_per_url=2)) as client:
        with worker.log.holding(job):  # the worker answers only after the delivery has given up on it
            result = deliver_over_http(dispatch(worker, job, [{"op": "complete"}]), client=client, timeout_s=0.3)
    assert (result.verdict, result.code) == ("retry", "worker_timed_out")


def test_backoff_grows_is_capped_and_never_undercuts_retry_after() -> None:
    for attempt in range(12):
        delay = retry_delay_s(attempt, None, base_s=0.5, max_s=30)
        assert 0 <= delay <= min(30, 0.5 * 2**attempt)
    assert retry_delay_s(0, 7, base_s=0.5, max_s=30) == 7
    assert retry_delay_s(0, 300, base_s=0.5, max_s=30) == 30


def _one_answer_per_connection(answers: int) -> tuple[int, threading.Thread]:
    """A server that answers each connection's first request as a worker would (200, a ``job_finished`` body, no
    ``Connection: close``) and then closes it: what a client finds when a worker ended a kept-alive connection
    while it sat idle (its keep-alive timeout, a restart)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        with server:
            for _ in range(answers):
                connection, _ = server.accept()
                with connection:
                    request = b""
                    while b"\r\n\r\n" not in request:
                        request += connection.recv(65536)
                    head, _, body = request.partition(b"\r\n\r\n")
                    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                                      if line.lower().startswith(b"content-length:")))
                    while len(body) < length:
                        body += connection.recv(65536)
                    answer = b'{"code": "job_finished"}'
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                       b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer))
                    connection.shutdown(socket.SHUT_WR)
                    connection.recv(1)  # the client has read the answer and closed, or sends nothing more

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return port, thread


def test_a_kept_alive_connection_the_worker_closed_is_not_reused() -> None:
    port, server = _one_answer_per_connection(answers=2)
    job = DispatchJob("job-z", "scripted", b"v1.body", f"http://127.0.0.1:{port}/jobs", 30)
    with closing(WorkerConnections(max_idle_per_url=2)) as client:
        first = deliver_over_http(job, client=client, timeout_s=10)
        second = deliver_over_http(job, client=client, timeout_s=10)  # its pooled connection is closed: a new one
    server.join(timeout=10)
    assert (first.verdict, first.code) == ("done", "job_finished")
    assert (second.verdict, second.code) == ("done", "job_finished")


def _row(dispatch_id: int) -> OutboxRow:
    return OutboxRow(dispatch_id, f"task-{dispatch_id}", "scripted", "c:scripted", "ctx", 1)


def test_deliveries_one_after_another_run_on_one_kept_thread() -> None:
    ran: list[tuple[int, str]] = []
    done = threading.Semaphore(0)

    def deliver(row: OutboxRow, url: str) -> None:
        ran.append((row.dispatch_id, threading.current_thread().name))
        done.release()

    threads = DeliveryThreads(deliver, max_threads=4)
    for dispatch_id in range(5):
        threads.submit(_row(dispatch_id), "http://w/jobs")
        assert done.acquire(timeout=10)
    assert [d for d, _ in ran] == list(range(5))
    assert threads.started == 1 and len({name for _, name in ran}) == 1


def test_deliveries_at_once_each_get_a_thread_up_to_the_bound_and_the_rest_wait_for_one() -> None:
    release = threading.Event()
    started = threading.Semaphore(0)
    ended = threading.Semaphore(0)

    def deliver(row: OutboxRow, url: str) -> None:
        started.release()
        release.wait(timeout=30)
        if row.dispatch_id == 0:
            raise RuntimeError("a delivery that fails frees its thread all the same")
        ended.release()

    threads = DeliveryThreads(deliver, max_threads=3)
    for dispatch_id in range(5):
        threads.submit(_row(dispatch_id), "http://w/jobs")
    for _ in range(3):  # three run at once, the other two wait for a thread
        assert started.acquire(timeout=10)
    assert threads.started == 3 and not started.acquire(timeout=0)
    release.set()
    for _ in range(4):
        assert ended.acquire(timeout=10)
    assert threads.started == 3
