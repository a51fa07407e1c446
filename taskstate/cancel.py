"""A customer's cancel of a task, from any instance, in one transaction with what it charges.

Each open job of the task is cancelled through its claim: one no worker claimed
never runs; a running one is stopped by its worker within a heartbeat. The task
is CANCELED at once. The reservation is voided when no work was done, settled
by the charge rule (``taskstate.charge``) when a run already happened (the task
waited for input), and left to the running job's settlement otherwise.

Refusals (``CancelRefused``) leave everything as it was: the caller's
transaction rolls back. A task that is not the caller's is refused as not found
before anything else is read of it, so no refusal tells a stranger its state. Lock order, as everywhere a job and its task meet:
claims, outbox rows, task rows, ledger.
"""

from __future__ import annotations

import logging

from a2a.server.agent_execution.active_task import TERMINAL_TASK_STATES
from a2a.types.a2a_pb2 import Task, TaskState, TaskStatus, TaskStatusUpdateEvent
from sqlalchemy import Connection

from core.errors import ServiceError
from ledger import operations
from ledger.errors import ResolutionRefused
from taskstate import admitted, charge, claims, ids, outbox, push, rows

log = logging.getLogger(__name__)

REASON = "canceled by the customer"
UNDER_RECONCILIATION = "the outcome of this task is under reconciliation by the operator; it cannot be canceled now"


class CancelRefused(ServiceError):
    """codes: task_not_found (not the caller's), task_not_cancelable (already final), outcome_under_reconciliation."""

    code = "cancel_refused"


def cancel_task(conn: Connection, task_id: str, owner: str) -> tuple[Task, bool]:
    """Cancel the owner's task in the caller's transaction: the CANCELED task, and whether its event is a push
    notification (the caller wakes the deliverers after the commit). Raises ``CancelRefused``."""
    # Ownership first: another customer's task, in whatever state (unknown included), answers exactly as a
    # missing one does. Unlocked, so the lock order below holds; the locked load confirms it.
    if not rows.owns(conn, task_id, owner):
        raise CancelRefused("task not found", code="task_not_found")
    outcomes = {d: _cancel_job(conn, task_id, d) for d in outbox.open_dispatch_ids(conn, task_id, owner)}
    jobs = claims.task_jobs(conn, task_id)
    if "unknown" in outcomes.values() or jobs.any_unknown:
        raise CancelRefused(UNDER_RECONCILIATION, code="outcome_under_reconciliation")
    locked = rows.lock(conn, task_id, owner, with_artifacts=True)
    if locked is None:
        raise CancelRefused("task not found", code="task_not_found")
    task = locked.task  # without its history until written (rows.Locked)
    if task.status.state in TERMINAL_TASK_STATES:
        raise CancelRefused("task is already final", code="task_not_cancelable")
    # A follow-up admitted before we locked the task is a job too. (Rare: admission needs the task lock.)
    for dispatch_id in outbox.open_dispatch_ids(conn, task_id, owner):
        if dispatch_id not in outcomes:
            outcomes[dispatch_id] = _cancel_job(conn, task_id, dispatch_id)
    outbox.cancel_rows(conn, [d for d, o in outcomes.items() if o in ("canceled_before_claim", "already_finished")])
    if "cancel_requested" not in outcomes.values():
        # Running: the worker stops within a heartbeat and its settlement charges (docs/WORKERS.md).
        _resolve_hold(conn, task_id, claimed=jobs.any_claimed)
    if task.status.HasField("message"):
        task.history.append(task.status.message)
    task.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_CANCELED))
    rows.stamp(task)
    event = TaskStatusUpdateEvent(task_id=task.id, context_id=task.context_id, status=task.status)
    rows.write_event(conn, locked, event, returning_history=True, pushed_sql=push.configured_sql())
    return task, locked.pushed


def _cancel_job(conn: Connection, task_id: str, dispatch_id: int) -> claims.CancelOutcome:
    return claims.request_cancel(conn, ids.job_id_for(task_id, dispatch_id), reason=REASON)


def _resolve_hold(conn: Connection, task_id: str, *, claimed: bool) -> None:
    """Void the reservation when no work was done; charge it when a run already happened (it waited for input).
    A refusal (already resolved, or unknown) leaves it to its holder or to an operator's reconcile."""
    hold = admitted.hold_of(conn, task_id)
    if hold is None or hold.reservation_id is None:
        return
    outcome: charge.Outcome = "canceled" if claimed else "never_ran"
    credits = charge.charged_credits(outcome, reserved_credits=hold.reserved_credits)
    assert credits is not None
    reason = "canceled after work started" if claimed else "canceled before any work started"
    try:
        operations.settle(conn, hold.reservation_id, credits, reason)
    except ResolutionRefused as refused:
        log.warning("reservation of task %s not resolved on cancel: %s (%s)", task_id, refused.code, refused.message)
