"""The settlement's ledger records, under the ledger's own limits (workers.settlement)."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from a2a.types.a2a_pb2 import Task, TaskState, TaskStatus
from sqlalchemy import text

from core.settings import Settings
from ledger.client import Ledger
from taskstate import claims, outbox, rows
from taskstate.ids import TaskRef
from taskstate.updates import TaskEvents
from workers.auth import VerifiedJob
from workers.finish import ClaimFinisher
from workers.runs import RunOutcome
from workers.settlement import TaskSettlement

from tests.statements import Statements

MAX_REASON_CHARS = 50


def admitted_task(engine, ledger: Ledger, credits: int) -> TaskRef:
    """A task the edge admitted with a reservation of ``credits``, as admission writes it."""
    customer, task_id = f"settle-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    ledger.grant(customer, 100, operator="test", skills=["drill"])
    assert ledger.reserve(customer, task_id, "fp", "drill", credits).ok
    task = Task(id=task_id, context_id=str(uuid.uuid4()), status=TaskStatus(state=TaskState.TASK_STATE_WORKING))
    with engine.begin() as conn:
        rows.insert_new(conn, task, "owner")
        conn.execute(text("INSERT INTO edge_tasks (task_id, customer_id, specialist_id, skill_id, owner, "
                          "tariff_credits, reservation_id) VALUES (:t, :c, 'drill', 'drill', 'owner', :n, :r)"),
                     {"t": task_id, "c": customer, "n": credits, "r": task_id})
    return TaskRef(task_id, 1, "owner", task.context_id)


def test_a_job_found_unknown_is_held_in_the_ledger_even_when_its_reason_is_longer_than_the_ledger_accepts(engine):
    """Issue 14: with SPECIALISTS_LEDGER_MAX_REASON_CHARS below the 500 characters the settlement used to clip
    to, marking the reservation unknown raised inside the claim's transaction."""
    limits = Settings(ledger={"max_reason_chars": MAX_REASON_CHARS}).ledger
    ledger = Ledger(engine)
    ref = admitted_task(engine, ledger, credits=7)
    settlement = TaskSettlement(TaskEvents(engine), operator="test", limits=limits)
    with engine.begin() as conn:
        settlement.mark_unknown_ref(conn, ref, 3, "its lease expired while it ran; " + "x" * 400)
    held = ledger.reservation(ref.task_id)
    assert held.state == "unknown"
    assert held.unknown_reason.startswith(f"job {ref.job_id} (claim")  # clipped to the setting, not refused
    assert len(held.unknown_reason) <= MAX_REASON_CHARS


def test_a_job_found_unknown_has_its_outbox_row_closed_so_no_sweep_reads_it_again(engine):
    """In Cloud Tasks mode the row of a job whose worker died stayed ``sent`` until an operator reconciled it, and
    the sweeper's abandoned-job query read it every sweep (issue 18). No delivery runs an unknown job again."""
    ledger = Ledger(engine)
    ref = admitted_task(engine, ledger, credits=3)
    with engine.begin() as conn:
        outbox.enqueue(conn, task_id=ref.task_id, specialist_id="drill", executor="drill", owner="owner",
                       context_id=ref.context_id, message=b"")
        dispatch_id = outbox.open_dispatch_ids(conn, ref.task_id, "owner")[0]
        row = outbox.row_of_job(conn, f"{ref.task_id}.{dispatch_id}")
        outbox.mark_sent(conn, row)
    ref = TaskRef(ref.task_id, dispatch_id, ref.owner, ref.context_id)
    settlement = TaskSettlement(TaskEvents(engine), operator="test")
    with engine.begin() as conn:
        settlement.mark_unknown_ref(conn, ref, 1, "its lease expired while it ran")
    with engine.connect() as conn:
        assert outbox.open_dispatch_ids(conn, ref.task_id, "owner") == []
        closed = conn.execute(text("SELECT status, finished_at FROM dispatch_outbox WHERE dispatch_id = :d"),
                              {"d": dispatch_id}).one()
    assert closed.status == "done" and closed.finished_at is not None
    assert ledger.reservation(ref.task_id).state == "unknown"


# What a job's claim, finish and notification send, recognised in the statement's text.
HOT = {"claim": "job_claim_first(", "task lock": "FOR UPDATE OF", "task event": "INSERT INTO task_events",
       "notification": "pg_notify("}


def _dispatched(engine, ledger: Ledger) -> VerifiedJob:
    """A task's job as a worker holds it: admitted with a reservation, its outbox row sent."""
    ref = admitted_task(engine, ledger, credits=2)
    with engine.begin() as conn:
        outbox.enqueue(conn, task_id=ref.task_id, specialist_id="drill", executor="drill", owner="owner",
                       context_id=ref.context_id, message=b"")
        dispatch_id = outbox.open_dispatch_ids(conn, ref.task_id, "owner")[0]
        outbox.mark_sent(conn, outbox.row_of_job(conn, f"{ref.task_id}.{dispatch_id}"))
    ref = TaskRef(ref.task_id, dispatch_id, ref.owner, ref.context_id)
    payload = {"t": ref.task_id, "d": dispatch_id, "o": ref.owner, "x": ref.context_id}
    return VerifiedJob(ref.job_id, "drill", 30.0, payload, datetime.now(timezone.utc), "test")


def _run_job(engine, job: VerifiedJob) -> None:
    """The claim, run and finish of ``job`` as the worker does them, on ``engine``."""
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        claim = claims.claim_first(conn, job.job_id, worker_id="w-test", lease_s=30,
                                   ref=TaskRef.of_payload(job.payload))
    assert claim is not None and claim.outcome == "claimed"
    finisher = ClaimFinisher(engine, worker_id="w-test", settlement=TaskSettlement(TaskEvents(engine), operator="t"))
    assert finisher.finish(job, claim.fencing_token, RunOutcome("completed", "done")).outcome == "finished"


def test_a_jobs_hot_statements_skip_sqlalchemys_execution_unless_something_watches_the_statements(engine):
    """Issue 44: SQLAlchemy's execution (its context, parameters and result metadata) was a fifth to a third of
    the worker's CPU for each of a job's statements. Its claim, task lock, task event and notification run on the
    connection's driver (``core.db.hot_rows``), and the job is recorded all the same; while a hook watches the
    statements (telemetry's spans, a test's), every one of them goes through SQLAlchemy and is seen."""
    ledger = Ledger(engine)
    unwatched, watched = _dispatched(engine, ledger), _dispatched(engine, ledger)
    with Statements(engine) as statements:
        _run_job(engine, unwatched)
        assert {name for name, text_ in HOT.items() if any(text_ in sql for sql in statements.executed)} == set()
        with statements.watching():
            _run_job(engine, watched)
    assert {name for name, text_ in HOT.items() if any(text_ in sql for sql in statements.seen)} == set(HOT)
    for job in (unwatched, watched):
        ref = TaskRef.of_payload(job.payload)
        assert ledger.reservation(ref.task_id).state == "settled"
        with engine.connect() as conn:
            assert claims.get(conn, job.job_id)["outcome"] == "completed"
            assert rows.read(conn, ref.task_id, "owner").status.state == TaskState.TASK_STATE_COMPLETED


def _statements_of(statements: Statements, *needles: str) -> list[str]:
    return [sql for sql in statements.seen if all(needle in sql for needle in needles)]


def test_a_jobs_final_event_and_its_settlement_are_one_statement_after_the_finish_that_locked_the_task(engine):
    """Issue 44: the finish's statement locks and reads the task (once the claim's finish is accepted and the outbox
    row closed, the lock order), and the final event's statement settles: two statements where there were four."""
    ledger = Ledger(engine)
    job = _dispatched(engine, ledger)
    with Statements(engine) as statements, statements.watching():
        _run_job(engine, job)
    assert len(_statements_of(statements, "job_finish(", "FOR UPDATE OF v, t")) == 1
    assert len(_statements_of(statements, "INSERT INTO task_events", "ledger_settle(")) == 1
    assert _statements_of(statements, "FOR UPDATE OF") == _statements_of(statements, "job_finish(")  # no lock alone
    assert _statements_of(statements, "ledger_settle(") == _statements_of(statements, "INSERT INTO task_events")
    reservation = ledger.reservation(TaskRef.of_payload(job.payload).task_id)
    assert (reservation.state, reservation.charged) == ("settled", 2)


def test_a_job_whose_task_the_customer_cancelled_is_settled_without_writing_the_task(engine):
    """The final event is not written over a cancelled task, so the settlement beside it does not run: it runs
    alone, in the same transaction, and the task keeps its CANCELED state."""
    ledger = Ledger(engine)
    job = _dispatched(engine, ledger)
    ref = TaskRef.of_payload(job.payload)
    with engine.begin() as conn:
        assert TaskEvents(engine).resolve(conn, ref, "canceled")  # as the customer's cancel leaves it
    with Statements(engine) as statements, statements.watching():
        _run_job(engine, job)
    assert _statements_of(statements, "INSERT INTO task_events") == []
    assert len(_statements_of(statements, "ledger_settle(")) == 1
    reservation = ledger.reservation(ref.task_id)
    assert (reservation.state, reservation.charged) == ("settled", 2)
    with engine.connect() as conn:
        assert rows.read(conn, ref.task_id, "owner").status.state == TaskState.TASK_STATE_CANCELED
        assert claims.get(conn, job.job_id)["outcome"] == "completed"
