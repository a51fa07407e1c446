"""Finishing a job: the fenced claim finish and, in the same transaction, the settlement seam.

``Finisher`` is what the worker endpoint calls once a run is over. ``ClaimFinisher``
opens the transaction and calls ``Settlement.finish``, which finishes the claim
(fenced by the token) and, only when that is accepted for the first time,
settles on the same connection, so the claim's final state and the money commit
together or not at all. A stale claim's result is recorded for operators by the
claim function and moves no money.

``Settlement`` is where the ledger and the A2A task store plug in:
``finish`` finishes the claim, posts the reservation (tariff policy in
docs/WORKERS.md) and writes the task's final state (the service's does the claim's
finish, the outbox row and the reads the charge needs in one statement);
``mark_unknown`` runs in the transaction that recorded
the job unknown (a claim that found an expired lease, a renewal or a late finish
that found it expired, the lease sweeper), marking the reservation and the task;
``committed`` runs after either committed (wake the task's readers), and
``commit_then_committed`` commits and does the same in one round trip where it can
(the wake-up still runs after the COMMIT, in a transaction of its own).
``workers.settlement.TaskSettlement`` is the service's; ``NoSettlement`` does nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from core.errors import ServiceError
from taskstate import claims
from workers.auth import VerifiedJob
from workers.runs import RunOutcome

log = logging.getLogger(__name__)


class FinishFailed(ServiceError):
    code = "finish_failed"


class Settlement(Protocol):
    # True when ``finish`` closes the job's outbox row in its transaction once it is accepted (the service's): the
    # worker's answer says so, and the embedded dispatcher then writes nothing of its own for the row.
    closes_outbox_row: bool

    def finish(self, conn: Connection, job: VerifiedJob, fencing_token: int, outcome: RunOutcome, *,
               worker_id: str) -> claims.FinishResult:
        """Finish the claim (``claims.finish``: fenced by the token) and, only when that is accepted for the first
        time, settle the job's reservation and finish its task: all in the caller's transaction."""
        ...

    def mark_unknown(self, conn: Connection, job: VerifiedJob, fencing_token: int, reason: str) -> None:
        """Mark the reservation and the task unknown, in the transaction that recorded the claim unknown.
        Idempotent: several paths may find the same expired lease."""
        ...

    def committed(self, job: VerifiedJob) -> None:
        """After a transaction that settled or marked the job committed."""
        ...

    def commit_then_committed(self, conn: Connection, job: VerifiedJob) -> bool:
        """Commit the caller's transaction on ``conn``, then do what ``committed`` does, in one round trip where it
        can (the service's: the COMMIT and the task's wake-up, ``taskstate.notify.commit_then_notify``). False, with
        nothing done: the caller commits, then calls ``committed``. A failed COMMIT raises as the commit would."""
        ...


class NoSettlement:
    closes_outbox_row = False

    def finish(self, conn: Connection, job: VerifiedJob, fencing_token: int, outcome: RunOutcome, *,
               worker_id: str) -> claims.FinishResult:
        result = claims.finish(conn, job.job_id, fencing_token=fencing_token, outcome=outcome.state,
                               detail=outcome.as_record(), worker_id=worker_id)
        if result.outcome == "finished":
            self.settle(conn, job, fencing_token, outcome)
        return result

    def settle(self, conn: Connection, job: VerifiedJob, fencing_token: int, outcome: RunOutcome) -> None:
        """What a settlement does once the finish is accepted (a test's records it)."""
        return None

    def mark_unknown(self, conn: Connection, job: VerifiedJob, fencing_token: int, reason: str) -> None:
        return None

    def committed(self, job: VerifiedJob) -> None:
        return None

    def commit_then_committed(self, conn: Connection, job: VerifiedJob) -> bool:
        return False


class Finisher(Protocol):
    def finish(self, job: VerifiedJob, fencing_token: int, outcome: RunOutcome) -> claims.FinishResult: ...


class ClaimFinisher:
    """Finish the claim and settle in one transaction; retry a failed commit a bounded number of times.

    A retry is safe: if the first commit did land, the claim answers ``already_finished``
    for the same token and outcome, and settlement is not run again.
    """

    def __init__(self, engine: Engine, *, worker_id: str, settlement: Settlement, attempts: int = 3) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.settlement = settlement
        self.attempts = attempts

    def finish(self, job: VerifiedJob, fencing_token: int, outcome: RunOutcome) -> claims.FinishResult:
        last: Exception | None = None
        for attempt in range(self.attempts):
            try:
                wake = woken = False
                with self.engine.begin() as conn:
                    result = self.settlement.finish(conn, job, fencing_token, outcome, worker_id=self.worker_id)
                    if result.outcome == "stale" and result.state == "unknown":
                        # Our lease ran out before the result arrived: the job is unknown now (or already was).
                        self.settlement.mark_unknown(
                            conn, job, fencing_token, "the worker's result arrived after its lease expired"
                        )
                    wake = result.outcome == "finished" or result.state == "unknown"
                    if wake:  # the COMMIT and the wake-up after it in one round trip, where the settlement can
                        woken = self.settlement.commit_then_committed(conn, job)
                if wake and not woken:
                    self.settlement.committed(job)
                return result
            except DBAPIError as exc:  # connection lost, server restarting: the commit may or may not have landed
                last = exc
                log.warning("finishing job %s failed (attempt %d): %s", job.job_id, attempt + 1, type(exc).__name__)
                # A pooled connection found dead (no ping on checkout, core.db.make_engine): again at once, on a new one.
                if not (attempt == 0 and exc.connection_invalidated):
                    time.sleep(min(2.0, 0.1 * 2**attempt))
        raise FinishFailed(
            f"could not record the outcome of job {job.job_id} after {self.attempts} attempts "
            f"(SPECIALISTS_WORKER_FINISH_ATTEMPTS); its lease will expire and it will be reconciled as unknown"
        ) from last
