"""Settlement: a job's final A2A state and its ledger resolution, in the transaction that finishes its claim.

``TaskSettlement`` is the service's ``workers.finish.Settlement``. For a job
that serves an A2A task (``taskstate.ids.TaskRef``):

* ``finish`` (one transaction): the claim's fenced finish and, only when it
  was accepted for the first time, in the same statement the job's outbox row
  closed, the task locked and read, and the task's hold and the run's journal
  read; then, in one more statement, the task's final state (unless the customer
  already cancelled it: then the settlement alone) and the settlement of the task's
  reservation with what the charge rule (``taskstate.charge``) decides
  from the outcome, the reserved credits, and the job's usage when its executor
  keeps a record of it. A stale worker never gets here: its result is kept in
  ``job_stale_reports`` and moves no money. ``commit_then_committed`` sends the
  COMMIT and the task's wake-up after it in one round trip.
* ``mark_unknown`` (the transaction that recorded the claim unknown): the job's
  outbox row is closed (no delivery will run it again: the embedded dispatcher
  closes it so on ``job_outcome_unknown``, and now the Cloud Tasks path does too,
  so the sweeper's abandoned-job query does not read it every sweep until an
  operator reconciles it), the reservation is marked unknown in the ledger (it
  keeps its hold and its slot) and the task stays unfinished with a message
  saying it is under reconciliation. Idempotent.

An executor's usage is a ``UsageSource`` the assembly wires in (``workers.assembly``:
the rlm executor's journal, ``workers.hosted_rlm.usage``): its record of the job is
one more common table expression of the finish's statement, read back as the
pricing and usage the charge rule takes and the task's final metadata. Without one
(the dispatcher's settlement, which only marks jobs unknown) every job is charged
at its fixed price, and this module knows no executor.

A task cancelled before any worker claimed it never reaches a worker: the edge
voids its reservation in the cancel's transaction (``taskstate.cancel``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry import trace
from sqlalchemy import Connection

from core import telemetry
from core.fragments import Fragment, Statement, compose
from ledger import operations
from ledger.errors import ResolutionRefused
from ledger.limits import LedgerSettings, default_limits
from taskstate import admitted, charge, claims, outbox, rows
from taskstate.ids import TaskRef
from taskstate.updates import TaskEvents
from workers.auth import VerifiedJob
from workers.runs import RunOutcome

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ExecutorUsage:
    """What an executor's record says a finished job used: the pricing the charge rule applies and the usage it
    counts (``taskstate.charge``), and the record itself for the task's final metadata."""

    pricing: charge.Pricing
    usage: charge.Usage
    record: Any


class UsageSource(Protocol):
    """An executor's record of what its jobs used, read in the finish's one statement.

    ``record`` is the owner's fragment of the job's record: exactly the parameter ``job_id``, at most one row
    (none: the job is not this executor's). ``finish_statement`` composes it in."""

    name: str  # the executor's, in the name of the composed statement
    record: Fragment

    def usage_of(self, record: Mapping[str, Any] | None, outcome: RunOutcome) -> ExecutorUsage | None:
        """The record's row as a dict (None: no record of the job) as usage; None: the job is not this source's."""
        ...

    def usage_of_job(self, conn: Connection, job_id: str, outcome: RunOutcome) -> ExecutorUsage | None:
        """The job's usage read alone, in the caller's transaction (the operator's reconcile, ``workers.reconcile``,
        for the charge rule's figure beside its charge); None: the job is not this source's."""
        ...

    def final_metadata(self, usage: ExecutorUsage, outcome: RunOutcome, credits_charged: int) -> dict[str, Any]:
        """The metadata of the task's final state for a job with a record (``credits_charged``: 0 for a free task)."""
        ...


# The claim's fenced finish, and only when it is accepted for the first time the job's outbox row closed, the task's
# rows locked and read (what its final event needs, ``taskstate.rows.lock_fragment``), with the task's hold and the
# executor's record of the job read: one round trip (issue 17: it was four, and a BEGIN; issue 44: the task's lock
# was a statement of its own). The lock order holds inside the statement: the claim's finish is decided, and its row
# locked, before the outbox row is touched (``claims.finished_in``), and the task's rows are read only once the
# outbox row's update has run to its end (the count of ``closed``, evaluated once before the task is read). The record
# comes back whole, as JSON: this module reads none of its columns.
_FINISH_SELECT = """
    SELECT finish.outcome, finish.state, hold.reservation_id, hold.reserved_credits, {usage} AS usage,
           locked_task.version AS task_version, locked_task.id AS task_row_id,
           locked_task.context_id AS task_context_id, locked_task.status AS task_status,
           locked_task.metadata AS task_metadata
      FROM finish LEFT JOIN hold ON finish.outcome = 'finished'
      LEFT JOIN locked_task ON finish.outcome = 'finished'{join}
    """
_TASK_COLUMNS = {"version": "task_version", "id": "task_row_id", "context_id": "task_context_id",
                 "status": "task_status", "metadata": "task_metadata"}


def _finish_parts() -> dict[str, Any]:
    return {"finish": claims.FINISH.cte("finish", materialized=True),
            "closed": outbox.CLOSE.cte("closed", when=claims.finished_in("finish")),
            "hold": admitted.HOLD.cte("hold"),
            "locked_task": rows.lock_fragment(with_artifacts=False).cte(
                "locked_task", when=f"{claims.finished_in('finish')} AND (SELECT count(*) FROM closed) >= 0")}


_FINISH_JOB = compose(
    "settlement.finish_job",
    "WITH {finish}, {closed}, {hold}, {locked_task}" + _FINISH_SELECT.format(usage="NULL::jsonb", join=""),
    **_finish_parts(),
)


def finish_statement(source: UsageSource) -> Statement:
    """The finish's statement with ``source``'s record of the job (``executor_usage``) joined in."""
    select = _FINISH_SELECT.format(usage="to_jsonb(executor_usage)",
                                   join=" LEFT JOIN executor_usage ON finish.outcome = 'finished'")
    return compose(f"settlement.finish_job.{source.name}",
                   "WITH {finish}, {closed}, {hold}, {locked_task}, {executor_usage}" + select,
                   **_finish_parts(), executor_usage=source.record.cte("executor_usage"))


def _locked_task(row: Mapping[str, Any], ref: TaskRef) -> rows.Locked | None:
    """The task as the finish's statement locked and read it; None: no task of the job's owner."""
    if row["task_version"] is None:
        return None
    return rows.locked_of({column: row[name] for column, name in _TASK_COLUMNS.items()}, ref.owner,
                          with_artifacts=False)


def ledger_reason(reason: str, limits: LedgerSettings) -> str:
    """A reason the service wrote, clipped to what the ledger accepts (SPECIALISTS_LEDGER_MAX_REASON_CHARS), so
    that recording an outcome is never refused for the length of its explanation."""
    return reason[: limits.max_reason_chars]


class TaskSettlement:
    closes_outbox_row = True  # the finish's statement closes it (``outbox.CLOSE``): a task's job always has one

    def __init__(self, tasks: TaskEvents, *, operator: str, limits: LedgerSettings | None = None,
                 usage: UsageSource | None = None) -> None:
        self.tasks = tasks
        self.operator = operator  # who marks reservations unknown, for the ledger's audit record
        self.limits = limits or default_limits()  # settings.ledger
        self.usage = usage  # the executors' record of what a job used (workers.assembly wires it)
        self._finish_job = _FINISH_JOB if usage is None else finish_statement(usage)

    def finish(self, conn: Connection, job: VerifiedJob, fencing_token: int, outcome: RunOutcome, *,
               worker_id: str) -> claims.FinishResult:
        ref = TaskRef.of_payload(job.payload)
        if ref is None:  # a raw job (a test's): no task, no money
            return claims.finish(conn, job.job_id, fencing_token=fencing_token, outcome=outcome.state,
                                 detail=outcome.as_record(), worker_id=worker_id)
        params = claims.finish_params(job.job_id, fencing_token=fencing_token, outcome=outcome.state,
                                      detail=outcome.as_record(), worker_id=worker_id)
        [row] = self._finish_job.rows(conn, {**params, "dispatch_id": ref.dispatch_id, "task_id": ref.task_id,
                                             "owner": ref.owner})
        result = claims.FinishResult(row["outcome"], row["state"])
        if result.outcome == "finished":
            hold = (None if row["reserved_credits"] is None
                    else admitted.Hold(row["reservation_id"], int(row["reserved_credits"])))
            usage = None if self.usage is None else self.usage.usage_of(row["usage"], outcome)
            self._settle(conn, job, ref, fencing_token, outcome, hold, usage, _locked_task(row, ref))
        return result

    def _settle(self, conn: Connection, job: VerifiedJob, ref: TaskRef, fencing_token: int, outcome: RunOutcome,
                hold: admitted.Hold | None, usage: ExecutorUsage | None, locked: rows.Locked | None) -> None:
        """The rest of the finish's transaction: the task's final state and, in the same statement (one round trip,
        issue 44), the ledger settlement; the settlement alone when the final state is not written (the customer
        cancelled the task first)."""
        charged = None
        if hold is not None and hold.reservation_id is not None:
            charged = charge.charged_credits(outcome.state, reserved_credits=hold.reserved_credits,
                                             pricing=charge.FIXED if usage is None else usage.pricing,
                                             usage=charge.NO_USAGE if usage is None else usage.usage)
        metadata = self._final_metadata(usage, outcome, hold, charged)
        if hold is None or hold.reservation_id is None or charged is None:
            self.tasks.finish(conn, ref, outcome, metadata=metadata, locked=locked)
            return  # a free task (nothing was reserved), or one that goes on
        reason = ledger_reason(f"job {job.job_id} {outcome.state} (claim {fencing_token})", self.limits)
        settle = rows.Beside(operations.SETTLE, operations.SETTLED_COLUMNS,
                             operations.settle_fragment_params(hold.reservation_id, charged, reason, limits=self.limits))
        final = self.tasks.finish(conn, ref, outcome, metadata=metadata, locked=locked, beside=settle)
        # A refusal raises: the finish rolls back, is retried, and a finish that cannot commit leaves the
        # job to expire into unknown, where an operator sees it. Money is never moved on a guess.
        if final.beside is not None:
            operations.parse_settled(final.beside, charged=charged)
        else:
            operations.settle(conn, hold.reservation_id, charged, reason, limits=self.limits)
        telemetry.annotate(trace.get_current_span(), **{"specialists.credits_settled": charged})
        attributes = {"specialist": job.specialist_id, "outcome": outcome.state}
        telemetry.after_commit(conn, lambda: telemetry.meters.credits_settled.add(charged, attributes))

    def _final_metadata(self, usage: ExecutorUsage | None, outcome: RunOutcome, hold: admitted.Hold | None,
                        charged: int | None) -> dict[str, Any] | None:
        """The metadata of the task's final state, from the executor's record (None: the job has none)."""
        if usage is None or self.usage is None:
            return None
        reserved = hold is not None and hold.reservation_id is not None
        return self.usage.final_metadata(usage, outcome, charged if reserved and charged is not None else 0)

    def mark_unknown(self, conn: Connection, job: VerifiedJob, fencing_token: int, reason: str) -> None:
        ref = TaskRef.of_payload(job.payload)
        if ref is not None:
            self.mark_unknown_ref(conn, ref, fencing_token, reason)

    def mark_unknown_ref(self, conn: Connection, ref: TaskRef, fencing_token: int, reason: str) -> None:
        outbox.close_unknown(conn, ref)  # lock order: the claim (the caller's), the outbox row, the task, the ledger
        self.tasks.mark_unknown(conn, ref)
        telemetry.after_commit(conn, lambda: telemetry.meters.unknown_outcomes.add(1))
        hold = admitted.hold_of(conn, ref.task_id)
        if hold is None or hold.reservation_id is None:
            return
        try:
            operations.mark_unknown(conn, hold.reservation_id,
                                    ledger_reason(f"job {ref.job_id} (claim {fencing_token}): {reason}", self.limits),
                                    self.operator, limits=self.limits)
        except ResolutionRefused as refused:  # already resolved: its outcome is known, nothing to hold
            log.error("job %s is unknown but its reservation is not open: %s", ref.job_id, refused.message)

    def commit_then_committed(self, conn: Connection, job: VerifiedJob) -> bool:
        ref = TaskRef.of_payload(job.payload)
        return ref is not None and self.tasks.commit_then_notify(conn, ref.task_id)

    def committed(self, job: VerifiedJob) -> None:
        ref = TaskRef.of_payload(job.payload)
        if ref is not None:
            self.tasks.notify(ref.task_id)
