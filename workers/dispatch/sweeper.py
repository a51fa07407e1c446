"""Outcomes nobody else will record: expired leases of dispatched jobs, and jobs that cannot be delivered.

* ``LeaseSweeper``: a worker that dies mid-job leaves a running claim whose lease
  passes. A later delivery would find it, but nothing guarantees one comes (the
  embedded dispatcher may have no worker to deliver to; Cloud Tasks may have
  given up). Every ``dispatch_sweep_interval_s`` a dispatcher records such jobs
  unknown itself, in one transaction with the ledger's and the task's unknown
  mark, exactly as a delivery would (``job_expire_lease``). So a dead worker's
  job is unknown at most ``worker_lease_s`` + ``dispatch_sweep_interval_s``
  after its last heartbeat. Except a job a later delivery can still resume (an
  rlm specialist's, with a checkpoint and resumes left, ``specialist_resumable``):
  it is left to that delivery for ``specialist_resume_window_s``, then swept.
* ``LeaseSweeper`` also decides the running jobs of a worker that stopped beating
  (``dead_after_s``: ``worker_dead_after_beats`` x ``worker_beat_s``, issue 44 §4)
  without waiting for their leases: a worker killed without a word (SIGKILL, a lost
  machine) leaves its beat row to age, and its jobs are recorded unknown as the
  lease's expiry would record them, at most ``dead_after_s`` +
  ``dispatch_sweep_interval_s`` after its last beat. Unknown, not run again: they
  had started, and at most once is the promise. Resumable jobs are left to their
  lease as above.
* ``LeaseSweeper`` also gives up a job handed to Cloud Tasks (``sent``) that no
  worker claimed within the signed body's lifetime plus one delivery
  (``worker_job_max_age_s`` + ``dispatch_deadline_s``): Cloud Tasks has stopped
  retrying it or lost it, and no delivery of that body can run it any more. It is
  failed and voided as below, instead of holding its task and its credits forever.
* ``give_up``: after ``dispatch_max_attempts`` a job that no worker ever claimed
  is finished as failed (``job_abandon``: no later delivery runs it), its outbox
  row marked undeliverable, its task FAILED with a message that says so, and its
  reservation voided (it never ran) or, for a follow-up of a task that already
  ran, charged by the charge rule like any cancel after work started.

Lock order as everywhere: claim, outbox, task, ledger.

Each sweep's reads run in autocommit, one statement each: a read in a transaction ends with ``ROLLBACK``, which
costs two round trips and makes psycopg forget every statement it had prepared on that pooled connection (and
``DEALLOCATE ALL`` them at its next use), the embedded dispatcher's take among them (issue 44: planned afresh on
every round, 0.7 ms of admission -> claim).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine

from ledger import operations
from ledger.errors import ResolutionRefused
from ledger.limits import LedgerSettings
from taskstate import admitted, charge, claims, outbox
from taskstate.outbox import OutboxRow
from taskstate.updates import TaskEvents
from workers.runs import RunOutcome
from workers.settlement import TaskSettlement, ledger_reason

log = logging.getLogger(__name__)

MAX_SWEPT_PER_ROUND = 100

@dataclass(frozen=True)
class Swept:
    job_id: str
    fencing_token: int


class LeaseSweeper:
    def __init__(
        self,
        engine: Engine,
        settlement: TaskSettlement,
        *,
        max_resumes: int = 0,
        resume_window_s: float = 0.0,
        abandoned_after_s: float | None = None,
        dead_after_s: float | None = None,
    ) -> None:
        assert dead_after_s is None or dead_after_s > 0, "SPECIALISTS_WORKER_DEAD_AFTER_BEATS x _BEAT_S is positive"
        self.engine = engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")  # reads: no BEGIN or ROLLBACK
        self.settlement = settlement
        self.max_resumes = max_resumes
        self.resume_window_s = resume_window_s
        self.abandoned_after_s = abandoned_after_s  # None: no job is handed to Cloud Tasks here
        self.dead_after_s = dead_after_s  # None: a dead worker's jobs wait for their leases

    def give_up_abandoned(self) -> list[str]:
        """Fail and void every job Cloud Tasks was given but no worker claimed in time; their job ids."""
        if self.abandoned_after_s is None:
            return []
        with self._autocommit.connect() as conn:
            rows = claims.sent_never_claimed(conn, sent_before_s=self.abandoned_after_s, limit=MAX_SWEPT_PER_ROUND)
        given_up = []
        for outbox_row in rows:
            error = (f"no worker claimed it within {self.abandoned_after_s:g} s of its hand-over to Cloud Tasks "
                     "(SPECIALISTS_WORKER_JOB_MAX_AGE_S + SPECIALISTS_DISPATCH_DEADLINE_S): the queue stopped "
                     "delivering it")
            if give_up(self.engine, self.settlement.tasks, outbox_row, error=error, limits=self.settlement.limits):
                given_up.append(outbox_row.job_id)
        return given_up

    def sweep(self) -> list[Swept]:
        """Record every expired lease of a dispatched job unknown, and every running job of a worker that stopped
        beating; return those this call recorded."""
        return self._sweep_expired() + self._sweep_dead_holders()

    def _sweep_dead_holders(self) -> list[Swept]:
        if self.dead_after_s is None:
            return []
        dead_after_s = self.dead_after_s
        with self._autocommit.connect() as conn:
            held = claims.dead_holders(conn, dead_after_s=dead_after_s, limit=MAX_SWEPT_PER_ROUND,
                                       max_resumes=self.max_resumes, resume_window_s=self.resume_window_s)
        why = f"its worker stopped beating for {dead_after_s:g} s; found by the lease sweeper"

        def decide(conn: Connection, job: claims.DispatchedJob) -> int | None:
            assert job.fencing_token is not None  # dead_holders reads it
            newly = claims.record_unknown(conn, job.job_id, fencing_token=job.fencing_token, why=why,
                                          holder_dead_after_s=dead_after_s)
            return job.fencing_token if newly else None

        return self._record_unknown(held, decide, why=why, code="worker_dead", said="its worker stopped beating")

    def _sweep_expired(self) -> list[Swept]:
        with self._autocommit.connect() as conn:
            expired = claims.expired_dispatched(conn, limit=MAX_SWEPT_PER_ROUND, max_resumes=self.max_resumes,
                                                resume_window_s=self.resume_window_s)

        def decide(conn: Connection, job: claims.DispatchedJob) -> int | None:
            newly, token = claims.expire_lease(conn, job.job_id)
            return int(token) if newly else None

        return self._record_unknown(expired, decide, why="its lease expired while it ran; found by the lease sweeper",
                                    code="lease_expired", said="its worker's lease expired")

    def _record_unknown(self, jobs: list[claims.DispatchedJob],
                        decide: Callable[[Connection, claims.DispatchedJob], int | None], *, why: str, code: str,
                        said: str) -> list[Swept]:
        """Each job's claim decided (``decide``: the token it recorded unknown, None when it no longer could) in one
        transaction with the ledger's and the task's unknown mark, then its task's watchers told; those recorded."""
        swept: list[Swept] = []
        for job in jobs:
            with self.engine.begin() as conn:
                token = decide(conn, job)
                if token is not None:
                    self.settlement.mark_unknown_ref(conn, job.ref, token, why)
            if token is None:
                continue
            log.warning("job %s: %s; recorded unknown for an operator", job.job_id, said,
                        extra={"event": "job_unknown", "job_id": job.job_id, "task_id": job.ref.task_id, "code": code})
            self.settlement.tasks.notify(job.ref.task_id)
            swept.append(Swept(job.job_id, token))
        return swept


def give_up(engine: Engine, tasks: TaskEvents, row: OutboxRow, *, error: str, limits: LedgerSettings) -> bool:
    """Fail a job that no worker ever claimed; False (nothing changed) when one did."""
    job_id = row.job_id
    with engine.begin() as conn:
        if not claims.abandon(conn, job_id, reason=f"undeliverable after {row.attempts} attempts: {error}"):
            return False
        outbox.mark_undeliverable(conn, row, error=error)
        tasks.finish(
            conn,
            row.ref,
            RunOutcome(
                "failed",
                f"no worker accepted this task after {row.attempts} attempts ({error}); the service's operator "
                "has been told",
            ),
        )
        hold = admitted.hold_of(conn, row.task_id)
        if hold is not None and hold.reservation_id is not None:
            # A follow-up of a task that already ran: the work done is charged, as a cancel after work started.
            ran: charge.Outcome = "failed" if claims.task_jobs(conn, row.task_id).any_claimed else "never_ran"
            charged = charge.charged_credits(ran, reserved_credits=hold.reserved_credits)
            assert charged is not None
            try:
                operations.settle(conn, hold.reservation_id, charged, ledger_reason(f"job {job_id} undeliverable", limits),
                                  limits=limits)
            except ResolutionRefused as refused:
                log.error("job %s given up, but its reservation was not resolved: %s", job_id, refused.message)
    log.error("job %s given up after %d attempts: %s", job_id, row.attempts, error)
    tasks.notify(row.task_id)
    return True
