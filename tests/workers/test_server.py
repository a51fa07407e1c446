"""The worker endpoint over real HTTP on 127.0.0.1 against real PostgreSQL."""

from __future__ import annotations

import math
import secrets
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import Connection, Engine, text

from tests.workers.conftest import SERVICE_ACCOUNT
from tests.workers.harness import TestWorker, worker_settings
from tests.workers.oidc_issuer import CertsEndpoint, LocalKey, cloud_tasks_claims
from taskstate import claims
from workers.auth import JobSigner
from workers.finish import NoSettlement
from workers.runs import RunOutcome

pytestmark = pytest.mark.timeout(60)


def new_job_id() -> str:
    return "job-" + secrets.token_hex(8)


def claim_row(engine: Engine, job_id: str) -> dict | None:
    with engine.connect() as conn:
        return claims.get(conn, job_id)


# How long a test waits for an answer the worker owes it: generous, since only "never" is a failure.
ANSWER_TIMEOUT_S = 30.0
# The worker's own bounds (a heartbeat, the grace, a job's deadline) are asserted with this much room: what a
# test proves is that the bound is respected at all (the worker did not wait for the run to end by itself,
# tens of seconds later), not how promptly a loaded machine schedules it.
BOUND_MARGIN_FACTOR = 5


def wait_for_answers(pending: list[Future], count: int) -> list:
    """The first ``count`` answers among the deliveries in flight."""
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while sum(p.done() for p in pending) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    done = [p.result() for p in pending if p.done()]
    assert len(done) >= count, f"only {len(done)} of {len(pending)} deliveries were answered within {ANSWER_TIMEOUT_S:g} s"
    return done


@pytest.fixture
def worker(database_url: str, engine: Engine):
    with TestWorker(worker_settings(database_url), engine) as served:
        yield served


def test_a_signed_delivery_runs_the_job_and_answers_its_outcome(worker: TestWorker, engine: Engine) -> None:
    job = new_job_id()
    answer = worker.post(worker.body(job, [{"op": "progress", "text": "reading"}, {"op": "artifact", "text": "report"},
                                           {"op": "complete", "text": "all good"}]))
    assert answer.status_code == 200
    assert answer.json()["code"] == "job_finished" and answer.json()["outcome"] == "completed"
    row = claim_row(engine, job)
    assert row["state"] == "finished" and row["outcome"] == "completed"
    assert row["outcome_detail"]["artifacts"] == [{"name": "artifact-1", "text": "report"}]


def test_the_same_job_delivered_five_times_at_once_runs_once(worker: TestWorker, engine: Engine) -> None:
    job = new_job_id()
    body = worker.body(job, [{"op": "complete", "text": "once"}])
    barrier = threading.Barrier(5)

    def deliver(_: int):
        barrier.wait()
        return worker.post(body)

    with ThreadPoolExecutor(5) as pool:
        with worker.log.holding(job):  # the run that claimed it waits until the four others have their answers
            pending = [pool.submit(deliver, i) for i in range(5)]
            answered = wait_for_answers(pending, 4)
        answers = [p.result(timeout=ANSWER_TIMEOUT_S) for p in pending]
    finished = [a for a in answers if a.json()["code"] == "job_finished"]
    told_to_retry = [a for a in answered if a.json()["code"] in ("job_busy", "worker_at_capacity")]
    assert len(finished) == 1 and len(told_to_retry) == 4  # 4 slots: a fifth request may not even get to claim
    for retry in told_to_retry:
        # When the claim's lease would run out: at most the lease (rounded up), at least a second.
        assert retry.status_code == 503 and 1 <= int(retry.headers["Retry-After"]) <= math.ceil(worker.settings.worker.lease_s)
    assert worker.log.runs(job) == 1
    again = worker.post(body)  # a later redelivery gets the stored outcome, and nothing runs
    assert again.status_code == 200 and again.json()["code"] == "job_already_finished"
    assert again.json()["outcome"] == "completed" and "once" not in again.text  # the state, never the result
    assert worker.log.runs(job) == 1
    assert claim_row(engine, job)["deliveries"] == 1 + sum(a.json()["code"] != "worker_at_capacity" for a in answers)


@pytest.mark.parametrize(
    ("make_body", "code", "status"),
    [
        (lambda w, job: JobSigner(["someone-elses-secret-" + "q" * 30], audience="specialists-worker", max_age_s=60)
         .sign(job_id=job, specialist_id="scripted", deadline_s=5), "job_body_unknown_secret", 401),
        (lambda w, job: w.body(job, [])[:-3] + b"AAA", "job_body_tampered", 401),
        (lambda w, job: JobSigner([w.settings.worker.job_secrets[0].get_secret_value()], audience="another-worker",
                                  max_age_s=60).sign(job_id=job, specialist_id="scripted", deadline_s=5),
         "job_body_wrong_audience", 403),
        (lambda w, job: b'{"job_id": "%s"}' % job.encode(), "job_body_malformed", 401),
    ],
)
def test_forged_or_tampered_deliveries_are_refused_and_claim_nothing(worker, engine, make_body, code, status) -> None:
    job = new_job_id()
    answer = worker.post(make_body(worker, job))
    assert (answer.status_code, answer.json()["code"]) == (status, code)
    assert job not in answer.text  # a refusal says nothing about the job
    assert claim_row(engine, job) is None


def test_the_job_id_comes_from_the_body_never_from_headers(worker: TestWorker, engine: Engine) -> None:
    job, other = new_job_id(), new_job_id()
    answer = worker.post(
        worker.body(job, [{"op": "complete"}]),
        headers={"X-CloudTasks-TaskName": other, "X-Job-Id": other, "X-CloudTasks-TaskRetryCount": "0"},
    )
    assert answer.json()["job_id"] == job
    assert claim_row(engine, job)["state"] == "finished" and claim_row(engine, other) is None


def test_an_oversized_body_is_refused_before_it_is_read(database_url: str, engine: Engine) -> None:
    with TestWorker(worker_settings(database_url, dispatch={"max_body_bytes": 1024}), engine) as small:
        answer = small.post(b"v1." + b"x" * 5000)
    assert answer.status_code == 413 and answer.json()["code"] == "job_body_too_large"


def test_a_specialist_this_worker_does_not_serve_is_refused_without_a_claim(worker: TestWorker, engine: Engine) -> None:
    job = new_job_id()
    answer = worker.post(worker.body(job, [], specialist_id="reviewer"))
    assert answer.status_code == 404 and answer.json()["code"] == "specialist_not_served"
    assert claim_row(engine, job) is None


def test_a_running_job_keeps_its_lease_beyond_the_first_lease_by_heartbeats(database_url: str, engine: Engine) -> None:
    job = new_job_id()
    # The run outlasts the lease (2 s, the database's clock) by wall-clock time: only renewals (ten a lease) keep
    # the claim.
    with TestWorker(worker_settings(database_url, worker={"lease_s": 2.0}), engine) as worker:
        answer = worker.post(worker.body(job, [{"op": "sleep", "seconds": 3.0}, {"op": "complete"}]))
    assert answer.json()["code"] == "job_finished"
    row = claim_row(engine, job)
    assert row["state"] == "finished" and row["fencing_token"] == 1 and row["renewed_at"] is not None


def test_a_cancel_from_any_instance_stops_the_running_job_within_one_heartbeat(worker: TestWorker, engine: Engine) -> None:
    job = new_job_id()
    limits = worker.settings
    bound_s = BOUND_MARGIN_FACTOR * (limits.worker.heartbeat_s + limits.worker.cancel_grace_s)
    with ThreadPoolExecutor(1) as pool:  # left alone, the run would last 20 s: far beyond the bound
        pending = pool.submit(worker.post, worker.body(job, [{"op": "sleep", "seconds": 20}, {"op": "complete"}]))
        worker.log.wait_for_run(job)
        with engine.begin() as conn:  # what an API instance does: one call, no knowledge of the worker
            assert claims.request_cancel(conn, job, reason="the customer cancelled") == "cancel_requested"
        asked_at = time.monotonic()
        answer = pending.result(timeout=ANSWER_TIMEOUT_S)
    stopped_after_s = time.monotonic() - asked_at
    assert answer.json()["outcome"] == "canceled"
    # The stated bound is one heartbeat plus the grace; a cooperative runner stops well inside it.
    assert stopped_after_s < bound_s, (
        f"the cancel took {stopped_after_s:.1f} s to stop the job; the bound is SPECIALISTS_WORKER_HEARTBEAT_S + "
        f"SPECIALISTS_WORKER_CANCEL_GRACE_S, checked with {BOUND_MARGIN_FACTOR}x room ({bound_s:g} s)"
    )
    assert claim_row(engine, job)["outcome"] == "canceled"


def test_the_specialists_deadline_stops_the_job_and_fails_it(worker: TestWorker, engine: Engine) -> None:
    job = new_job_id()
    limits, deadline_s = worker.settings, 0.6
    bound_s = BOUND_MARGIN_FACTOR * (deadline_s + limits.worker.heartbeat_s + limits.worker.cancel_grace_s)
    started = time.monotonic()
    answer = worker.post(worker.body(job, [{"op": "sleep", "seconds": 20}], deadline_s=deadline_s))
    took_s = time.monotonic() - started
    assert took_s < bound_s, (
        f"the job ran {took_s:.1f} s past a deadline of {deadline_s:g} s; the bound is the deadline + "
        f"SPECIALISTS_WORKER_HEARTBEAT_S + SPECIALISTS_WORKER_CANCEL_GRACE_S, checked with {BOUND_MARGIN_FACTOR}x room"
    )
    assert answer.json()["outcome"] == "failed"
    assert "deadline of 0.6 s" in claim_row(engine, job)["outcome_detail"]["message"]


def test_a_specialist_that_ignores_cancellation_is_abandoned_after_the_grace(worker: TestWorker, engine: Engine) -> None:
    job = new_job_id()
    limits, deadline_s = worker.settings, 0.3
    bound_s = BOUND_MARGIN_FACTOR * (deadline_s + limits.worker.heartbeat_s + limits.worker.cancel_grace_s)
    started = time.monotonic()
    # The runner ignores the stop for 20 s, far beyond the bound (in a daemon thread: the test does not wait for it).
    answer = worker.post(worker.body(job, [{"op": "stubborn_sleep", "seconds": 20}], deadline_s=deadline_s))
    took_s = time.monotonic() - started
    assert took_s < bound_s, (
        f"the worker answered after {took_s:.1f} s; it must give up on a stubborn runner after the deadline + "
        f"SPECIALISTS_WORKER_CANCEL_GRACE_S (+ one SPECIALISTS_WORKER_HEARTBEAT_S), checked with {BOUND_MARGIN_FACTOR}x room"
    )
    assert answer.json()["outcome"] == "failed"
    assert "did not stop within worker_cancel_grace_s" in claim_row(engine, job)["outcome_detail"]["message"]


def test_a_crashing_or_failing_specialist_finishes_the_job_as_failed(worker: TestWorker, engine: Engine) -> None:
    crashed, failed = new_job_id(), new_job_id()
    assert worker.post(worker.body(crashed, [{"op": "raise", "text": "boom"}])).json()["outcome"] == "failed"
    answer = worker.post(worker.body(failed, [{"op": "fail", "text": "the rule does not apply"}]))
    assert answer.json()["outcome"] == "failed"
    assert claim_row(engine, failed)["outcome_detail"]["message"] == "the rule does not apply"
    assert claim_row(engine, crashed)["outcome_detail"]["detail"] == {"error": "RuntimeError"}


def test_a_full_worker_asks_for_a_retry_without_claiming(database_url: str, engine: Engine) -> None:
    with TestWorker(worker_settings(database_url, worker={"max_concurrent_jobs": 1}), engine) as single:
        busy_job, refused_job = new_job_id(), new_job_id()
        with ThreadPoolExecutor(1) as pool:
            with single.log.holding(busy_job):  # the one slot stays taken until the second delivery is answered
                pending = pool.submit(single.post, single.body(busy_job, [{"op": "complete"}]))
                single.log.wait_for_run(busy_job)
                answer = single.post(single.body(refused_job, [{"op": "complete"}]))
            assert pending.result(timeout=ANSWER_TIMEOUT_S).json()["code"] == "job_finished"
    assert answer.status_code == 503 and answer.json()["code"] == "worker_at_capacity" and "Retry-After" in answer.headers
    assert claim_row(engine, refused_job) is None


class RecordingSettlement(NoSettlement):
    """Writes settlements and unknown marks into a table, on the connection it is given."""

    def __init__(self, engine: Engine) -> None:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE IF NOT EXISTS test_settlements (job_id text, kind text, token bigint)"))

    def settle(self, conn: Connection, job, fencing_token, outcome) -> None:
        conn.execute(text("INSERT INTO test_settlements VALUES (:j, 'settle', :t)"), {"j": job.job_id, "t": fencing_token})

    def mark_unknown(self, conn: Connection, job, fencing_token, reason) -> None:
        conn.execute(text("INSERT INTO test_settlements VALUES (:j, 'unknown', :t)"), {"j": job.job_id, "t": fencing_token})


def settlements(engine: Engine, job_id: str) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT kind, token FROM test_settlements WHERE job_id = :j"), {"j": job_id})]


def test_a_finished_job_is_settled_once_whatever_the_redeliveries(database_url: str, engine: Engine) -> None:
    with TestWorker(worker_settings(database_url), engine, settlement=RecordingSettlement(engine)) as w:
        job = new_job_id()
        body = w.body(job, [{"op": "sleep", "seconds": 0.3}, {"op": "complete"}])
        with ThreadPoolExecutor(5) as pool:
            list(pool.map(lambda _: w.post(body), range(5)))
        w.post(body)
    assert settlements(engine, job) == [("settle", 1)]


def test_a_worker_that_lost_its_lease_stops_marks_the_job_unknown_and_moves_no_money(database_url: str, engine: Engine) -> None:
    with TestWorker(worker_settings(database_url), engine, settlement=RecordingSettlement(engine)) as w:
        job = new_job_id()
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(w.post, w.body(job, [{"op": "sleep", "seconds": 20}]))
            w.log.wait_for_run(job)
            with engine.begin() as conn:  # the worker stalls past its lease (a pause, a partition): simulate it
                conn.execute(text("UPDATE job_claims SET lease_expires_at = clock_timestamp() WHERE job_id = :j"), {"j": job})
            answer = pending.result(timeout=ANSWER_TIMEOUT_S)
    assert answer.json()["code"] == "job_result_stale"
    row = claim_row(engine, job)
    assert row["state"] == "unknown"
    with engine.connect() as conn:
        assert [r["worker_id"] for r in claims.list_stale_reports(conn, job)] == [w.service.worker_id]
    # The worker itself found the lease gone (its renewal, then its late finish): each marks the ledger and the
    # task unknown in its own transaction (the mark is idempotent); nothing is settled.
    assert set(settlements(engine, job)) == {("unknown", 1)}


def test_the_delivery_that_finds_an_expired_lease_marks_it_unknown_in_the_same_transaction(database_url, engine) -> None:
    job = new_job_id()
    with engine.begin() as conn:  # a worker that crashed a minute ago: its 1 s lease ran out long before now
        claims.claim(conn, job, worker_id="crashed-worker", lease_s=1, now=datetime.now(timezone.utc) - timedelta(minutes=1))
    with TestWorker(worker_settings(database_url), engine, settlement=RecordingSettlement(engine)) as w:
        body = w.body(job, [{"op": "complete"}])
        first, second = w.post(body), w.post(body)
    assert first.json()["code"] == second.json()["code"] == "job_outcome_unknown"
    assert w.log.runs(job) == 0
    assert settlements(engine, job) == [("unknown", 1)]


def test_with_oidc_on_a_delivery_needs_a_valid_cloud_tasks_token(database_url: str, engine: Engine) -> None:
    key = LocalKey("google-key")
    with CertsEndpoint([key]) as certs:
        settings = worker_settings(
            database_url,
            worker={"oidc_verify": True, "oidc_certs_url": certs.url, "audience": "https://worker.test"},
            dispatch={"service_account": SERVICE_ACCOUNT},
        )
        with TestWorker(settings, engine) as w:
            job = new_job_id()
            body = w.body(job, [{"op": "complete"}])
            missing = w.post(body)
            wrong = w.post(body, headers={"Authorization": "Bearer " + key.token(
                **cloud_tasks_claims("https://worker.test", "intruder@evil.iam.gserviceaccount.com"))})
            assert claim_row(engine, job) is None
            good = w.post(body, headers={"Authorization": "Bearer " + key.token(
                **cloud_tasks_claims("https://worker.test", SERVICE_ACCOUNT))})
    assert (missing.status_code, missing.json()["code"]) == (401, "oidc_token_missing")
    assert (wrong.status_code, wrong.json()["code"]) == (403, "oidc_wrong_service_account")
    assert good.json()["code"] == "job_finished"


class _ReadsTheClaimAsReported:
    """A job host whose runner thread reports a completed outcome, then reads the job's claim before it ends."""

    isolation = "thread"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.seen: dict[str, str] = {}

    def start(self, job, fencing_token, deadline_at, reported, ended):
        def run() -> None:
            reported(RunOutcome("completed", "done"))
            self.seen[job.job_id] = claim_row(self.engine, job.job_id)["state"]
            ended()

        threading.Thread(target=run, daemon=True).start()
        return self

    def stop(self) -> None:
        return None

    def kill(self) -> None:
        return None

    def close(self) -> None:
        return None


def test_an_outcome_is_recorded_by_the_thread_that_reports_it_before_that_thread_goes_on(
    worker: TestWorker, engine: Engine
) -> None:
    host = _ReadsTheClaimAsReported(engine)
    worker.service.jobs = host
    job = new_job_id()
    answer = worker.post(worker.body(job, []))
    assert answer.status_code == 200 and answer.json()["code"] == "job_finished", answer.text
    # Not handed to the event loop and back to another thread (issue 44: 0.5-2.4 ms of run ends -> finished).
    assert host.seen[job] == "finished"
