"""Settlement: a job's final A2A state and its ledger resolution, in the transaction that finishes its claim.

``TaskSettlement`` is the service's ``workers.finish.Settlement``. For a job
that serves an A2A task (``workers.tasks.TaskRef``):

* ``settle`` (the fenced finish's own transaction, only when the finish was
  accepted for the first time): closes the job's outbox row, writes the task's
  final state (unless the customer already cancelled it) and settles the
  task's reservation by the tariff policy below. A stale worker never gets here:
  its result is kept in ``job_stale_reports`` and moves no money.
* ``mark_unknown`` (the transaction that recorded the claim unknown): the
  reservation is marked unknown in the ledger (it keeps its hold and its slot)
  and the task stays unfinished with a message saying it is under
  reconciliation. Idempotent.

Tariff policy (docs/WORKERS.md, docs/A2A_EDGE.md):

=================  =====================================================
job outcome        the reservation
=================  =====================================================
completed, failed  charged the tariff (the work was done or attempted); an rlm
                   specialist charges its pricing: fixed, or metered (base +
                   answered semantic calls, never above the tariff)
canceled           charged the tariff: it was claimed, so work started (an rlm
                   specialist: its pricing, as above)
rejected           charged 0: the specialist declined the work
input_required     not settled: the task goes on with the next message
unknown            held until an operator reconciles it
=================  =====================================================

A task cancelled before any worker claimed it never reaches a worker: the edge
voids its reservation (charged 0) in the cancel's transaction.
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection, text

from ledger import operations
from ledger.errors import ResolutionRefused
from workers.auth import VerifiedJob
from workers.runner import RunOutcome
from workers.specialist import settle as specialist_settle
from workers.tasks import TaskEvents, TaskRef

log = logging.getLogger(__name__)

# The job's outbox row is closed, and the task's reservation read, in one round trip.
_CLOSE_JOB = text(
    """
    WITH closed AS (
        UPDATE dispatch_outbox SET status = 'done', finished_at = now()
         WHERE dispatch_id = :d AND task_id = :t AND status IN ('pending', 'sent', 'undeliverable')
        RETURNING 1
    )
    SELECT reservation_id, tariff_credits, EXISTS (SELECT 1 FROM closed) AS closed
      FROM edge_tasks WHERE task_id = :t
    """
)
_RESERVATION = text("SELECT reservation_id, tariff_credits FROM edge_tasks WHERE task_id = :t")


def charged_credits(outcome: str, tariff_credits: int) -> int | None:
    """What a job's outcome charges of the tariff; None: nothing is settled yet (the task goes on)."""
    if outcome == "input_required":
        return None
    if outcome == "rejected":
        return 0
    return tariff_credits  # completed, failed, canceled after a claim


class TaskSettlement:
    def __init__(self, tasks: TaskEvents, *, operator: str) -> None:
        self.tasks = tasks
        self.operator = operator  # who marks reservations unknown, for the ledger's audit record

    def settle(self, conn: Connection, job: VerifiedJob, fencing_token: int, outcome: RunOutcome) -> None:
        ref = TaskRef.of(job)
        if ref is None:
            return
        row = conn.execute(_CLOSE_JOB, {"d": ref.dispatch_id, "t": ref.task_id}).one_or_none()
        reserved = row is not None and row.reservation_id is not None
        charged = charged_credits(outcome.state, int(row.tariff_credits)) if reserved else None
        specialist = specialist_settle.credits_for_job(conn, job.job_id, outcome.state, outcome.detail)
        if specialist is not None and charged is not None:
            charged = min(specialist, charged)  # an rlm specialist's pricing (fixed or metered), never above
        metadata = specialist_settle.final_metadata(conn, job.job_id, outcome.detail, charged if reserved else 0)
        self.tasks.finish(conn, ref, outcome, metadata=metadata)
        if not reserved or charged is None:
            return  # a free task (nothing was reserved), or one that goes on
        # A refusal raises: the finish rolls back, is retried, and a finish that cannot commit leaves the
        # job to expire into unknown, where an operator sees it. Money is never moved on a guess.
        operations.settle(conn, row.reservation_id, charged, f"job {job.job_id} {outcome.state} (claim {fencing_token})")

    def mark_unknown(self, conn: Connection, job: VerifiedJob, fencing_token: int, reason: str) -> None:
        ref = TaskRef.of(job)
        if ref is not None:
            self.mark_unknown_ref(conn, ref, job.job_id, fencing_token, reason)

    def mark_unknown_ref(self, conn: Connection, ref: TaskRef, job_id: str, fencing_token: int, reason: str) -> None:
        self.tasks.mark_unknown(conn, ref)
        row = conn.execute(_RESERVATION, {"t": ref.task_id}).one_or_none()
        if row is None or row.reservation_id is None:
            return
        try:
            operations.mark_unknown(
                conn, row.reservation_id, f"job {job_id} (claim {fencing_token}): {reason}"[:500], self.operator
            )
        except ResolutionRefused as refused:  # already resolved: its outcome is known, nothing to hold
            log.error("job %s is unknown but its reservation is not open: %s", job_id, refused.message)

    def committed(self, job: VerifiedJob) -> None:
        ref = TaskRef.of(job)
        if ref is not None:
            self.tasks.notify(ref.task_id)
