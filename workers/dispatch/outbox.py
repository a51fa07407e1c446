"""The edge's dispatch outbox as the dispatchers see it: take or lock due rows, sign them, record the result.

Admission commits one ``dispatch_outbox`` row per message with the task and
its reservation (app/admission.py). A row is due when it is ``pending`` and its
``available_at`` has come. Dispatchers never hold a row across a failure:

* the embedded dispatcher **takes** due rows in one statement (``FOR UPDATE SKIP
  LOCKED``, so any number of dispatchers share the queue), pushing
  ``available_at`` forward by its delivery lease and counting the attempt; it
  renews that lease while the delivery lasts. If it dies, the rows come due
  again when the lease passes: nothing is lost, and a repeated delivery is
  answered from the job's claim;
* the Cloud Tasks relay **locks** due rows in a transaction, enqueues them and
  marks them ``sent`` before committing: if it dies in between, the transaction
  rolls back and the rows are enqueued again (the deterministic task name makes
  that harmless).

A failed attempt is rescheduled with exponential backoff and jitter (never
sooner than the worker's ``Retry-After``). After ``dispatch_max_attempts``
attempts a job that no worker ever claimed is given up: it is failed as
undeliverable and its reservation voided (it never ran); a job that a worker
did claim is left to its claim (finished, running, or unknown).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, text

from core.settings import Settings
from core.specs import SpecInvalid, load_specs
from workers.auth import JobSigner
from workers.dispatch.base import DispatchJob, job_id_for
from workers.tasks import task_payload

log = logging.getLogger(__name__)

_TAKE = text(
    """
    UPDATE dispatch_outbox o
       SET attempts = o.attempts + 1, available_at = now() + make_interval(secs => :lease_s),
           taken_by = :me, taken_at = now()
     WHERE o.dispatch_id IN (SELECT dispatch_id FROM dispatch_outbox
                              WHERE status = 'pending' AND available_at <= now()
                              ORDER BY available_at, dispatch_id
                              FOR UPDATE SKIP LOCKED LIMIT :n)
    RETURNING o.dispatch_id, o.task_id, o.specialist_id, o.owner, o.context_id, o.attempts
    """
)
_LOCK = text(
    """
    SELECT dispatch_id, task_id, specialist_id, owner, context_id, attempts + 1 AS attempts
      FROM dispatch_outbox
     WHERE status = 'pending' AND available_at <= now()
     ORDER BY available_at, dispatch_id
       FOR UPDATE SKIP LOCKED LIMIT :n
    """
)


@dataclass(frozen=True)
class OutboxRow:
    dispatch_id: int
    task_id: str
    specialist_id: str
    owner: str
    context_id: str
    attempts: int  # including the attempt about to be made

    @property
    def job_id(self) -> str:
        return job_id_for(self.task_id, self.dispatch_id)


def _rows(result) -> list[OutboxRow]:  # type: ignore[no-untyped-def]
    return sorted(
        (OutboxRow(r.dispatch_id, r.task_id, r.specialist_id, r.owner, r.context_id, r.attempts) for r in result),
        key=lambda row: row.dispatch_id,
    )


def take(conn: Connection, *, limit: int, lease_s: float, me: str) -> list[OutboxRow]:
    """Embedded: take up to ``limit`` due rows for ``lease_s`` (commit right after)."""
    return _rows(conn.execute(_TAKE, {"n": limit, "lease_s": lease_s, "me": me[:200]}))


def lock_due(conn: Connection, *, limit: int) -> list[OutboxRow]:
    """Cloud Tasks relay: lock up to ``limit`` due rows until the caller's transaction ends."""
    return _rows(conn.execute(_LOCK, {"n": limit}))


def renew(conn: Connection, dispatch_ids: list[int], *, lease_s: float) -> None:
    """Embedded: keep rows whose delivery is still in flight from coming due again."""
    if dispatch_ids:
        conn.execute(
            text(
                "UPDATE dispatch_outbox SET available_at = now() + make_interval(secs => :lease_s) "
                "WHERE dispatch_id = ANY(:ids) AND status = 'pending'"
            ),
            {"ids": dispatch_ids, "lease_s": lease_s},
        )


def mark_sent(conn: Connection, row: OutboxRow) -> None:
    conn.execute(
        text(
            "UPDATE dispatch_outbox SET status = 'sent', sent_at = now(), attempts = :a, last_error = NULL "
            "WHERE dispatch_id = :d AND status IN ('pending', 'sent')"
        ),
        {"d": row.dispatch_id, "a": row.attempts},
    )


def mark_delivered(conn: Connection, row: OutboxRow) -> None:
    """The worker answered for good (finished, already finished, unknown, stale): stop delivering."""
    conn.execute(
        text(
            "UPDATE dispatch_outbox SET status = 'done', finished_at = now(), last_error = NULL "
            "WHERE dispatch_id = :d AND status IN ('pending', 'sent')"
        ),
        {"d": row.dispatch_id},
    )


def reschedule(conn: Connection, row: OutboxRow, *, delay_s: float, error: str, count_attempt: bool = False) -> None:
    conn.execute(
        text(
            "UPDATE dispatch_outbox SET available_at = now() + make_interval(secs => :delay_s), last_error = :e, "
            "attempts = CASE WHEN :count THEN :a ELSE attempts END "
            "WHERE dispatch_id = :d AND status IN ('pending', 'sent')"
        ),
        {"d": row.dispatch_id, "delay_s": delay_s, "e": error[:500], "a": row.attempts, "count": count_attempt},
    )


def mark_undeliverable(conn: Connection, row: OutboxRow, *, error: str) -> None:
    conn.execute(
        text(
            "UPDATE dispatch_outbox SET status = 'undeliverable', finished_at = now(), last_error = :e "
            "WHERE dispatch_id = :d AND status IN ('pending', 'sent')"
        ),
        {"d": row.dispatch_id, "e": error[:500]},
    )


@functools.lru_cache(maxsize=4)
def _spec_deadlines(specs_dir: str) -> dict[str, float]:
    try:
        return {sid: loaded.spec.limits.deadline_s for sid, loaded in load_specs(Path(specs_dir)).items()}
    except SpecInvalid as invalid:  # the edge refuses to start on it; here the setting still bounds every job
        log.warning("specs cannot be read for their deadlines (%s); every job gets SPECIALISTS_DISPATCH_JOB_DEADLINE_S",
                    invalid.message)
        return {}


def job_deadline_s(settings: Settings, specialist_id: str) -> float:
    """A job's deadline: its spec's ``limits.deadline_s``, within ``dispatch_job_deadline_s`` (which keeps every
    job inside the dispatch deadline)."""
    spec_deadline = _spec_deadlines(str(settings.hosted.specs_dir)).get(specialist_id)
    if spec_deadline is None:
        return settings.dispatch.job_deadline_s
    return min(settings.dispatch.job_deadline_s, spec_deadline)


def build_job(row: OutboxRow, signer: JobSigner, settings: Settings, worker_url: str) -> DispatchJob:
    """The signed job for a row: its id, its task, the deadline; the message stays in the row."""
    deadline_s = job_deadline_s(settings, row.specialist_id)
    body = signer.sign(
        job_id=row.job_id,
        specialist_id=row.specialist_id,
        deadline_s=deadline_s,
        payload=task_payload(row.task_id, row.dispatch_id, row.owner, row.context_id),
    )
    return DispatchJob(
        job_id=row.job_id,
        specialist_id=row.specialist_id,
        body=body,
        worker_url=worker_url,
        deadline_s=deadline_s,
    )


def row_of_job(conn: Connection, job_id: str) -> OutboxRow:
    """The outbox row of a job id (``<task id>.<dispatch id>``): what a repeated delivery is signed from."""
    row = conn.execute(
        text("SELECT dispatch_id, task_id, specialist_id, owner, context_id, attempts FROM dispatch_outbox "
             "WHERE task_id || '.' || dispatch_id = :j"),
        {"j": job_id},
    ).one()
    return OutboxRow(*row)
