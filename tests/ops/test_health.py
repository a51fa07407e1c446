"""`specialists health` (ops.health, issue 20): each specialist's readiness as a worker judges it, the queue and its
oldest job, the workers seen recently with what they run, and the last drill recorded; exit 1 when a specialist is
not ready. Against the test database and the shipped specs."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from a2a.types.a2a_pb2 import TaskState
from sqlalchemy import text

from core.settings import Settings
from ops.drill import record
from ops.health import health
from taskstate import claims, liveness
from tests.ops.test_operator_cli import cli
from tests.taskstate.test_reads import admitted

pytestmark = pytest.mark.timeout(60)

CHECKPOINT_KEY = "k" * 48


# The session's database holds other tests' jobs and notifications, queued for as long as the session runs: these
# tests judge readiness and liveness, so the bounds on waiting are their longest.
PATIENT = {"max_job_wait_s": 7 * 86_400.0, "max_push_wait_s": 7 * 86_400.0}
PATIENT_ENV = {"SPECIALISTS_HEALTH_MAX_JOB_WAIT_S": "604800", "SPECIALISTS_HEALTH_MAX_PUSH_WAIT_S": "604800"}


def ready_settings(database_url: str, **worker) -> Settings:
    """Settings a worker here would serve every shipped specialist with: a checkpoint key, the scripted routes."""
    return Settings(database={"url": database_url},
                    hosted={"checkpoint_key": CHECKPOINT_KEY, "model_routes_allow_scripted": True},
                    worker=worker or {}, health=PATIENT)


SHIPPED = ["analyst", "conformance", "drill", "reviewer"]


def beating(engine, specialists: list[str] = SHIPPED) -> str:
    """A live worker's beat serving ``specialists``, as a worker writes it (``workers.beat``)."""
    worker = f"worker-{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        liveness.beat(conn, worker, specialists)
    return worker


def test_health_lists_every_specialist_ready_and_says_why_one_is_not(database_url, engine):
    beating(engine)
    ready = health(ready_settings(database_url), engine)
    assert {s.specialist_id for s in ready.specialists} == {"analyst", "conformance", "drill", "reviewer"}
    assert ready.ready and all(s.spec_loaded and s.route_configured and s.problem is None for s in ready.specialists)
    assert {s.specialist_id: s.skill for s in ready.specialists}["reviewer"] == "review"

    keyless = health(Settings(database={"url": database_url}, hosted={"model_routes_allow_scripted": True},
                              health=PATIENT), engine)
    not_ready = {s.specialist_id: s.problem for s in keyless.specialists if not s.ready}
    assert set(not_ready) == {"analyst", "reviewer"}  # the rlm specialists: no key signs their checkpoints
    assert all("SPECIALISTS_SPECIALIST_CHECKPOINT_KEY" in problem for problem in not_ready.values())
    assert not keyless.ready and keyless.as_record()["ready"] is False


def test_health_shows_the_queue_the_workers_seen_and_the_last_drill(database_url, engine):
    specialist, worker = f"health-{uuid.uuid4().hex[:8]}", f"worker-{uuid.uuid4().hex[:8]}"
    now = datetime.now(timezone.utc)
    admitted(engine, customer=None, specialist=specialist, at=now, state=TaskState.TASK_STATE_SUBMITTED)
    _, running = admitted(engine, customer=None, specialist=specialist, at=now, state=TaskState.TASK_STATE_WORKING)
    _, done = admitted(engine, customer=None, specialist=specialist, at=now, state=TaskState.TASK_STATE_WORKING)
    with engine.begin() as conn:
        claims.claim(conn, running, worker_id=worker, lease_s=300)
        finished = claims.claim(conn, done, worker_id=worker, lease_s=300)
        claims.finish(conn, done, fencing_token=finished.fencing_token, outcome="completed", detail=None,
                      worker_id=worker)
    started = datetime.now(timezone.utc)
    run = record.DrillRun(
        run_id=uuid.uuid4().hex[:12], target="https://staging.example", operator="ops", started_at=started,
        finished_at=started + timedelta(seconds=90), verdict="fail",
        scenarios=(record.outcome_of("refusal", "pass", 3.2, ["a", "every refusal coded"]),
                   record.outcome_of("settlement", "fail", 1.0, ["x" * 2000])),
    )
    record.record_run(engine, run)

    found = health(ready_settings(database_url), engine)
    mine = [q for q in found.queue if q.specialist_id == specialist]
    assert [(q.queued, q.oldest_age_s >= 0) for q in mine] == [(1, True)]  # the running and the finished are taken
    seen = [w for w in found.workers if w.worker_id == worker]
    assert [(w.running_jobs, w.last_seen_at >= now - timedelta(seconds=5)) for w in seen] == [(1, True)]
    assert found.last_drill == run
    assert found.last_drill.scenarios[1].evidence == "x" * record.MAX_EVIDENCE_CHARS  # clipped, not refused
    as_json = json.loads(json.dumps(found.as_record(), default=str))
    assert as_json["last_drill"]["verdict"] == "fail" and as_json["queue"]["queued"] >= 1

    # A worker is seen only within the window: one whose last claim is older is left out.
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_claims SET claimed_at = claimed_at - interval '1 hour', "
                          "finished_at = finished_at - interval '1 hour', renewed_at = NULL WHERE job_id = :j"),
                     {"j": done})
    narrow = health(ready_settings(database_url, seen_window_s=1800.0), engine)
    assert [w.running_jobs for w in narrow.workers if w.worker_id == worker] == [1]


def test_specialists_health_exits_1_when_a_specialist_is_not_ready(service_env, engine):
    at = datetime.now(timezone.utc) + timedelta(days=1)  # the newest run recorded
    record.record_run(engine, record.DrillRun(uuid.uuid4().hex[:12], "local, embedded dispatch", "ops", at, at, "pass",
                                              (record.outcome_of("refusal", "pass", 1.0, ["ok"]),)))
    service_env = service_env | PATIENT_ENV
    not_ready = cli(service_env, "health", "--json")
    assert not_ready.returncode == 1, not_ready.stderr
    report = json.loads(not_ready.stdout)
    assert report["ready"] is False and {s["specialist_id"] for s in report["specialists"] if not s["ready"]} == {
        "analyst", "reviewer"}
    beating(engine)
    ready_env = service_env | {"SPECIALISTS_SPECIALIST_CHECKPOINT_KEY": CHECKPOINT_KEY,
                               "SPECIALISTS_MODEL_ROUTES_ALLOW_SCRIPTED": "true"}
    table = cli(ready_env, "health")
    assert table.returncode == 0, table.stdout + table.stderr
    assert "workers seen in the last 600 s" in table.stdout and "the last drill" in table.stdout
    assert "refusal pass" in table.stdout
