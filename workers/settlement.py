"""Settlement: a job's final A2A state and its ledger resolution, in the transaction that finishes its claim.

``TaskSettlement`` is the service's ``workers.finish.Settlement``. For a job
that serves an A2A task (``taskstate.ids.TaskRef``):

* ``finish`` (one transaction): the claim's fenced finish and, only when it
  was accepted for the first time, in the same statement the job's outbox row
  closed and the task's hold and the run's journal read; then the task's
  final state (unless the customer already cancelled it) and the settlement
  of the task's reservation with what the charge rule (``taskstate.charge``) decides
  from the outcome, the reserved credits, and for an rlm specialist the pricing
  and the semantic calls of its journal. A stale worker never gets here: its
  result is kept in ``job_stale_reports`` and moves no money.
* ``mark_unknown`` (the transaction that recorded the claim unknown): the job's
  outbox row is closed (no delivery will run it again: the embedded dispatcher
  closes it so on ``job_outcome_unknown``, and now the Cloud Tasks path does too,
  so the sweeper's abandoned-job query does not read it every sweep until an
  operator reconciles it), the reservation is marked unknown in the ledger (it
  keeps its hold and its slot) and the task stays unfinished with a message
  saying it is under reconciliation. Idempotent.

A task cancelled before any worker claimed it never reaches a worker: the edge
voids its reservation in the cancel's transaction (``taskstate.cancel``).
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace
from sqlalchemy import Connection

from core import telemetry
from core.fragments import compose
from ledger import operations
from ledger.errors import ResolutionRefused
from ledger.limits import LedgerSettings, default_limits
from taskstate import admitted, charge, claims, outbox
from taskstate.ids import TaskRef
from taskstate.updates import TaskEvents
from workers.auth import VerifiedJob
from workers.runs import RunOutcome
from workers.hosted_rlm import a2a, journal

log = logging.getLogger(__name__)

# The claim's fenced finish, and only when it is accepted for the first time the job's outbox row closed, with the
# task's hold and the run's journal read: one round trip (issue 17: it was four, and a BEGIN). The claim's finish
# is decided, and its row locked, before the outbox row is touched (``claims.finished_in``), as the lock order says.
_FINISH_JOB = compose(
    "settlement.finish_job",
    """
    WITH {finish}, {closed}, {hold}, {run}
    SELECT finish.outcome, finish.state, hold.reservation_id, hold.reserved_credits,
           run.pricing, run.base_credits, run.credits_per_semantic_call, run.resumes, run.used, run.charged
      FROM finish LEFT JOIN hold ON finish.outcome = 'finished' LEFT JOIN run ON finish.outcome = 'finished'
    """,
    finish=claims.FINISH.cte("finish", materialized=True),
    closed=outbox.CLOSE.cte("closed", when=claims.finished_in("finish")),
    hold=admitted.HOLD.cte("hold"),
    run=journal.RUN_RECORD.cte("run"),
)


def ledger_reason(reason: str, limits: LedgerSettings) -> str:
    """A reason the service wrote, clipped to what the ledger accepts (SPECIALISTS_LEDGER_MAX_REASON_CHARS), so
    that recording an outcome is never refused for the length of its explanation."""
    return reason[: limits.max_reason_chars]


def _runner_credits(detail: dict[str, Any]) -> int | None:
    """The figure a specialist runner recorded (``credits_to_settle``), if it stated one."""
    credits = detail.get("credits_to_settle")
    return credits if isinstance(credits, int) and not isinstance(credits, bool) else None


class TaskSettlement:
    def __init__(self, tasks: TaskEvents, *, operator: str, limits: LedgerSettings | None = None) -> None:
        self.tasks = tasks
        self.operator = operator  # who marks reservations unknown, for the ledger's audit record
        self.limits = limits or default_limits()  # settings.ledger

    def finish(self, conn: Connection, job: VerifiedJob, fencing_token: int, outcome: RunOutcome, *,
               worker_id: str) -> claims.FinishResult:
        ref = TaskRef.of_payload(job.payload)
        if ref is None:  # a raw job (a test's): no task, no money
            return claims.finish(conn, job.job_id, fencing_token=fencing_token, outcome=outcome.state,
                                 detail=outcome.as_record(), worker_id=worker_id)
        params = claims.finish_params(job.job_id, fencing_token=fencing_token, outcome=outcome.state,
                                      detail=outcome.as_record(), worker_id=worker_id)
        row = _FINISH_JOB.execute(conn, {**params, "dispatch_id": ref.dispatch_id, "task_id": ref.task_id}).one()
        result = claims.FinishResult(row.outcome, row.state)
        if result.outcome == "finished":
            hold = None if row.reserved_credits is None else admitted.Hold(row.reservation_id, int(row.reserved_credits))
            self._settle(conn, job, ref, fencing_token, outcome, hold, journal.run_record_of(row))
        return result

    def _settle(self, conn: Connection, job: VerifiedJob, ref: TaskRef, fencing_token: int, outcome: RunOutcome,
                hold: admitted.Hold | None, run: journal.RunRecord | None) -> None:
        """The rest of the finish's transaction: the task's final state, then the ledger settlement."""
        charged = None
        if hold is not None and hold.reservation_id is not None:
            usage = (charge.NO_USAGE if run is None
                     else charge.Usage(run.semantic_calls_charged, runner_credits=_runner_credits(outcome.detail)))
            charged = charge.charged_credits(outcome.state, reserved_credits=hold.reserved_credits,
                                             pricing=charge.FIXED if run is None else run.pricing, usage=usage)
        self.tasks.finish(conn, ref, outcome, metadata=self._final_metadata(run, outcome, hold, charged))
        if hold is None or hold.reservation_id is None or charged is None:
            return  # a free task (nothing was reserved), or one that goes on
        # A refusal raises: the finish rolls back, is retried, and a finish that cannot commit leaves the
        # job to expire into unknown, where an operator sees it. Money is never moved on a guess.
        operations.settle(conn, hold.reservation_id, charged,
                          ledger_reason(f"job {job.job_id} {outcome.state} (claim {fencing_token})", self.limits),
                          limits=self.limits)
        telemetry.annotate(trace.get_current_span(), **{"specialists.credits_settled": charged})
        attributes = {"specialist": job.specialist_id, "outcome": outcome.state}
        telemetry.after_commit(conn, lambda: telemetry.meters.credits_settled.add(charged, attributes))

    @staticmethod
    def _final_metadata(run: journal.RunRecord | None, outcome: RunOutcome, hold: admitted.Hold | None,
                        charged: int | None) -> dict[str, Any] | None:
        """The ``specialist`` metadata of the task's final state (None: not a specialist run)."""
        if run is None:
            return None
        reserved = hold is not None and hold.reservation_id is not None
        merged = {**outcome.detail, "semantic_calls_used": run.semantic_calls_used,
                  "semantic_calls_charged": run.semantic_calls_charged, "resumes": run.resumes}
        return a2a.final_metadata(merged, charged if reserved else 0)

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

    def committed(self, job: VerifiedJob) -> None:
        ref = TaskRef.of_payload(job.payload)
        if ref is not None:
            self.tasks.notify(ref.task_id)
