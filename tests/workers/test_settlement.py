"""The settlement's ledger records, under the ledger's own limits (workers.settlement)."""

from __future__ import annotations

import uuid

from a2a.types.a2a_pb2 import Task, TaskState, TaskStatus
from sqlalchemy import text

from core.settings import Settings
from ledger.client import Ledger
from taskstate import outbox, rows
from taskstate.ids import TaskRef
from taskstate.updates import TaskEvents
from workers.settlement import TaskSettlement

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
