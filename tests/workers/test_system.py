"""The whole path as separate processes on 127.0.0.1: two API instances, two workers, dispatchers, PostgreSQL.

admission (API A or B) -> outbox -> dispatcher -> worker -> fenced task events ->
finish + settlement in one transaction; crashes by SIGKILL and by a dispatcher
that dies at a chosen point; cancel through the other API instance; forged and
replayed deliveries; Cloud Tasks through the emulator. The processes live for
the module (tests/workers/system.py), on a database of their own.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.types.a2a_pb2 import SubscribeToTaskRequest, TaskState
from sqlalchemy import text

from core.settings import Settings
from ledger import keys
from ledger.client import Ledger
from tests import commands, http_calls
from tests.conftest import TEST_SECRET
from tests.workers.conftest import QUEUE, SERVICE_ACCOUNT, WORKER_SECRET
from tests.workers.step_file import StepFile
from tests.workers.system import (
    CANCEL_GRACE_S,
    DELIVERY_LEASE_S,
    HEARTBEAT_S,
    LEASE_S,
    SCRIPTED_TARIFF,
    SWEEP_INTERVAL_S,
    System,
    system_on_its_own_database,
    script_message,
)
from taskstate import claims
from workers.auth import JobSigner
from taskstate import outbox
from workers.dispatch import jobs
from workers.dispatch.embedded import CRASH_EXIT_CODE
from workers.dispatch.pruner import Pruner

# A guard against a hang, not a bound on the product: at load 15-20 the full-worker test restarted its dispatcher
# past 120 s (each test here starts several roles); its waits on the product are its own, each named.
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

SCRIPTED = "scripted"


@pytest.fixture(scope="module")
def system(server_url: str, engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    # The session's PostgreSQL allows 100 connections and the session engine keeps its 64-thread tests'
    # connections idle in its pool: hand those back before starting eight processes.
    engine.dispose()
    with system_on_its_own_database(server_url, tmp_path_factory.mktemp("system"), workers=2,
                                    edges=("api-a", "api-b")) as running:
        yield running


@pytest.fixture
def dispatching(system: System) -> None:
    """The default dispatcher running (System.dispatching): a test that ran dispatchers of its own stopped them."""
    system.dispatching()


@pytest.fixture
def customer(system: System) -> dict[str, str]:
    return new_customer(system)


def new_customer(system: System) -> dict[str, str]:
    """A new customer entitled to the scripted specialist, with credits; the request headers."""
    customer_id = f"c-{uuid.uuid4().hex[:12]}"
    issued = keys.issue_key(system.engine, keys.KeySigner([TEST_SECRET], "test"), customer_id=customer_id,
                            ttl=timedelta(days=1))
    Ledger(system.engine).grant(customer_id, 30, operator="tests", skills=[SCRIPTED], reason="system tests")
    return {"Authorization": f"Bearer {issued.token}", "A2A-Version": "1.0", "X-Customer": customer_id}


def api(system: System, index: int) -> str:
    return system.edges[index].specialist(SCRIPTED)


def send(system: System, headers: dict, steps: list[dict], *, via: int = 0) -> str:
    answer = http_calls.post(f"{api(system, via)}/message:send", json=script_message(steps, returnImmediately=True),
                        headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["task"]["id"]


def task_of(system: System, headers: dict, task_id: str, *, via: int = 1) -> dict:
    return http_calls.get(f"{api(system, via)}/tasks/{task_id}", headers=headers).json()


def state_of(system: System, headers: dict, task_id: str, *, via: int = 1) -> str:
    return task_of(system, headers, task_id, via=via)["status"]["state"]


def reservation(system: System, task_id: str):
    return Ledger(system.engine).reservation(task_id)


def claim(system: System, job_id: str) -> dict | None:
    with system.engine.connect() as conn:
        return claims.get(conn, job_id)


def signed_body(system: System, job_id: str, *, audience: str = "specialists-worker") -> bytes:
    """A valid body for the job, as the dispatcher signs it (what a captured delivery looks like)."""
    with system.engine.connect() as conn:
        row = outbox.row_of_job(conn, job_id)
    settings = Settings(worker={"job_secrets": [WORKER_SECRET], "audience": audience})
    return jobs.build_job(row, JobSigner.from_settings(settings), settings, "http://x/jobs").body


def settlements(system: System, task_id: str) -> list[tuple[str, int]]:
    """The journal's settlement entries for the task's reservation: (kind, credits charged)."""
    with system.engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                text("SELECT kind::text, charged FROM ledger_settlements WHERE job_id = :j"), {"j": task_id}
            )
        ]


def specialists(system: System, *args: str) -> subprocess.CompletedProcess:
    env = system.env()
    env["SPECIALISTS_KEY_SIGNING_SECRETS"] = TEST_SECRET
    return commands.specialists([*args, "--json", "--operator", "ops-drill"], env)  # in this process


# --- the path --------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.usefixtures("dispatching")
async def test_a_paid_task_runs_on_a_worker_streams_through_the_other_instance_and_is_settled_once(system, customer):
    gate = f"subscribed-{uuid.uuid4().hex[:8]}"  # the job waits there until the test has subscribed
    task_id = send(system, customer, [
        {"op": "progress", "text": "reading the bundle"},
        {"op": "sleep", "seconds": 0.0, "text": f"gate:{gate}"},
        {"op": "artifact", "text": "the report"},
        {"op": "complete", "text": "all good"},
    ], via=0)
    system.wait_for("the task to work", lambda: state_of(system, customer, task_id) == "TASK_STATE_WORKING")
    assert task_of(system, customer, task_id)["status"]["message"]["parts"][0]["text"] == "reading the bundle"
    async with httpx.AsyncClient(headers={"Authorization": customer["Authorization"]}, timeout=30) as http:
        card = await A2ACardResolver(http, api(system, 1)).get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)
        seen = []
        async for event in client.subscribe(SubscribeToTaskRequest(id=task_id)):
            if not seen:  # the stream is open (its first event is the task as it stands): let the job go on
                StepFile(system.step_log).open_gate(gate)
            seen.append(event)
    artifacts = [e.artifact_update.artifact for e in seen if e.WhichOneof("payload") == "artifact_update"]
    assert [a.parts[0].text for a in artifacts] == ["the report"]
    last = seen[-1].status_update.status
    assert last.state == TaskState.TASK_STATE_COMPLETED and last.message.parts[0].text == "all good"
    job = system.job_of(task_id)
    assert len(system.runs(job)) == 1
    assert settlements(system, task_id) == [("settle", SCRIPTED_TARIFF)]
    assert reservation(system, task_id).state == "settled"


@pytest.mark.usefixtures("dispatching")
def test_a_failed_execution_is_charged_the_tariff_and_the_customer_is_told_why(system, customer):
    task_id = send(system, customer, [{"op": "fail", "text": "the rule does not apply to this bundle"}])
    system.wait_for("the task to fail", lambda: state_of(system, customer, task_id) == "TASK_STATE_FAILED")
    message = task_of(system, customer, task_id)["status"]["message"]["parts"][0]["text"]
    assert message == "the rule does not apply to this bundle"
    assert settlements(system, task_id) == [("settle", SCRIPTED_TARIFF)]


@pytest.mark.usefixtures("dispatching")
def test_the_same_job_delivered_five_times_at_once_runs_once_and_settles_once(system, customer):
    task_id = send(system, customer, [{"op": "sleep", "seconds": 0.8}, {"op": "complete", "text": "once"}])
    job = system.job_of(task_id)
    body = signed_body(system, job)
    barrier = threading.Barrier(5)

    def deliver(i: int) -> httpx.Response:
        barrier.wait()
        return system.workers[i % 2].post(body)

    with ThreadPoolExecutor(5) as pool:
        answers = [a.json()["code"] for a in pool.map(deliver, range(5))]
    system.wait_for("the task to complete", lambda: state_of(system, customer, task_id) == "TASK_STATE_COMPLETED")
    # With the dispatcher's own delivery, six arrived: one ran it, the others were told it is busy or done.
    assert set(answers) <= {"job_finished", "job_busy", "job_already_finished", "worker_at_capacity"}
    assert len(system.runs(job)) == 1
    row = claim(system, job)
    assert (row["state"], row["claims"], row["fencing_token"]) == ("finished", 1, 1)
    assert row["deliveries"] >= 5
    assert settlements(system, task_id) == [("settle", SCRIPTED_TARIFF)]


@pytest.mark.usefixtures("dispatching")
def test_any_number_of_dispatchers_share_the_outbox_and_every_job_runs_exactly_once(system, customer):
    Ledger(system.engine).grant(customer["X-Customer"], 100, operator="tests", max_parallel=32, reason="a burst")
    second = system.start_dispatcher()
    try:
        with ThreadPoolExecutor(8) as pool:
            task_ids = list(pool.map(
                lambda i: send(system, customer, [{"op": "complete", "text": f"job {i}"}], via=i % 2), range(16)))
        for task_id in task_ids:
            system.wait_for("every task to complete",
                            lambda: state_of(system, customer, task_id) == "TASK_STATE_COMPLETED")
    finally:
        second.stop()
        system.dispatchers.remove(second)
    with system.engine.connect() as conn:
        taken_by = set(conn.execute(
            text("SELECT taken_by FROM dispatch_outbox WHERE task_id = ANY(:t)"), {"t": task_ids}).scalars())
    assert all(len(system.runs(system.job_of(t))) == 1 for t in task_ids)
    assert all(settlements(system, t) == [("settle", SCRIPTED_TARIFF)] for t in task_ids)
    assert len(taken_by) >= 1  # which dispatcher took which row is the database's choice


# --- cancel, forgeries ------------------------------------------------------------------------


@pytest.mark.usefixtures("dispatching")
def test_a_cancel_through_the_other_api_instance_stops_the_running_job_within_heartbeat_and_grace(system, customer):
    task_id = send(system, customer, [{"op": "progress", "text": "working"}, {"op": "sleep", "seconds": 30},
                                      {"op": "complete", "text": "should never happen"}], via=0)
    job = system.wait_for("the job to start", lambda: system.runs(system.job_of(task_id)) and system.job_of(task_id))
    canceled = http_calls.post(f"{api(system, 1)}/tasks/{task_id}:cancel", json={}, headers=customer)
    asked_at = time.monotonic()
    assert canceled.status_code == 200 and canceled.json()["status"]["state"] == "TASK_STATE_CANCELED"
    system.wait_for("the worker to stop", lambda: (claim(system, job) or {}).get("state") == "finished",
                    interval_s=0.02)
    stopped_after_s = time.monotonic() - asked_at
    assert claim(system, job)["outcome"] == "canceled"
    # The promise is heartbeat + grace; a loaded machine may take a few times that, while a cancel that did not
    # reach the worker would let the job sleep its 30 s (or until the lease).
    bound_s = HEARTBEAT_S + CANCEL_GRACE_S
    assert stopped_after_s < 8 * bound_s, (
        f"the worker stopped {stopped_after_s:.1f} s after the cancel: SPECIALISTS_WORKER_HEARTBEAT_S + "
        f"SPECIALISTS_WORKER_CANCEL_GRACE_S = {bound_s} s, and 8 x that is the slack of a loaded machine")
    assert "complete" not in system.steps(job)
    assert state_of(system, customer, task_id, via=0) == "TASK_STATE_CANCELED"
    # It was claimed, so work started: the worker's settlement charged the tariff (docs/WORKERS.md).
    assert settlements(system, task_id) == [("settle", SCRIPTED_TARIFF)]


@pytest.mark.usefixtures("dispatching")
def test_forged_tampered_and_replayed_deliveries_are_refused_or_answered_without_running(system, customer):
    task_id = send(system, customer, [{"op": "complete", "text": "ran"}])
    system.wait_for("the task to complete", lambda: state_of(system, customer, task_id) == "TASK_STATE_COMPLETED")
    job = system.job_of(task_id)
    worker = system.live_worker()
    forged = JobSigner(["not-the-secret-" + "z" * 40], audience="specialists-worker", max_age_s=60).sign(
        job_id=f"{uuid.uuid4()}.1", specialist_id=SCRIPTED, deadline_s=5)
    assert (worker.post(forged).status_code, worker.post(forged).json()["code"]) == (401, "job_body_unknown_secret")
    body = signed_body(system, job)
    tampered = body[:-4] + (b"AAAA" if not body.endswith(b"AAAA") else b"BBBB")
    assert worker.post(tampered).json()["code"] == "job_body_tampered"
    elsewhere = signed_body(system, job, audience="another-deployment")
    assert (worker.post(elsewhere).status_code, worker.post(elsewhere).json()["code"]) == (403, "job_body_wrong_audience")
    replayed = worker.post(body)
    assert (replayed.status_code, replayed.json()["code"]) == (200, "job_already_finished")
    assert len(system.runs(job)) == 1
    assert settlements(system, task_id) == [("settle", SCRIPTED_TARIFF)]


@pytest.mark.usefixtures("dispatching")
def test_a_finished_job_pruned_past_its_retention_and_delivered_again_runs_nothing_and_moves_nothing(
        system, customer):
    task_id = send(system, customer, [{"op": "complete", "text": "ran once"}])
    system.wait_for("the task to complete", lambda: state_of(system, customer, task_id) == "TASK_STATE_COMPLETED")
    job = system.job_of(task_id)
    late = signed_body(system, job)  # a delivery Cloud Tasks still holds, valid for SPECIALISTS_WORKER_JOB_MAX_AGE_S
    with system.engine.begin() as conn:  # the retentions pass: the job finished 40 days ago, as the pruner's cut sees it
        conn.execute(text("UPDATE dispatch_outbox SET finished_at = finished_at - interval '40 days' "
                          "WHERE task_id = :t"), {"t": task_id})
        conn.execute(text("UPDATE job_claims SET finished_at = finished_at - interval '40 days' WHERE job_id = :j"),
                     {"j": job})
    pruner = Pruner(system.engine, Settings())  # the dispatcher's rounds, with the default retentions
    while any(pruner.round().values()):
        pass
    assert claim(system, job) is None
    with system.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM dispatch_outbox WHERE task_id = :t"), {"t": task_id}).scalar() == 0

    answer = system.live_worker().post(late)
    assert (answer.status_code, answer.json()["code"]) == (200, "job_gone")  # 200: the queue stops delivering it
    assert len(system.runs(job)) == 1
    assert claim(system, job) is None  # nothing was claimed
    assert settlements(system, task_id) == [("settle", SCRIPTED_TARIFF)]
    assert reservation(system, task_id).state == "settled"
    assert state_of(system, customer, task_id) == "TASK_STATE_COMPLETED"
    assert list(Ledger(system.engine).verify(customer["X-Customer"])) == []


# --- crashes ----------------------------------------------------------------------------------

# How long a dispatcher started to crash may take to start and reach its crash point: a guard for a loaded machine
# (its start-up alone took over 30 s at load 23), not a promise.
CRASH_GUARD_S = 240.0


def test_a_dispatcher_killed_after_committing_its_take_and_before_delivering_loses_nothing(system, customer):
    system.stop_dispatchers()
    try:
        task_id = send(system, customer, [{"op": "complete", "text": "after the crash"}])
        doomed = system.start_dispatcher(wait=False, dispatch_crash_point="before_enqueue")
        assert doomed.process.wait(CRASH_GUARD_S) == CRASH_EXIT_CODE
        system.dispatchers.remove(doomed)
        job = system.job_of(task_id)
        with system.engine.connect() as conn:
            row = conn.execute(text("SELECT status, attempts FROM dispatch_outbox WHERE task_id = :t"),
                               {"t": task_id}).one()
        assert (row.status, row.attempts) == ("pending", 1)  # taken, never handed over
        assert system.runs(job) == [] and state_of(system, customer, task_id) == "TASK_STATE_SUBMITTED"
        started = time.monotonic()
        system.start_dispatcher()
        system.wait_for("the job to be done", lambda: state_of(system, customer, task_id) == "TASK_STATE_COMPLETED")
        assert time.monotonic() - started >= DELIVERY_LEASE_S - 1.5  # the dead dispatcher's lease had to pass
        with system.engine.connect() as conn:
            row = conn.execute(text("SELECT status, attempts FROM dispatch_outbox WHERE task_id = :t"),
                               {"t": task_id}).one()
        assert (row.status, row.attempts) == ("done", 2)
        assert len(system.runs(job)) == 1
        assert settlements(system, task_id) == [("settle", SCRIPTED_TARIFF)]
    except BaseException:
        system.stop_dispatchers()  # the doomed one may still run; on success the default one it started is left
        raise


@pytest.mark.usefixtures("dispatching")
def test_a_worker_killed_mid_job_stays_unknown_until_an_operator_reconciles_it(system, customer):
    try:
        killed_mid_job_then_reconciled(system, customer)
    finally:
        system.replace_dead_workers(restart_dispatchers=False)  # later tests get a full set again


def killed_mid_job_then_reconciled(system: System, customer: dict) -> None:
    task_id = send(system, customer, [{"op": "progress", "text": "started"}, {"op": "sleep", "seconds": 60},
                                      {"op": "complete"}])
    job = system.wait_for("the job to start", lambda: system.runs(system.job_of(task_id)) and system.job_of(task_id))
    [pid] = system.runs(job)
    doomed = next(w for w in system.workers if str(w.process.pid) == pid)
    survivor = next(w for w in system.workers if w is not doomed)
    doomed.kill()
    assert reservation(system, task_id).state == "open"  # held: nobody knows yet what happened

    system.wait_for("the lease to expire into unknown",
                    lambda: (claim(system, job) or {}).get("state") == "unknown",
                    timeout_s=LEASE_S + SWEEP_INTERVAL_S + 10)
    assert reservation(system, task_id).state == "unknown"
    seen = task_of(system, customer, task_id)
    assert seen["status"]["state"] == "TASK_STATE_WORKING"
    assert "under reconciliation" in seen["status"]["message"]["parts"][0]["text"]
    later = survivor.post(signed_body(system, job))  # a later delivery does not run it
    assert (later.status_code, later.json()["code"]) == (200, "job_outcome_unknown")
    assert system.runs(job) == [pid]
    cancel = http_calls.post(f"{api(system, 0)}/tasks/{task_id}:cancel", json={}, headers=customer)
    assert "under reconciliation" in cancel.json()["error"]["message"]
    assert state_of(system, customer, task_id) == "TASK_STATE_WORKING"

    listed = specialists(system, "reservations", "list", "--unknown", "--customer", customer["X-Customer"])
    assert [r["job_id"] for r in json.loads(listed.stdout)["reservations"]] == [task_id]
    done = specialists(system, "reconcile", task_id, "--charged", "1", "--state", "failed",
                       "--reason", "drill: the worker was killed; provider log shows no answer")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert (record["outcome"], record["charged"], record["task_state"], record["jobs_resolved"]) == (
        "reconciled", 1, "failed", [job])
    # Beside the operator's charge, what the charge rule gives a failed run: the whole reservation (fixed pricing).
    assert record["rule_credits"] == SCRIPTED_TARIFF
    assert state_of(system, customer, task_id) == "TASK_STATE_FAILED"
    assert claim(system, job)["state"] == "finished" and claim(system, job)["outcome"] == "failed"
    verify = specialists(system, "ledger", "verify")
    assert verify.returncode == 0 and json.loads(verify.stdout)["clean"] is True


def test_a_killed_workers_job_is_decided_by_its_beat_before_its_lease_passes(system, customer):
    # A lease longer than the test may take: only the dead worker's beat can decide its job (issue 44 §4).
    lease_s = 600
    beats = {"worker_beat_s": "0.2", "worker_dead_after_beats": "3"}  # the worker's and the sweeper's, as deployed
    system.stop_dispatchers()
    doomed = system.start_worker(worker_lease_s=str(lease_s), **beats)
    try:
        system.start_dispatcher(worker_urls=[doomed.url], **beats)
        task_id = send(system, customer, [{"op": "progress", "text": "started"}, {"op": "sleep", "seconds": 60},
                                          {"op": "complete"}])
        job = system.wait_for("the job to start", lambda: system.runs(system.job_of(task_id)) and system.job_of(task_id))
        doomed.kill()
        system.wait_for("the sweeper to record the dead worker's job unknown",
                        lambda: (claim(system, job) or {}).get("state") == "unknown", timeout_s=60)
        row = claim(system, job)
        assert "stopped beating" in row["unknown_reason"] and row["claims"] == 1
        assert row["unknown_at"] < row["claimed_at"] + timedelta(seconds=lease_s)  # its lease had not passed
        assert reservation(system, task_id).state == "unknown"  # held for an operator: it may have run
        seen = task_of(system, customer, task_id)
        assert seen["status"]["state"] == "TASK_STATE_WORKING"
        assert "under reconciliation" in seen["status"]["message"]["parts"][0]["text"]
        survivor = next(w for w in system.workers if w is not doomed and w.process.poll() is None)
        later = survivor.post(signed_body(system, job))  # at most once: no later delivery runs it
        assert (later.status_code, later.json()["code"]) == (200, "job_outcome_unknown")
        assert system.runs(job) == [str(doomed.process.pid)]
    finally:
        system.stop_dispatchers()
        system.workers.remove(doomed)


def test_a_job_a_dead_worker_did_not_take_goes_to_a_live_one_without_an_attempt_or_a_backoff(system, customer):
    # The dead worker's URL comes first, so the first delivery meets it (connection refused, as while a killed
    # worker restarts); the job goes back as it was and the live worker runs it: one counted attempt (issue 44 §4).
    system.stop_dispatchers()
    try:
        dispatcher = system.start_dispatcher(worker_urls=["http://127.0.0.1:9/jobs", system.live_worker().url])
        task_id = send(system, customer, [{"op": "complete", "text": "on the live worker"}])
        system.wait_for("the task to complete", lambda: state_of(system, customer, task_id) == "TASK_STATE_COMPLETED")
        job = system.job_of(task_id)
        assert f"job {job}: the worker did not take it" in dispatcher.log_text()  # it did meet the dead one first
        with system.engine.connect() as conn:
            attempts = conn.execute(text("SELECT attempts FROM dispatch_outbox WHERE task_id = :t"),
                                    {"t": task_id}).scalar_one()
        assert attempts == 1 and len(system.runs(job)) == 1
        assert settlements(system, task_id) == [("settle", SCRIPTED_TARIFF)]
    finally:
        system.stop_dispatchers()


def test_a_job_no_worker_can_take_is_failed_as_undeliverable_and_charged_nothing(system, customer):
    system.stop_dispatchers()
    try:
        system.start_dispatcher(worker_urls=["http://127.0.0.1:9/jobs"], dispatch_max_attempts="2")
        task_id = send(system, customer, [{"op": "complete"}])
        system.wait_for("the task to fail", lambda: state_of(system, customer, task_id) == "TASK_STATE_FAILED")
        message = task_of(system, customer, task_id)["status"]["message"]["parts"][0]["text"]
        assert "no worker accepted this task after 2 attempts" in message
        assert settlements(system, task_id) == [("void", 0)] or reservation(system, task_id).state == "voided"
        assert claim(system, system.job_of(task_id))["outcome"] == "failed"  # a late delivery would not run it
    finally:
        system.stop_dispatchers()


def test_a_worker_full_with_another_dispatchers_job_delays_a_job_without_giving_it_up(system, customer):
    # Two dispatchers share a one-slot worker: each believes the slot is free, so one of them delivers into a
    # full worker and is answered worker_at_capacity. That is a reason to wait for the Retry-After, not a failed
    # attempt: with dispatch_max_attempts=2 the job used to be given up as undeliverable on its second such answer.
    system.stop_dispatchers()
    one_slot = system.start_worker(worker_max_concurrent_jobs="1")
    try:
        starting = [system.start_dispatcher(worker_urls=[one_slot.url], dispatch_max_attempts="2", wait=False)
                    for _ in range(2)]
        for dispatcher in starting:
            dispatcher.role.wait_ready()
        long_task = send(system, customer, [{"op": "sleep", "seconds": 60}, {"op": "complete", "text": "long"}])
        system.wait_for("the long job to start", lambda: system.runs(system.job_of(long_task)))
        short_task = send(system, customer, [{"op": "complete", "text": "short"}])

        def last_error() -> str:
            with system.engine.connect() as conn:
                return conn.execute(text("SELECT last_error FROM dispatch_outbox WHERE task_id = :t"),
                                    {"t": short_task}).scalar_one() or ""

        # The long job holds the slot until it is canceled, so the short one meets the full worker again and again.
        short_job = system.job_of(short_task)

        def times_full() -> int:
            return sum(d.log_text().count(f"job {short_job}: the worker is full") for d in system.dispatchers)

        system.wait_for("the short job to meet the full worker twice", lambda: times_full() >= 2
                        or state_of(system, customer, short_task) != "TASK_STATE_SUBMITTED", timeout_s=30)
        assert "worker_at_capacity" in last_error()
        assert state_of(system, customer, short_task) == "TASK_STATE_SUBMITTED"  # waiting, not given up
        canceled = http_calls.post(f"{api(system, 0)}/tasks/{long_task}:cancel", json={}, headers=customer)
        assert canceled.status_code == 200, canceled.text
        system.wait_for("the short task to complete once the slot is free",
                        lambda: state_of(system, customer, short_task) == "TASK_STATE_COMPLETED", timeout_s=30)
    finally:
        system.stop_dispatchers()
        one_slot.stop()
        system.workers.remove(one_slot)
    assert [len(system.runs(system.job_of(t))) for t in (long_task, short_task)] == [1, 1]
    assert settlements(system, short_task) == [("settle", SCRIPTED_TARIFF)]


def test_with_one_customers_eight_jobs_queued_a_second_customers_job_is_the_next_one_started(system, customer):
    # Issue 41: a one-slot worker; one customer's eight long jobs, within its cap, hold the slot and queue seven.
    # When the slot frees, the next job started is the second customer's, not the first customer's next one.
    second = new_customer(system)
    system.stop_dispatchers()
    one_slot = system.start_worker(worker_max_concurrent_jobs="1")
    flood: list[str] = []
    try:
        # The dispatcher knows the worker's one slot: one that believed in more would race its own deliveries into
        # the worker, and the first to arrive when the slot frees would win, whatever the order of its takes.
        system.start_dispatcher(worker_urls=[one_slot.url], worker_max_concurrent_jobs="1")
        flood = [send(system, customer, [{"op": "sleep", "seconds": 60}, {"op": "complete", "text": "long"}])
                 for _ in range(8)]
        running = system.wait_for("one of the flood's jobs to start",
                                  lambda: next((t for t in flood if system.runs(system.job_of(t))), None))
        victim = send(system, second, [{"op": "complete", "text": "short"}])
        canceled = http_calls.post(f"{api(system, 0)}/tasks/{running}:cancel", json={}, headers=customer)
        assert canceled.status_code == 200, canceled.text
        system.wait_for("the second customer's task to complete",
                        lambda: state_of(system, second, victim) == "TASK_STATE_COMPLETED", timeout_s=60)
        ours = {system.job_of(t) for t in [*flood, victim]}  # one read each, not one per line of the step log
        starts = [line.split()[1] for line in system.step_log.read_text().splitlines() if line.split()[2] == "0"]
        jobs_started = [job for job in starts if job in ours]
        assert jobs_started[:2] == [system.job_of(running), system.job_of(victim)], jobs_started
    finally:
        for task_id in flood:
            http_calls.post(f"{api(system, 0)}/tasks/{task_id}:cancel", json={}, headers=customer)
        system.stop_dispatchers()
        one_slot.stop()
        system.workers.remove(one_slot)



def test_a_job_cloud_tasks_stopped_delivering_is_failed_and_voided_once_no_delivery_can_run_it(system, customer):
    from workers.dispatch.sweeper import LeaseSweeper
    from workers.settlement import TaskSettlement
    from taskstate.updates import TaskEvents

    system.stop_dispatchers()  # no dispatcher may deliver these rows: the test plays the queue
    task_id = send(system, customer, [{"op": "complete", "text": "must never run"}])
    running = send(system, customer, [{"op": "complete"}])
    job = system.job_of(task_id)
    # What the relay leaves once the queue dropped the task: handed over, never claimed. The other job was
    # handed over as long ago but claimed: it is the claim's to finish, not the sweeper's.
    with system.engine.begin() as conn:
        conn.execute(text("UPDATE dispatch_outbox SET status = 'sent', sent_at = now() - interval '2 hours', "
                          "attempts = 1 WHERE task_id = ANY(:t)"), {"t": [task_id, running]})
        claims.claim(conn, system.job_of(running), worker_id="elsewhere", lease_s=60)
    settings = Settings()
    sweeper = LeaseSweeper(system.engine, TaskSettlement(TaskEvents(system.engine), operator="test"),
                           abandoned_after_s=settings.worker.job_max_age_s + settings.dispatch.deadline_s)
    assert sweeper.give_up_abandoned() == [job]
    assert sweeper.give_up_abandoned() == []  # once
    seen = task_of(system, customer, task_id)
    assert seen["status"]["state"] == "TASK_STATE_FAILED"
    assert "the queue stopped delivering it" in seen["status"]["message"]["parts"][0]["text"]
    assert reservation(system, task_id).state == "voided" and reservation(system, task_id).charged == 0
    late = system.live_worker().post(signed_body(system, job))  # the queue delivers after all: not run
    assert (late.status_code, late.json()["code"]) == (200, "job_already_finished")
    assert system.runs(job) == []
    assert state_of(system, customer, running) == "TASK_STATE_SUBMITTED"
    assert reservation(system, running).state == "open"


# --- Cloud Tasks -------------------------------------------------------------------------------


def cloud_tasks_relay(system: System, emulator, **overrides: str):
    project, location, queue = QUEUE.split("/")[1::2]
    return system.start_dispatcher(
        worker_urls=[system.live_worker().url],
        dispatch_backend="cloud_tasks",
        cloud_tasks_project=project,
        cloud_tasks_location=location,
        cloud_tasks_queue=queue,
        cloud_tasks_emulator_host=emulator.host,
        dispatch_service_account=SERVICE_ACCOUNT,
        **overrides,
    )


def test_the_cloud_tasks_path_end_to_end_through_the_emulator(system, customer, emulator):
    system.stop_dispatchers()
    try:
        cloud_tasks_relay(system, emulator)
        task_id = send(system, customer, [{"op": "progress", "text": "via the queue"},
                                          {"op": "complete", "text": "via cloud tasks"}])
        system.wait_for("the task to complete", lambda: state_of(system, customer, task_id) == "TASK_STATE_COMPLETED",
                        timeout_s=30)
        with system.engine.connect() as conn:
            row = conn.execute(text("SELECT status, sent_at FROM dispatch_outbox WHERE task_id = :t"),
                               {"t": task_id}).one()
        assert row.status == "done" and row.sent_at is not None  # relayed (sent), then settled by the worker
        assert task_of(system, customer, task_id)["status"]["message"]["parts"][0]["text"] == "via cloud tasks"
        assert len(system.runs(system.job_of(task_id))) == 1
        assert settlements(system, task_id) == [("settle", SCRIPTED_TARIFF)]
    finally:
        system.stop_dispatchers()


def test_a_relay_killed_after_enqueueing_and_before_recording_it_enqueues_again_and_the_job_runs_once(
    system, customer, emulator
):
    system.stop_dispatchers()
    try:
        task_id = send(system, customer, [{"op": "complete", "text": "once"}])
        job = system.job_of(task_id)
        # Hold the first delivery at its claim (an uncommitted claim row of ours) until the relay has
        # enqueued the job a second time: otherwise it would finish and close the row first.
        with system.engine.connect() as gate:
            gate.execute(text("INSERT INTO job_claims (job_id, state, fencing_token, claims) "
                              "VALUES (:j, 'released', 0, 0)"), {"j": job})
            doomed = cloud_tasks_relay(system, emulator, dispatch_crash_point="after_enqueue")
            assert doomed.process.wait(CRASH_GUARD_S) == CRASH_EXIT_CODE
            system.dispatchers.remove(doomed)
            with system.engine.connect() as conn:  # its transaction died with it: the row was never marked sent
                assert conn.execute(text("SELECT status FROM dispatch_outbox WHERE task_id = :t"),
                                    {"t": task_id}).scalar() == "pending"
            cloud_tasks_relay(system, emulator)  # enqueues the same task name again

            def sent_at() -> object:
                with system.engine.connect() as conn:
                    return conn.execute(text("SELECT sent_at FROM dispatch_outbox WHERE task_id = :t"),
                                        {"t": task_id}).scalar()

            system.wait_for("the second enqueue", sent_at)
            gate.rollback()
        # Whether the emulator then delivers the duplicate too is its own business (real Cloud Tasks answers
        # ALREADY_EXISTS); what must hold is that the job ran once and settled once.
        system.wait_for("the job to complete", lambda: state_of(system, customer, task_id) == "TASK_STATE_COMPLETED",
                        timeout_s=45, explain=lambda: f"task {state_of(system, customer, task_id)}, claim {claim(system, job)}")
        assert len(system.runs(job)) == 1 and claim(system, job)["claims"] == 1
        assert settlements(system, task_id) == [("settle", SCRIPTED_TARIFF)]
    finally:
        system.stop_dispatchers()
