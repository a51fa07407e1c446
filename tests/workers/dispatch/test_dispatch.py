"""Dispatch: deterministic task names, the Cloud Tasks task we send, repeated enqueues, the emulator path."""

from __future__ import annotations

import http.server
import re
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from core.settings import Settings
from tests.workers.dispatch.cloud_tasks_fake import FakeCloudTasks
from tests.workers.conftest import QUEUE, SERVICE_ACCOUNT, cloud_tasks_settings
from workers.auth import JobSigner
from workers.dispatch.base import DispatchJob, DispatchRefused, task_id_for
from workers.dispatch.cloud_tasks import BODY_CONTENT_TYPE, CloudTasksDispatcher

pytestmark = pytest.mark.timeout(60)

CLOUD_TASKS_TASK_ID = re.compile(r"^[A-Za-z0-9_-]{1,500}$")


@settings(deadline=None)  # hypothesis' per-example deadline is a wall-clock bound: a loaded machine misses it
@given(st.text(min_size=1, max_size=200), st.text(min_size=1, max_size=200))
def test_the_task_name_is_derived_from_the_job_id_alone_and_legal_for_cloud_tasks(a: str, b: str) -> None:
    assert CLOUD_TASKS_TASK_ID.match(task_id_for(a))
    assert task_id_for(a) == task_id_for(a)
    assert (task_id_for(a) == task_id_for(b)) == (a == b)


def job(worker_url: str = "http://127.0.0.1:9/jobs", deadline_s: float = 30, body: bytes = b"v1.x.y") -> DispatchJob:
    return DispatchJob(job_id="job-1", specialist_id="scripted", body=body, worker_url=worker_url, deadline_s=deadline_s)


def test_the_task_carries_the_signed_body_the_oidc_token_and_the_dispatch_deadline() -> None:
    with FakeCloudTasks() as fake:
        dispatcher = CloudTasksDispatcher.from_settings(cloud_tasks_settings(
            fake.host,
            dispatch={"deadline_s": 120, "job_deadline_s": 60},
        ))
        result = dispatcher.enqueue(job(body=b"v1.abc.signed"))
    assert result.created
    sent = fake.requests[0]
    assert sent.parent == QUEUE
    assert sent.task.name == f"{QUEUE}/tasks/{task_id_for('job-1')}" == result.task_name
    request = sent.task.http_request
    assert request.url == "http://127.0.0.1:9/jobs" and request.body == b"v1.abc.signed"
    assert request.headers["Content-Type"] == BODY_CONTENT_TYPE
    assert request.oidc_token.service_account_email == SERVICE_ACCOUNT
    assert request.oidc_token.audience == "specialists-worker"
    assert sent.task.dispatch_deadline.total_seconds() == 120
    assert not any("job" in header.lower() for header in request.headers)  # identity lives in the body only


def test_a_repeated_enqueue_after_a_crash_counts_as_success() -> None:
    with FakeCloudTasks() as fake:
        dispatcher = CloudTasksDispatcher.from_settings(cloud_tasks_settings(fake.host))
        first = dispatcher.enqueue(job())
        again = dispatcher.enqueue(job())  # the relay crashed before marking the outbox row sent
    assert first.created and not again.created
    assert first.task_name == again.task_name
    assert len(fake.names) == 1


def test_an_enqueue_whose_answer_was_lost_is_retried_harmlessly() -> None:
    with FakeCloudTasks(lose_first_answers=1) as fake:
        dispatcher = CloudTasksDispatcher.from_settings(cloud_tasks_settings(fake.host))
        result = dispatcher.enqueue(job())
    assert len(fake.requests) == 2 and len(fake.names) == 1
    assert not result.created  # the retry found the task the lost answer had created


# The enqueue timeout is checked with this much room: what the test proves is that the retries stop at the
# setting at all (a Retry not given it keeps going for google-api-core's default of 120 s), not how promptly.
ENQUEUE_TIMEOUT_MARGIN_FACTOR = 20


def test_an_unreachable_queue_is_a_dispatch_error_within_the_enqueue_timeout() -> None:
    unreachable = cloud_tasks_settings("127.0.0.1:1", dispatch={"enqueue_timeout_s": 1.0})
    dispatcher = CloudTasksDispatcher.from_settings(unreachable)
    bound_s = ENQUEUE_TIMEOUT_MARGIN_FACTOR * unreachable.dispatch.enqueue_timeout_s
    started = time.monotonic()
    with pytest.raises(Exception) as failed:
        dispatcher.enqueue(job())
    took_s = time.monotonic() - started
    assert getattr(failed.value, "code", None) == "dispatch_failed"
    assert took_s < bound_s, (
        f"the enqueue gave up after {took_s:.1f} s; SPECIALISTS_DISPATCH_ENQUEUE_TIMEOUT_S is "
        f"{unreachable.dispatch.enqueue_timeout_s:g} s (checked with {ENQUEUE_TIMEOUT_MARGIN_FACTOR}x room)"
    )


def test_a_job_that_would_outlive_the_dispatch_deadline_is_refused_before_enqueue() -> None:
    with FakeCloudTasks() as fake:
        dispatcher = CloudTasksDispatcher.from_settings(
            cloud_tasks_settings(
                fake.host,
                dispatch={"deadline_s": 60, "job_deadline_s": 30},
                worker={"cancel_grace_s": 5},
            )
        )
        with pytest.raises(DispatchRefused) as refused:
            dispatcher.enqueue(job(deadline_s=58))
    assert refused.value.code == "dispatch_deadline_too_short"
    assert "SPECIALISTS_DISPATCH_DEADLINE_S" in refused.value.message
    assert fake.requests == []


@pytest.mark.parametrize("deadline_s", [14, 1801])
def test_a_dispatch_deadline_outside_what_cloud_tasks_allows_stops_start_up(deadline_s: int) -> None:
    with pytest.raises(ValidationError, match=r"dispatch\.deadline_s"):
        Settings(dispatch={"deadline_s": deadline_s})


def test_cloud_tasks_settings_name_what_is_missing() -> None:
    with pytest.raises(ValidationError, match="SPECIALISTS_CLOUD_TASKS_QUEUE.*SPECIALISTS_DISPATCH_SERVICE_ACCOUNT"):
        Settings(dispatch={"backend": "cloud_tasks", "cloud_tasks_project": "p", "cloud_tasks_location": "l"})


def test_oidc_checking_cannot_be_turned_off_with_real_cloud_tasks() -> None:
    real = {
        "backend": "cloud_tasks",
        "cloud_tasks_project": "p",
        "cloud_tasks_location": "l",
        "cloud_tasks_queue": "q",
        "service_account": SERVICE_ACCOUNT,
    }
    with pytest.raises(ValidationError, match="SPECIALISTS_WORKER_OIDC_VERIFY"):
        Settings(dispatch=real, worker={"oidc_verify": False})
    emulated = {**real, "cloud_tasks_emulator_host": "127.0.0.1:8123"}
    Settings(dispatch=emulated, worker={"oidc_verify": False})  # one machine: allowed


def test_an_oversized_body_or_bad_job_id_is_refused_before_enqueue() -> None:
    with FakeCloudTasks() as fake:
        dispatcher = CloudTasksDispatcher.from_settings(cloud_tasks_settings(
            fake.host,
            dispatch={"max_body_bytes": 1024},
        ))
        with pytest.raises(DispatchRefused) as too_big:
            dispatcher.enqueue(job(body=b"x" * 1025))
        with pytest.raises(DispatchRefused) as bad_id:
            dispatcher.enqueue(DispatchJob("job 1/../x", "scripted", b"b", "http://127.0.0.1:9/jobs", 5))
        refused = []
        for job_id, specialist_id in (("job-1\n", "scripted"), ("job-1", "scripted\n")):  # `$` matched before it
            with pytest.raises(DispatchRefused) as trailing:
                dispatcher.enqueue(DispatchJob(job_id, specialist_id, b"b", "http://127.0.0.1:9/jobs", 5))
            refused.append(trailing.value.code)
    assert too_big.value.code == "job_body_too_large" and "SPECIALISTS_DISPATCH_MAX_BODY_BYTES" in too_big.value.message
    assert bad_id.value.code == "job_id_invalid"
    assert refused == ["job_id_invalid", "specialist_id_invalid"]


# The emulator delivers on its own schedule: a generous deadline, since only "never" is a failure.
EMULATOR_DELIVERY_TIMEOUT_S = 60.0


class _Recorder(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, object, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        length = int(self.headers["Content-Length"])
        self.received.append((self.path, self.headers, self.rfile.read(length)))  # case-insensitive
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.timeout(120)
def test_the_real_client_enqueues_through_the_emulator_and_the_request_arrives_with_body_and_headers(emulator) -> None:
    _Recorder.received = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        settings = cloud_tasks_settings(emulator.host, worker={"oidc_verify": False})
        body = JobSigner.from_settings(settings).sign(job_id="job-emu-1", specialist_id="scripted", deadline_s=5)
        url = f"http://127.0.0.1:{server.server_port}/jobs"
        result = CloudTasksDispatcher.from_settings(settings).enqueue(
            DispatchJob("job-emu-1", "scripted", body, url, 5)
        )
        deadline = time.monotonic() + EMULATOR_DELIVERY_TIMEOUT_S
        while not _Recorder.received and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.shutdown()
    assert _Recorder.received, f"the emulator delivered nothing within {EMULATOR_DELIVERY_TIMEOUT_S:g} s"
    path, headers, received_body = _Recorder.received[0]
    assert path == "/jobs" and received_body == body
    assert headers["Content-Type"] == BODY_CONTENT_TYPE
    assert headers["X-CloudTasks-TaskName"] == result.task_name.rsplit("/", 1)[1]
    assert headers["X-CloudTasks-QueueName"] == QUEUE
