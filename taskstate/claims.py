"""The owner of ``job_claims`` and ``job_stale_reports``: at most one execution per job, whatever the deliveries do.

A claim row is unique per job. Claiming takes a lease and a fencing token that
grows on every claim; renewing and finishing name the token,
so a worker that lost its claim cannot extend it or report into it. Each call is
one server-side function, one round trip, at default isolation.

Every function takes a ``Connection`` so that callers can put it in their own
transaction: the finish, the task's final state and the ledger settlement commit
together (see ``workers.finish``), and a newly unknown job can be marked in the
ledger in the same transaction as the claim that discovered it. ``Claims`` wraps
an engine for callers that want one transaction per call.

The functions that decide by the clock (claim, renew, finish, expire_lease) take
``now``, as the ledger's do: None is the database clock, which is what workers
use; a time decides as of then (migration 0100), so a test lets a lease pass, or
keeps one alive, without waiting on the machine.

A specialist worker claims with ``claim_resumable`` (``specialist_claim``,
migration 0070): an expired lease of a job with a Monty checkpoint is resumed,
within ``max_resumes``. ``hold_fence`` is the share lock every fenced write of a
running job takes first. The queries that meet a job's outbox row join
``taskstate.outbox.jobs_relation``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection, Engine, text

from core.errors import ServiceError
from taskstate import outbox
from taskstate.ids import TaskRef

ClaimOutcome = Literal["claimed", "finished", "busy", "lease_expired_unknown"]
RenewOutcome = Literal["renewed", "expired", "fenced"]
FinishOutcome = Literal["finished", "already_finished", "stale"]
CancelOutcome = Literal["canceled_before_claim", "cancel_requested", "already_finished", "unknown"]
JobOutcome = Literal["completed", "failed", "canceled", "rejected", "input_required"]
JOB_OUTCOMES: tuple[str, ...] = ("completed", "failed", "canceled", "rejected", "input_required")


# CHECK constraints of migration 0020 (``worker_id``, ``cancel_reason``); every reason is kept within the latter.
MAX_WORKER_ID_CHARS = 200
MAX_REASON_CHARS = 500


class ClaimError(ServiceError):
    code = "claim_error"


@dataclass(frozen=True)
class ClaimResult:
    outcome: ClaimOutcome
    fencing_token: int
    lease_expires_at: datetime | None = None
    retry_after_s: float | None = None  # busy: when the current lease runs out
    job_outcome: str | None = None  # finished: the stored outcome
    job_outcome_detail: dict[str, Any] | None = None
    newly_unknown: bool = False  # this delivery found the expired lease (mark the ledger now)
    message: bytes | None = None  # claimed: the job's message, when the claim was asked to read it (``ref``)


@dataclass(frozen=True)
class RenewResult:
    outcome: RenewOutcome
    lease_expires_at: datetime | None
    cancel_requested: bool


@dataclass(frozen=True)
class FinishResult:
    outcome: FinishOutcome
    state: str  # the claim's state afterwards: finished, unknown, running (someone else's), none

    @property
    def accepted(self) -> bool:
        """True when this claim's outcome is the job's outcome (settle now, exactly once)."""
        return self.outcome in ("finished", "already_finished")


def _check_lease(lease_s: float) -> None:
    if not lease_s > 0:
        raise ClaimError(f"a lease must be positive, got {lease_s} s (SPECIALISTS_WORKER_LEASE_S)", code="lease_invalid")


def _aware(now: datetime | None) -> datetime | None:
    if now is not None and now.tzinfo is None:
        raise ClaimError("now must carry a time zone", code="now_invalid")
    return now


def _claim_sql(call: str, ref: TaskRef | None) -> str:
    """The claim function's row; with ``ref``, and only when the job was claimed, the job's message beside it:
    the run needs it next, and reading it here spares the job's process a connection and a round trip."""
    if ref is None:
        return f"SELECT *, CAST(NULL AS bytea) AS message FROM {call}"
    return (f"SELECT c.*, CASE WHEN c.outcome = 'claimed' THEN ({outbox.message_sql()}) END AS message "
            f"FROM {call} c")


def claim(conn: Connection, job_id: str, *, worker_id: str, lease_s: float, now: datetime | None = None,
          ref: TaskRef | None = None) -> ClaimResult:
    _check_lease(lease_s)
    row = conn.execute(
        text(_claim_sql("job_claim(:j, :w, :l, CAST(:n AS timestamptz))", ref)),
        {"j": job_id, "w": worker_id[:MAX_WORKER_ID_CHARS], "l": lease_s, "n": _aware(now), **_ref_params(ref)},
    ).mappings().one()
    return _claim_result(row)


def _ref_params(ref: TaskRef | None) -> dict[str, Any]:
    return {} if ref is None else outbox.message_params(ref)


def _claim_result(row: Any) -> ClaimResult:
    return ClaimResult(
        outcome=row["outcome"],
        fencing_token=int(row["fencing_token"]),
        lease_expires_at=row["lease_expires_at"],
        retry_after_s=row["retry_after_s"],
        job_outcome=row["job_outcome"],
        job_outcome_detail=row["job_outcome_detail"],
        newly_unknown=bool(row["newly_unknown"]),
        message=None if row["message"] is None else bytes(row["message"]),
    )


@dataclass(frozen=True)
class ResumableClaim:
    claim: ClaimResult
    resumed: bool


def claim_resumable(
    conn: Connection, job_id: str, *, worker_id: str, lease_s: float, max_resumes: int, now: datetime | None = None,
    ref: TaskRef | None = None,
) -> ResumableClaim:
    """``claim``, except that a running claim whose lease expired is claimed again (next token, ``resumed``) when the
    job has a checkpoint and fewer than ``max_resumes`` (SPECIALISTS_SPECIALIST_MAX_RESUMES) resumes, decided under
    the claim row's lock; without a checkpoint, or past the limit, the job becomes unknown exactly as before."""
    _check_lease(lease_s)
    row = conn.execute(
        text(_claim_sql("specialist_claim(:j, :w, :l, :m, CAST(:n AS timestamptz))", ref)),
        {"j": job_id, "w": worker_id[:MAX_WORKER_ID_CHARS], "l": lease_s, "m": max_resumes, "n": _aware(now),
         **_ref_params(ref)},
    ).mappings().one()
    return ResumableClaim(claim=_claim_result(row), resumed=bool(row["resumed"]))


_FENCE_SELECT = (
    "SELECT 1 FROM job_claims WHERE job_id = :j AND fencing_token = :t AND state = 'running' "
    "AND lease_expires_at > clock_timestamp() FOR SHARE"
)
_FENCE = text(_FENCE_SELECT)


def fence_cte(name: str = "fence") -> str:
    """``hold_fence`` as a common table expression (parameters ``:j``, the job id, and ``:t``, the fencing
    token): a fenced write in one statement makes its write conditional on ``EXISTS (SELECT 1 FROM <name>)``
    and reads that too, to tell a lost claim. The share lock is taken before the write and held to the commit."""
    return f"{name} AS ({_FENCE_SELECT})"


def hold_fence(conn: Connection, job_id: str, fencing_token: int) -> bool:
    """In the caller's transaction: share-lock the claim and tell whether it is still this running, live claim.
    A finish or a lease expiry cannot slip in between this check and the caller's write."""
    return conn.execute(_FENCE, {"j": job_id, "t": fencing_token}).first() is not None


def renew(
    conn: Connection, job_id: str, *, fencing_token: int, lease_s: float, now: datetime | None = None
) -> RenewResult:
    _check_lease(lease_s)
    row = conn.execute(
        text("SELECT * FROM job_renew(:j, :t, :l, CAST(:n AS timestamptz))"),
        {"j": job_id, "t": fencing_token, "l": lease_s, "n": _aware(now)},
    ).mappings().one()
    return RenewResult(row["outcome"], row["lease_expires_at"], bool(row["cancel_requested"]))


_FINISH_CALL = ("job_finish(:finish_job_id, :finish_token, :finish_outcome, CAST(:finish_detail AS jsonb), "
                ":finish_worker_id, CAST(:finish_now AS timestamptz))")


def finish_params(job_id: str, *, fencing_token: int, outcome: str, detail: dict[str, Any] | None, worker_id: str,
                  now: datetime | None = None) -> dict[str, Any]:
    """The parameters of ``finish`` and ``finish_cte``, checked."""
    if outcome not in JOB_OUTCOMES:
        raise ClaimError(f"job outcome {outcome!r} is not one of {JOB_OUTCOMES}", code="outcome_invalid")
    return {
        "finish_job_id": job_id,
        "finish_token": fencing_token,
        "finish_outcome": outcome,
        "finish_detail": None if detail is None else json.dumps(detail, sort_keys=True),
        "finish_worker_id": worker_id[:MAX_WORKER_ID_CHARS],
        "finish_now": _aware(now),
    }


def finish_cte(name: str) -> str:
    """``finish`` as a common table expression ``name`` (outcome, state), for a statement that settles the job in
    the same round trip (``workers.settlement``): what it writes must depend on ``name`` (``finished_in``), so
    that the claim row is locked, and the finish decided, before anything else (the lock order: claim first)."""
    return f"{name} AS MATERIALIZED (SELECT * FROM {_FINISH_CALL})"


def finished_in(name: str) -> str:
    """A condition true once the finish ``name`` (``finish_cte``) was accepted for the first time: PostgreSQL
    evaluates it once, before the statement it guards touches a row."""
    return f"EXISTS (SELECT 1 FROM {name} WHERE outcome = 'finished')"


def finish(
    conn: Connection,
    job_id: str,
    *,
    fencing_token: int,
    outcome: str,
    detail: dict[str, Any] | None,
    worker_id: str,
    now: datetime | None = None,
) -> FinishResult:
    params = finish_params(job_id, fencing_token=fencing_token, outcome=outcome, detail=detail, worker_id=worker_id,
                           now=now)
    row = conn.execute(text(f"SELECT * FROM {_FINISH_CALL}"), params).mappings().one()
    return FinishResult(row["outcome"], row["state"])


def release(conn: Connection, job_id: str, *, fencing_token: int) -> bool:
    """Give a claim back before any work started; the next delivery re-claims it (token + 1)."""
    return bool(conn.execute(text("SELECT job_release(:j, :t)"), {"j": job_id, "t": fencing_token}).scalar())


def request_cancel(conn: Connection, job_id: str, *, reason: str) -> CancelOutcome:
    """Cancel from any API instance: before a claim the job never runs; while running the worker
    sees it at its next heartbeat (the cancellation bound is worker_heartbeat_s)."""
    return conn.execute(text("SELECT job_request_cancel(:j, :r)"), {"j": job_id, "r": reason[:MAX_REASON_CHARS]}).scalar_one()


def resolve_unknown(conn: Connection, job_id: str, *, outcome: str, reason: str, operator: str) -> bool:
    """An operator's verdict on an unknown job. False when the job is not unknown."""
    if outcome not in JOB_OUTCOMES:
        raise ClaimError(f"job outcome {outcome!r} is not one of {JOB_OUTCOMES}", code="outcome_invalid")
    if not reason.strip():
        raise ClaimError("resolving an unknown outcome needs a reason (--reason)", code="reason_required")
    return bool(
        conn.execute(
            text("SELECT job_resolve_unknown(:j, :o, :r, :p)"),
            {"j": job_id, "o": outcome, "r": reason.strip()[:MAX_REASON_CHARS], "p": operator},
        ).scalar()
    )


def expire_lease(conn: Connection, job_id: str, *, now: datetime | None = None) -> tuple[bool, int | None]:
    """The lease sweeper's call: a running claim whose lease passed becomes unknown.
    Returns (whether this call made it unknown, the claim's fencing token)."""
    row = conn.execute(
        text("SELECT * FROM job_expire_lease(:j, CAST(:n AS timestamptz))"), {"j": job_id, "n": _aware(now)}
    ).one()
    return bool(row.expired), row.fencing_token


def abandon(conn: Connection, job_id: str, *, reason: str) -> bool:
    """Finish a job no worker ever claimed as failed, so that no later delivery runs it.
    False when a claim exists (a worker has it, had it, or a cancel got there first)."""
    return bool(conn.execute(text("SELECT job_abandon(:j, :r)"), {"j": job_id, "r": reason[:MAX_REASON_CHARS]}).scalar())


# --- the claims of a task's jobs (joined to their outbox rows) -------------------------------

_TASK_JOBS = text(
    f"SELECT c.state, c.claims FROM {outbox.jobs_relation()} o JOIN job_claims c ON c.job_id = o.job_id "
    "WHERE o.task_id = :t"
)


@dataclass(frozen=True)
class TaskJobs:
    """What the claims of a task's jobs say."""

    any_claimed: bool  # a worker ever claimed one: work started
    any_unknown: bool  # one's outcome is unknown (its row may be closed: the claim decides)


def task_jobs(conn: Connection, task_id: str) -> TaskJobs:
    rows = conn.execute(_TASK_JOBS, {"t": task_id}).all()
    return TaskJobs(any(r.claims > 0 for r in rows), any(r.state == "unknown" for r in rows))


@dataclass(frozen=True)
class DispatchedJob:
    job_id: str
    ref: TaskRef


_EXPIRED = text(
    f"SELECT c.job_id, o.task_id, o.dispatch_id, o.owner, o.context_id "
    f"FROM job_claims c JOIN {outbox.jobs_relation()} o ON o.job_id = c.job_id "
    "WHERE c.state = 'running' AND c.lease_expires_at < clock_timestamp() AND o.status IN ('pending', 'sent') "
    "AND NOT specialist_resumable(c.job_id, :max_resumes, :window_s) "
    "ORDER BY c.lease_expires_at LIMIT :n"
)


def expired_dispatched(conn: Connection, *, limit: int, max_resumes: int, resume_window_s: float
                       ) -> list[DispatchedJob]:
    """Dispatched jobs whose running claim's lease passed and that no later delivery may resume: the lease
    sweeper's work, oldest lease first."""
    rows = conn.execute(_EXPIRED, {"n": limit, "max_resumes": max_resumes, "window_s": resume_window_s}).all()
    return [DispatchedJob(r.job_id, TaskRef(r.task_id, int(r.dispatch_id), r.owner, r.context_id)) for r in rows]


# Handed to Cloud Tasks longer ago than any delivery of its body can run, and never claimed (no claim row:
# a cancel or an earlier give-up writes one too).
_ABANDONED = text(
    f"SELECT o.dispatch_id, o.task_id, o.specialist_id, o.owner, o.context_id, o.attempts FROM {outbox.jobs_relation()} o "
    "WHERE o.status = 'sent' AND o.sent_at < clock_timestamp() - make_interval(secs => :after_s) "
    "AND NOT EXISTS (SELECT 1 FROM job_claims c WHERE c.job_id = o.job_id) "
    "ORDER BY o.sent_at LIMIT :n"
)


def sent_never_claimed(conn: Connection, *, sent_before_s: float, limit: int) -> list[outbox.OutboxRow]:
    """Rows handed to Cloud Tasks more than ``sent_before_s`` ago whose job no worker ever claimed."""
    rows = conn.execute(_ABANDONED, {"after_s": sent_before_s, "n": limit}).all()
    return [outbox.OutboxRow(int(r.dispatch_id), r.task_id, r.specialist_id, r.owner, r.context_id, int(r.attempts))
            for r in rows]


_UNKNOWN_OF_TASK = text(
    f"SELECT c.job_id, o.task_id, o.dispatch_id, o.owner, o.context_id "
    f"FROM {outbox.jobs_relation()} o JOIN job_claims c ON c.job_id = o.job_id "
    "WHERE o.task_id = :task AND c.state = 'unknown' ORDER BY o.dispatch_id FOR UPDATE OF c"
)


def unknown_of_task(conn: Connection, task_id: str) -> list[DispatchedJob]:
    """The task's jobs whose outcome is unknown, their claims locked (an operator's reconcile)."""
    rows = conn.execute(_UNKNOWN_OF_TASK, {"task": task_id}).all()
    return [DispatchedJob(r.job_id, TaskRef(r.task_id, int(r.dispatch_id), r.owner, r.context_id)) for r in rows]


def unknown_tasks_relation() -> str:
    """Tasks with a job whose outcome is unknown, as a sub-query (task_id, unknown_at, unknown_reason)."""
    return (f"(SELECT o.task_id, c.unknown_at, c.unknown_reason FROM job_claims c "
            f"JOIN {outbox.jobs_relation()} o ON o.job_id = c.job_id WHERE c.state = 'unknown')")


def get(conn: Connection, job_id: str) -> dict[str, Any] | None:
    row = conn.execute(text("SELECT * FROM job_claims WHERE job_id = :j"), {"j": job_id}).mappings().first()
    return dict(row) if row else None


def list_unknown(conn: Connection, limit: int = 100) -> list[dict[str, Any]]:
    rows = conn.execute(
        text(
            "SELECT job_id, fencing_token, worker_id, unknown_at, unknown_reason, deliveries FROM job_claims "
            "WHERE state = 'unknown' ORDER BY unknown_at LIMIT :n"
        ),
        {"n": limit},
    ).mappings()
    return [dict(row) for row in rows]


def list_stale_reports(conn: Connection, job_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    rows = conn.execute(
        text(
            "SELECT * FROM job_stale_reports WHERE (CAST(:j AS text) IS NULL OR job_id = :j) "
            "ORDER BY report_id LIMIT :n"
        ),
        {"j": job_id, "n": limit},
    ).mappings()
    return [dict(row) for row in rows]


class Claims:
    """The claim calls, each in its own transaction (one round trip each)."""

    def __init__(self, engine: Engine, *, worker_id: str, lease_s: float) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.lease_s = lease_s

    def claim(self, job_id: str) -> ClaimResult:
        with self.engine.begin() as conn:
            return claim(conn, job_id, worker_id=self.worker_id, lease_s=self.lease_s)

    def renew(self, job_id: str, fencing_token: int) -> RenewResult:
        with self.engine.begin() as conn:
            return renew(conn, job_id, fencing_token=fencing_token, lease_s=self.lease_s)

    def finish(self, job_id: str, fencing_token: int, outcome: str, detail: dict[str, Any] | None) -> FinishResult:
        with self.engine.begin() as conn:
            return finish(
                conn, job_id, fencing_token=fencing_token, outcome=outcome, detail=detail, worker_id=self.worker_id
            )

    def release(self, job_id: str, fencing_token: int) -> bool:
        with self.engine.begin() as conn:
            return release(conn, job_id, fencing_token=fencing_token)


def may_resume_relation() -> str:
    """The jobs whose claim is running or released, as ``(job_id)``: the only ones a later delivery may resume,
    for owners that keep something only while a resume may need it (a job's checkpoints)."""
    return "(SELECT job_id FROM job_claims WHERE state IN ('running', 'released'))"
