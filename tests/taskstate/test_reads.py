"""The operator's reads of admitted tasks (taskstate.reads, issue 20) against real PostgreSQL: tasks by outcome per
day, a customer's newest tasks with what they reserved and were charged, and the queue of jobs no worker took.

The tasks are written as the service leaves them: the task row (``rows.insert_new``), the edge's record, an outbox
row per job (``outbox.enqueue``), claims through the claim functions, and the money through the ledger."""

from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from a2a.types.a2a_pb2 import Task, TaskState, TaskStatus
from sqlalchemy import Engine, text

from ledger.client import Ledger
from ledger.errors import LedgerInputInvalid
from taskstate import claims, outbox, reads, rows
from tests.ledger.conftest import new_customer

pytestmark = pytest.mark.timeout(60)


def far_day() -> datetime:
    """Midnight UTC of a day no other test admits a task on."""
    return datetime(2100, 1, 1, tzinfo=timezone.utc) + timedelta(days=random.randrange(300_000))


def admitted(engine: Engine, *, customer: str | None, specialist: str, at: datetime, state: int, credits: int = 0,
             ledger: Ledger | None = None) -> tuple[str, str]:
    """A task admitted at ``at`` with one job: (task id, job id). With ``credits`` its reservation is held."""
    task_id = str(uuid.uuid4())
    if credits:
        assert ledger is not None and customer is not None
        assert ledger.reserve(customer, task_id, "fp", specialist, credits).outcome == "created"
    task = Task(id=task_id, context_id=str(uuid.uuid4()), status=TaskStatus(state=state))
    task.status.timestamp.FromDatetime(at.replace(tzinfo=None))
    with engine.begin() as conn:
        rows.insert_new(conn, task, "owner")
        conn.execute(text("INSERT INTO edge_tasks (task_id, customer_id, specialist_id, skill_id, owner, "
                          "tariff_credits, reservation_id, admitted_at) VALUES (:t, :c, :s, :s, 'owner', :n, :r, :a)"),
                     {"t": task_id, "c": customer, "s": specialist, "n": credits, "r": task_id if credits else None,
                      "a": at})
        outbox.enqueue(conn, task_id=task_id, specialist_id=specialist, executor="drill", owner="owner",
                       context_id=task.context_id, message=b"")
        dispatch_id = outbox.open_dispatch_ids(conn, task_id, "owner")[0]
    return task_id, f"{task_id}.{dispatch_id}"


def ran(engine: Engine, job_id: str, worker: str, outcome: str | None) -> None:
    """A worker claimed the job and, with ``outcome``, finished it; without, its lease ran out: unknown."""
    with engine.begin() as conn:
        claimed = claims.claim(conn, job_id, worker_id=worker, lease_s=30)
        if outcome is None:
            assert claims.expire_lease(conn, job_id, now=datetime.now(timezone.utc) + timedelta(minutes=1))[0]
        else:
            assert claims.finish(conn, job_id, fencing_token=claimed.fencing_token, outcome=outcome, detail=None,
                                 worker_id=worker).accepted


@pytest.fixture
def customer(ledger) -> str:
    customer = new_customer("tasks")
    ledger.open_account(customer, operator="ops", max_parallel=20)
    ledger.grant(customer, 100, operator="ops", skills=["reviewer"], require_customer=True)
    return customer


@pytest.fixture
def ledger(engine) -> Ledger:
    return Ledger(engine)


def test_tasks_by_outcome_counts_each_days_tasks_by_specialist_and_state_and_unknown_wins(engine, ledger, customer):
    day = far_day()
    done, done_job = admitted(engine, customer=customer, specialist="reviewer", at=day + timedelta(hours=1),
                              state=TaskState.TASK_STATE_WORKING, credits=10, ledger=ledger)
    ran(engine, done_job, "w-1", "completed")
    with engine.begin() as conn:  # the task's final state, as the finish writes it
        conn.execute(text("UPDATE tasks SET status = CAST(:s AS json) WHERE id = :t"),
                     {"s": '{"state": "TASK_STATE_COMPLETED"}', "t": done})
    lost, lost_job = admitted(engine, customer=customer, specialist="reviewer", at=day + timedelta(hours=2),
                              state=TaskState.TASK_STATE_WORKING, credits=10, ledger=ledger)
    ran(engine, lost_job, "w-1", None)  # its A2A state stays working; its job is unknown
    admitted(engine, customer=customer, specialist="reviewer", at=day + timedelta(days=1),
             state=TaskState.TASK_STATE_FAILED, credits=10, ledger=ledger)
    admitted(engine, customer=None, specialist="drill", at=day + timedelta(hours=3), state=TaskState.TASK_STATE_SUBMITTED)
    admitted(engine, customer=customer, specialist="reviewer", at=day + timedelta(days=2),
             state=TaskState.TASK_STATE_FAILED, credits=10, ledger=ledger)  # at `until`: outside

    with engine.connect() as conn:
        everyone = reads.tasks_by_outcome(conn, since=day, until=day + timedelta(days=2))
        theirs = reads.tasks_by_outcome(conn, since=day, until=day + timedelta(days=2), customer_id=customer)
    d0, d1 = day.date(), (day + timedelta(days=1)).date()
    assert everyone == [
        {"day": d0, "specialist_id": "drill", "state": "submitted", "tasks": 1},
        {"day": d0, "specialist_id": "reviewer", "state": "completed", "tasks": 1},
        {"day": d0, "specialist_id": "reviewer", "state": "unknown", "tasks": 1},
        {"day": d1, "specialist_id": "reviewer", "state": "failed", "tasks": 1},
    ]
    assert theirs == [row for row in everyone if row["specialist_id"] == "reviewer"]


def test_a_period_of_tasks_is_bounded_and_ids_are_checked(engine):
    day = far_day()
    with engine.connect() as conn:
        with pytest.raises(LedgerInputInvalid, match="SPECIALISTS_LEDGER_MAX_USAGE_DAYS"):
            reads.tasks_by_outcome(conn, since=day, until=day + timedelta(days=400))
        with pytest.raises(LedgerInputInvalid, match="ends after it starts"):
            reads.tasks_by_outcome(conn, since=day, until=day - timedelta(days=1))
        with pytest.raises(LedgerInputInvalid, match="is not valid"):
            reads.customer_tasks(conn, "BAD NAME", limit=10)
        with pytest.raises(LedgerInputInvalid):
            reads.customer_tasks(conn, "someone", limit=0)


def test_a_customers_tasks_are_newest_first_with_their_money_and_jobs(engine, ledger, customer):
    now = datetime.now(timezone.utc)
    settled_task, settled_job = admitted(engine, customer=customer, specialist="reviewer", at=now - timedelta(hours=3),
                                         state=TaskState.TASK_STATE_COMPLETED, credits=10, ledger=ledger)
    ran(engine, settled_job, "w-2", "completed")
    ledger.settle(settled_task, 7, "done")
    open_task, _ = admitted(engine, customer=customer, specialist="reviewer", at=now - timedelta(hours=2),
                            state=TaskState.TASK_STATE_WORKING, credits=10, ledger=ledger)
    free_task, free_job = admitted(engine, customer=customer, specialist="drill", at=now - timedelta(hours=1),
                                   state=TaskState.TASK_STATE_SUBMITTED)

    with engine.connect() as conn:
        shown = reads.customer_tasks(conn, customer, limit=10)
        newest = reads.customer_tasks(conn, customer, limit=2)
    assert [(t["task_id"], t["specialist_id"], t["state"], t["reserved_credits"], t["charged_credits"])
            for t in shown] == [
        (free_task, "drill", "submitted", None, None),
        (open_task, "reviewer", "working", 10, None),
        (settled_task, "reviewer", "completed", 10, 7),
    ]
    assert shown[0]["job_ids"] == [free_job] and shown[2]["job_ids"] == [settled_job]
    assert shown[2]["created_at"] == now - timedelta(hours=3)
    assert shown[0]["updated_at"].tzinfo is not None
    assert newest == shown[:2]


def test_the_queue_counts_the_jobs_no_worker_took_and_when_the_oldest_was_queued(engine):
    specialist = f"queue-{uuid.uuid4().hex[:8]}"
    now = datetime.now(timezone.utc)
    _, taken = admitted(engine, customer=None, specialist=specialist, at=now - timedelta(minutes=9),
                        state=TaskState.TASK_STATE_WORKING)
    ran(engine, taken, "w-3", None)  # claimed (then unknown): not queued, though admitted first
    _, waiting = admitted(engine, customer=None, specialist=specialist, at=now - timedelta(minutes=5),
                          state=TaskState.TASK_STATE_SUBMITTED)
    admitted(engine, customer=None, specialist=specialist, at=now, state=TaskState.TASK_STATE_SUBMITTED)
    with engine.begin() as conn:  # a claim given back before any work is waiting again
        claimed = claims.claim(conn, waiting, worker_id="w-3", lease_s=30)
        assert claims.release(conn, waiting, fencing_token=claimed.fencing_token)
        # A dispatcher tried it once (the worker was unreachable): it waits to be delivered again.
        conn.execute(text("UPDATE dispatch_outbox SET attempts = 1 WHERE task_id = :t"), {"t": waiting.split(".")[0]})
    with engine.connect() as conn:
        mine = [q for q in reads.queue(conn) if q["specialist_id"] == specialist]
        created = conn.execute(text("SELECT min(created_at) FROM dispatch_outbox WHERE specialist_id = :s "
                                    "AND status = 'pending' AND task_id <> :t"),
                               {"s": specialist, "t": taken.split(".")[0]}).scalar_one()
    assert mine == [{"specialist_id": specialist, "queued": 2, "redelivery": 1, "oldest_queued_at": created}]
