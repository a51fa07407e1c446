"""The owner of ``job_claims`` and ``job_stale_reports``: at most one execution per job, whatever the deliveries do.

A claim row is unique per job. Claiming takes a lease and a fencing token that
grows on every claim; renewing and finishing name the token,
so a worker that lost its claim cannot extend it or report into it. Each call is
one server-side function, one round trip, at default isolation.

Every function takes a ``Connection`` so that callers can put it in their own
transaction: the finish, the task's final state and the ledger settlement commit
together (see ``workers.finish``), and a newly unknown job can be marked in the
ledger in the same transaction as the claim that discovered it. The finish is
also a fragment (``FINISH``, ``core.fragments``) that the settlement composes into
its one statement, and ``finished_in`` is the condition its other writes take.

The functions that decide by the clock (claim, renew, finish, expire_lease) take
``now``, as the ledger's do: None is the database clock, which is what workers
use; a time decides as of then (migration 0100), so a test lets a lease pass, or
keeps one alive, without waiting on the machine.

A job's first delivery is claimed by ``claim_first`` (``job_claim_first``, migration 0292): one statement in
autocommit that only inserts the claim, and returns nothing when the job was claimed before; the worker then
claims it with ``claim`` in a transaction, which decides every other case.

A specialist worker claims with ``claim_resumable`` (``specialist_claim``,
migration 0070): an expired lease of a job with a Monty checkpoint is resumed,
within ``max_resumes``. ``hold_fence`` is the share lock every fenced write of a
running job takes first. The queries that meet a job's outbox row join
``taskstate.outbox.jobs_relation``: from the row by the job id it builds, from a
claim by ``outbox.of_job_sql``, so each side is a primary-key lookup (issue 18).

A job that serves a task (``ref``) is claimed only while its outbox row exists
(``outbox.claimable_cte``): a delivery of a job whose records were pruned past
their retention is ``gone`` and runs nothing. That claim is one composed
statement (``claims.job_claim``, ``claims.specialist_claim``) that also reads, for
a claimed job, its message and its task's reserved credits (``admitted.HOLD``):
the figures a runner states come from them. Finished claims are pruned
(``prune_finished``) past ``SPECIALISTS_JOB_CLAIMS_RETENTION_DAYS``, and only once
their job's outbox row is gone; running and unknown claims never are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from sqlalchemy import Connection, text

from core.errors import ServiceError
from core.fragments import Fragment, Statement, compose
from taskstate import admitted, liveness, outbox
from taskstate.ids import TaskRef
from taskstate.pages import Page, page_of

# gone: the job serves a task but has no outbox row (finished and pruned past its retention): never run.
ClaimOutcome = Literal["claimed", "finished", "busy", "lease_expired_unknown", "gone"]
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
    # claimed: the credits its task reserved at admission (``admitted.HOLD``, 0 for a free task), read with the
    # message; None for a raw job, or an unclaimed one. Every credit figure a runner states comes from it.
    reserved_credits: int | None = None

    def __post_init__(self) -> None:
        if self.outcome == "claimed":  # a claim holds a lease under a token no earlier claim of the job had
            assert self.fencing_token >= 1 and self.lease_expires_at is not None, self
        assert self.reserved_credits is None or self.reserved_credits >= 0, self


@dataclass(frozen=True)
class RenewResult:
    outcome: RenewOutcome
    lease_expires_at: datetime | None
    cancel_requested: bool


@dataclass(frozen=True)
class FinishResult:
    outcome: FinishOutcome
    state: str  # the claim's state afterwards: finished, unknown, running (someone else's), none

    def __post_init__(self) -> None:
        # A claim finishes once: an accepted finish (the first, or the same one again) leaves it finished.
        assert not self.accepted or self.state == "finished", self

    @property
    def accepted(self) -> bool:
        """True when this claim's outcome is the job's outcome (settle now, exactly once)."""
        return self.outcome in ("finished", "already_finished")


def _check_lease(lease_s: float) -> None:
    if not lease_s > 0:
        raise ClaimError(f"a lease must be positive, got {lease_s} s (SPECIALISTS_WORKER_LEASE_S)", code="lease_invalid")


def _check_dead_after(dead_after_s: float) -> None:
    if not dead_after_s > 0:
        raise ClaimError(f"a dead worker's bound must be positive, got {dead_after_s} s "
                         "(SPECIALISTS_WORKER_DEAD_AFTER_BEATS x SPECIALISTS_WORKER_BEAT_S)", code="dead_after_invalid")


def _aware(now: datetime | None) -> datetime | None:
    if now is not None and now.tzinfo is None:
        raise ClaimError("now must carry a time zone", code="now_invalid")
    return now


_CLAIM_ARGUMENTS = {"job_claim": ":w, :l, CAST(:n AS timestamptz)",
                    "specialist_claim": ":w, :l, :m, CAST(:n AS timestamptz)"}
_CLAIM_PARAMS = {"job_claim": ("j", "w", "l", "n"), "specialist_claim": ("j", "w", "l", "m", "n")}


def _raw_claim(function: str) -> str:
    return (f"SELECT *, CAST(NULL AS bytea) AS message, CAST(NULL AS bigint) AS reserved_credits "
            f"FROM {function}(:j, {_CLAIM_ARGUMENTS[function]})")


def _task_claim(function: str) -> Statement:
    """The claim function's row over the job's outbox row (``outbox.claimable_cte``; no row, no claim, no result
    row), and beside it, when the job was claimed, the job's message and its task's reserved credits
    (``admitted.HOLD``): the run needs both next, and reading them here spares the job's process a connection
    and a round trip."""
    return compose(
        f"claims.{function}",
        f"""WITH {outbox.claimable_cte('job')}
        SELECT c.*, CASE WHEN c.outcome = 'claimed' THEN job.message END AS message,
               CASE WHEN c.outcome = 'claimed' THEN hold.reserved_credits END AS reserved_credits
          FROM job CROSS JOIN LATERAL {function}(job.job_id, {_CLAIM_ARGUMENTS[function]}) c
          LEFT JOIN {{hold}} AS hold ON true""",
        own=(*_CLAIM_PARAMS[function], "message_dispatch_id", "message_task_id"),
        hold=admitted.HOLD.relation(),
    )


_CLAIMS_OF_TASK_JOBS = {function: _task_claim(function) for function in _CLAIM_ARGUMENTS}


def _claim_row(conn: Connection, function: str, params: dict[str, Any], ref: TaskRef | None) -> Any:
    if ref is None:
        return conn.execute(text(_raw_claim(function)), params).mappings().first()
    params = {**params, **outbox.message_params(ref), "task_id": ref.task_id}
    return _CLAIMS_OF_TASK_JOBS[function].execute(conn, params).mappings().first()


def claim(conn: Connection, job_id: str, *, worker_id: str, lease_s: float, now: datetime | None = None,
          ref: TaskRef | None = None) -> ClaimResult:
    _check_lease(lease_s)
    row = _claim_row(conn, "job_claim",
                     {"j": job_id, "w": worker_id[:MAX_WORKER_ID_CHARS], "l": lease_s, "n": _aware(now)}, ref)
    return _claim_result(row)


GONE = ClaimResult(outcome="gone", fencing_token=0)


# A job's first claim alone (``job_claim_first``, migration 0292): the claim columns ``_claim_result`` reads.
_FIRST_COLUMNS = ("'claimed' AS outcome, c.fencing_token, c.lease_expires_at, "
                  "CAST(NULL AS float8) AS retry_after_s, CAST(NULL AS text) AS job_outcome, "
                  "CAST(NULL AS jsonb) AS job_outcome_detail, false AS newly_unknown")
_RAW_FIRST_CLAIM = text(f"SELECT {_FIRST_COLUMNS}, CAST(NULL AS bytea) AS message, "
                        "CAST(NULL AS bigint) AS reserved_credits "
                        "FROM job_claim_first(:j, :w, :l, CAST(:n AS timestamptz)) c")
_TASK_FIRST_CLAIM = compose(
    "claims.job_claim_first",
    f"""WITH {outbox.claimable_cte('job')}
    SELECT {_FIRST_COLUMNS}, job.message, hold.reserved_credits
      FROM job CROSS JOIN LATERAL job_claim_first(job.job_id, :w, :l, CAST(:n AS timestamptz)) c
      LEFT JOIN {{hold}} AS hold ON true""",
    own=("j", "w", "l", "n", "message_dispatch_id", "message_task_id"),
    hold=admitted.HOLD.relation(),
)


def claim_first(conn: Connection, job_id: str, *, worker_id: str, lease_s: float, now: datetime | None = None,
                ref: TaskRef | None = None) -> ClaimResult | None:
    """The job's first claim, when no claim of it exists yet: ``claimed`` with token 1, and for a task's job its
    message and reserved credits, as ``claim`` returns them. None: the job was claimed before (or its outbox row is
    gone), and the caller claims it with ``claim`` or ``claim_resumable``, which decide every other case. It
    decides nothing else, so one statement in autocommit is the whole of it (issue 44: no ``BEGIN`` and
    ``COMMIT`` around a job's usual claim)."""
    _check_lease(lease_s)
    params = {"j": job_id, "w": worker_id[:MAX_WORKER_ID_CHARS], "l": lease_s, "n": _aware(now)}
    if ref is None:
        row = conn.execute(_RAW_FIRST_CLAIM, params).mappings().first()
    else:
        found = _TASK_FIRST_CLAIM.rows(conn, {**params, **outbox.message_params(ref), "task_id": ref.task_id})
        row = found[0] if found else None
    return None if row is None else _claim_result(row)


def _claim_result(row: Any) -> ClaimResult:
    if row is None:  # the job's outbox row is gone: nothing was claimed
        return GONE
    return ClaimResult(
        outcome=row["outcome"],
        fencing_token=int(row["fencing_token"]),
        lease_expires_at=row["lease_expires_at"],
        retry_after_s=row["retry_after_s"],
        job_outcome=row["job_outcome"],
        job_outcome_detail=row["job_outcome_detail"],
        newly_unknown=bool(row["newly_unknown"]),
        message=None if row["message"] is None else bytes(row["message"]),
        reserved_credits=None if row["reserved_credits"] is None else int(row["reserved_credits"]),
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
    row = _claim_row(conn, "specialist_claim", {"j": job_id, "w": worker_id[:MAX_WORKER_ID_CHARS], "l": lease_s,
                                                "m": max_resumes, "n": _aware(now)}, ref)
    return ResumableClaim(claim=_claim_result(row), resumed=row is not None and bool(row["resumed"]))


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


_FINISH_CALL = ("job_finish(:job_id, :finish_token, :finish_outcome, CAST(:finish_detail AS jsonb), "
                ":finish_worker_id, CAST(:finish_now AS timestamptz))")


def finish_params(job_id: str, *, fencing_token: int, outcome: str, detail: dict[str, Any] | None, worker_id: str,
                  now: datetime | None = None) -> dict[str, Any]:
    """The parameters of ``finish`` and ``FINISH``, checked."""
    if outcome not in JOB_OUTCOMES:
        raise ClaimError(f"job outcome {outcome!r} is not one of {JOB_OUTCOMES}", code="outcome_invalid")
    return {
        "job_id": job_id,
        "finish_token": fencing_token,
        "finish_outcome": outcome,
        "finish_detail": None if detail is None else json.dumps(detail, sort_keys=True),
        "finish_worker_id": worker_id[:MAX_WORKER_ID_CHARS],
        "finish_now": _aware(now),
    }


# ``finish`` as a common table expression (outcome, state), for a statement that settles the job in the same round
# trip (``workers.settlement``): what it writes must depend on it (``finished_in``), so that the claim row is
# locked, and the finish decided, before anything else (the lock order: claim first). Place it materialized.
# Parameters: ``finish_params``.
FINISH = Fragment.of("taskstate.claims", f"SELECT * FROM {_FINISH_CALL}",
                     ("job_id", "finish_token", "finish_outcome", "finish_detail", "finish_worker_id", "finish_now"))
_FINISH = FINISH.standalone("claims.finish")


def finished_in(name: str) -> str:
    """A condition true once the finish ``name`` (``FINISH``) was accepted for the first time: PostgreSQL
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
    row = _FINISH.execute(conn, params).mappings().one()
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
    fencing_token: int | None = None  # the running claim's, where the query read it (``dead_holders``)


# The running claims' partial index by lease (``job_claims_running_lease``), then each one's outbox row by its
# primary key. It joined on the built job id before, a sequential scan of the outbox per expired lease (issue 18).
# now(), not clock_timestamp(): a volatile bound is no index condition. job_expire_lease decides by the clock.
EXPIRED_SQL = (
    f"SELECT c.job_id, o.task_id, o.dispatch_id, o.owner, o.context_id "
    f"FROM job_claims c CROSS JOIN {outbox.of_job_sql('c.job_id')} o "
    "WHERE c.state = 'running' AND c.lease_expires_at < now() AND o.status IN ('pending', 'sent') "
    "AND NOT specialist_resumable(c.job_id, :max_resumes, :window_s) "
    "ORDER BY c.lease_expires_at LIMIT :n"
)
_EXPIRED = text(EXPIRED_SQL)


def expired_dispatched(conn: Connection, *, limit: int, max_resumes: int, resume_window_s: float
                       ) -> list[DispatchedJob]:
    """Dispatched jobs whose running claim's lease passed and that no later delivery may resume: the lease
    sweeper's work, oldest lease first, in one statement whatever their number."""
    rows = conn.execute(_EXPIRED, {"n": limit, "max_resumes": max_resumes, "window_s": resume_window_s}).all()
    return [DispatchedJob(r.job_id, TaskRef(r.task_id, int(r.dispatch_id), r.owner, r.context_id)) for r in rows]


# The running claims of workers that stopped beating (``liveness.stopped_beating_sql``): the running claims' partial
# index by lease (``job_claims_running_lease``), each one's beat and outbox row by primary key. A worker killed without
# a word leaves claims whose leases still run; its beat row, aging, says sooner that it is gone (issue 44 §4). A job a
# later delivery may resume (``specialist_resumable``) is left to its lease and that delivery, as above.
DEAD_HOLDERS_SQL = (
    f"SELECT c.job_id, c.fencing_token, o.task_id, o.dispatch_id, o.owner, o.context_id "
    f"FROM job_claims c CROSS JOIN {outbox.of_job_sql('c.job_id')} o "
    f"WHERE c.state = 'running' AND c.lease_expires_at IS NOT NULL AND {liveness.stopped_beating_sql('c.worker_id')} "
    "AND o.status IN ('pending', 'sent') AND NOT specialist_resumable(c.job_id, :max_resumes, :window_s) "
    "ORDER BY c.lease_expires_at LIMIT :n"
)
_DEAD_HOLDERS = text(DEAD_HOLDERS_SQL)


def dead_holders(conn: Connection, *, dead_after_s: float, limit: int, max_resumes: int, resume_window_s: float
                 ) -> list[DispatchedJob]:
    """Dispatched jobs running under a claim of a worker whose last beat is older than ``dead_after_s`` (it died
    without a word), whose lease has not passed yet, and that no later delivery may resume; with their tokens."""
    _check_dead_after(dead_after_s)
    rows = conn.execute(_DEAD_HOLDERS, {"n": limit, "dead_after_s": dead_after_s, "max_resumes": max_resumes,
                                        "window_s": resume_window_s}).all()
    return [DispatchedJob(r.job_id, TaskRef(r.task_id, int(r.dispatch_id), r.owner, r.context_id), int(r.fencing_token))
            for r in rows]


# A running claim recorded unknown before its lease passed: its worker is gone (it stopped beating), or is giving the
# job up as it stops. What job_expire_lease writes, with the reason; the claim row's lock orders it against a renewal
# or a finish of the same claim, and the token and state are decided under it. With ``:dead_after_s`` given, only
# while the holder's beat is still that old.
_RECORD_UNKNOWN = text(
    "UPDATE job_claims c SET state = 'unknown', unknown_at = clock_timestamp(), lease_expires_at = NULL, "
    "unknown_reason = left(format('claim %s (worker %s) was running, its lease to %s: %s', c.fencing_token, "
    f"c.worker_id, c.lease_expires_at, CAST(:why AS text)), {MAX_REASON_CHARS}) "
    "WHERE c.job_id = :j AND c.fencing_token = :t AND c.state = 'running' "
    f"AND (CAST(:dead_after_s AS double precision) IS NULL OR {liveness.stopped_beating_sql('c.worker_id')}) "
    "RETURNING c.fencing_token"
)


def record_unknown(conn: Connection, job_id: str, *, fencing_token: int, why: str,
                   holder_dead_after_s: float | None = None) -> bool:
    """Record the running claim ``fencing_token`` of ``job_id`` unknown now, without waiting for its lease: the work
    may have happened, so it is never run again and its money stays held for an operator. With
    ``holder_dead_after_s``, only while its worker's last beat is older than that. False when the claim is no longer
    that running claim (finished, renewed by a live holder, already unknown)."""
    if holder_dead_after_s is not None:
        _check_dead_after(holder_dead_after_s)
    row = conn.execute(_RECORD_UNKNOWN, {"j": job_id, "t": fencing_token, "why": why,
                                         "dead_after_s": holder_dead_after_s}).first()
    return row is not None


# Handed to Cloud Tasks longer ago than any delivery of its body can run, and never claimed (no claim row:
# a cancel or an earlier give-up writes one too). The sent rows' partial index by hand-over time
# (``dispatch_outbox_sent``, migration 0190), then each one's claim by its primary key: what it reads is the
# rows sent before the bound and still sent (abandoned, or unknown until an operator reconciles them), not the
# outbox (a sequential scan of it every sweep before, issue 18).
ABANDONED_SQL = (
    f"SELECT o.dispatch_id, o.task_id, o.specialist_id, o.owner, o.context_id, o.attempts FROM {outbox.jobs_relation()} o "
    "WHERE o.status = 'sent' AND o.sent_at < now() - make_interval(secs => :after_s) "
    "AND NOT EXISTS (SELECT 1 FROM job_claims c WHERE c.job_id = o.job_id) "
    "ORDER BY o.sent_at LIMIT :n"
)
_ABANDONED = text(ABANDONED_SQL)


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
            f"CROSS JOIN {outbox.of_job_sql('c.job_id')} o WHERE c.state = 'unknown')")


def task_unknown_sql(task_id: str) -> str:
    """A condition: the task (the expression ``task_id``) has a job whose outcome is unknown now (an operator's
    reconcile ends that). Its outbox rows by the task's index, each one's claim by its key: ``OFFSET 0`` keeps it a
    lookup per task, where the planner would otherwise hash every unknown claim's outbox row, the whole outbox."""
    return (f"EXISTS (SELECT 1 FROM {outbox.jobs_relation()} o JOIN job_claims c ON c.job_id = o.job_id "
            f"WHERE o.task_id = {task_id} AND c.state = 'unknown' OFFSET 0)")


def queued_sql(job_id: str) -> str:
    """A condition: the job (the expression ``job_id``) is not yet taken by a worker: no claim, or one given back
    (released) for the next delivery. Its claim by its key."""
    return (f"NOT EXISTS (SELECT 1 FROM job_claims c WHERE c.job_id = {job_id} "
            "AND c.state IN ('running', 'finished', 'unknown'))")


# The claims that ended within the window a worker list reads at most, newest first. A busy worker is seen by its
# running claims whatever this is; these add the ones idle now that worked within the window. A busy service ends
# more jobs in ten minutes than that needs, and the planner, which cannot estimate a window on this index's
# expression, reads it newest first only under a bound this small.
WORKERS_SEEN_MAX_ENDED_CLAIMS = 1_000

# Workers that claimed or renewed a job since :since: the running claims (their partial index by lease), and the
# claims that ended since then (finished or released: job_claims_finished, newest first, at most :scan; unknown:
# job_claims_unknown). A claim last claimed or renewed after :since ended after it too, so each index range
# holds every such claim; the condition on the claim's own times keeps exactly them.
_SEEN = (
    "SELECT c.worker_id, c.state, GREATEST(c.claimed_at, c.renewed_at) AS seen_at FROM job_claims c "
    "WHERE c.state = 'running' AND c.worker_id IS NOT NULL "
    "UNION ALL (SELECT c.worker_id, c.state, GREATEST(c.claimed_at, c.renewed_at) FROM job_claims c "
    "WHERE c.state IN ('finished', 'released') AND COALESCE(c.finished_at, c.claimed_at) >= :since "
    "ORDER BY COALESCE(c.finished_at, c.claimed_at) DESC LIMIT :scan) "
    "UNION ALL SELECT c.worker_id, c.state, GREATEST(c.claimed_at, c.renewed_at) FROM job_claims c "
    "WHERE c.state = 'unknown' AND c.unknown_at >= :since"
)
WORKERS_SEEN_SQL = (
    f"SELECT worker_id, max(seen_at) AS last_seen_at, count(*) FILTER (WHERE state = 'running') AS running_jobs "
    f"FROM ({_SEEN}) seen WHERE worker_id IS NOT NULL AND seen_at >= :since "
    "GROUP BY worker_id ORDER BY last_seen_at DESC, worker_id LIMIT :n"
)
_WORKERS_SEEN = text(WORKERS_SEEN_SQL)


@dataclass(frozen=True)
class WorkerSeen:
    worker_id: str
    last_seen_at: datetime  # its last claim or lease renewal
    running_jobs: int  # claims it holds now


def workers_seen(conn: Connection, *, since: datetime, limit: int) -> list[WorkerSeen]:
    """The workers that claimed or renewed a job since ``since``, the most recent first (at most ``limit``), from the
    running claims, the unknown ones and the newest ``WORKERS_SEEN_MAX_ENDED_CLAIMS`` that ended since. A worker
    with no job writes nothing here, so it is not seen."""
    rows = conn.execute(_WORKERS_SEEN, {"since": since, "n": limit, "scan": WORKERS_SEEN_MAX_ENDED_CLAIMS}).all()
    return [WorkerSeen(r.worker_id, r.last_seen_at, int(r.running_jobs)) for r in rows]


_TASK_CLAIMS = text(
    "SELECT c.job_id, c.state, c.worker_id, c.claims, c.deliveries, c.first_claimed_at, c.claimed_at, c.renewed_at, "
    "c.lease_expires_at, c.unknown_at, c.unknown_reason, c.outcome, "
    "(SELECT count(*) FROM job_stale_reports s WHERE s.job_id = c.job_id) AS stale_reports "
    f", o.task_id FROM {outbox.jobs_relation()} o JOIN job_claims c ON c.job_id = o.job_id "
    "WHERE o.task_id = ANY (CAST(:ts AS text[])) ORDER BY o.task_id, o.dispatch_id"
)


def tasks_claims(conn: Connection, task_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The claims of the tasks' jobs (those whose outbox rows are kept), by task, in dispatch order, in one
    statement: which worker held each, how often it was claimed and delivered, its lease, and what the sweeper
    recorded when it went unknown (the evidence an operator reconciles from: the console's reservations,
    `specialists reservations show`)."""
    found: dict[str, list[dict[str, Any]]] = {task_id: [] for task_id in task_ids}
    for row in conn.execute(_TASK_CLAIMS, {"ts": list(task_ids)}).mappings():
        claim = dict(row)
        found[claim.pop("task_id")].append(claim)
    return found


def task_claims(conn: Connection, task_id: str) -> list[dict[str, Any]]:
    """One task's (``tasks_claims``)."""
    return tasks_claims(conn, [task_id])[task_id]


_UNKNOWN_COUNT = text("SELECT count(*) FROM (SELECT 1 FROM job_claims WHERE state = 'unknown' LIMIT :cap) u")


def unknown_count(conn: Connection, *, cap: int) -> int:
    """Jobs whose outcome is unknown now, holding their credits until an operator reconciles them (at most ``cap``:
    the job_claims_unknown index range)."""
    return int(conn.execute(_UNKNOWN_COUNT, {"cap": cap}).scalar_one())


def get(conn: Connection, job_id: str) -> dict[str, Any] | None:
    row = conn.execute(text("SELECT * FROM job_claims WHERE job_id = :j"), {"j": job_id}).mappings().first()
    return dict(row) if row else None


_CPU_SECONDS = text("SELECT job_id, (outcome_detail ->> 'cpu_seconds')::float8 AS cpu_seconds FROM job_claims "
                    "WHERE job_id = ANY(:jobs) AND outcome_detail ? 'cpu_seconds'")


def cpu_seconds_of(conn: Connection, job_ids: list[str]) -> dict[str, float]:
    """The CPU seconds each job's finish recorded (``RunOutcome.cpu_seconds``, ``workers.cpu_share``: its last
    claim's run); a job not measured (a run in a thread, one not finished, or whose process died) is absent."""
    if not job_ids:
        return {}
    return {row.job_id: row.cpu_seconds for row in conn.execute(_CPU_SECONDS, {"jobs": job_ids})}


def list_unknown(conn: Connection, limit: int = 100) -> list[dict[str, Any]]:
    rows = conn.execute(
        text(
            "SELECT job_id, fencing_token, worker_id, unknown_at, unknown_reason, deliveries FROM job_claims "
            "WHERE state = 'unknown' ORDER BY unknown_at LIMIT :n"
        ),
        {"n": limit},
    ).mappings()
    return [dict(row) for row in rows]


# One statement each: "(:j IS NULL OR job_id = :j)" would keep a job's reports from their index.
_STALE_REPORTS = text("SELECT * FROM job_stale_reports ORDER BY report_id LIMIT :n")
_STALE_REPORTS_OF_JOB = text("SELECT * FROM job_stale_reports WHERE job_id = :j ORDER BY reported_at, report_id LIMIT :n")


def list_stale_reports(conn: Connection, job_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    if job_id is None:
        found = conn.execute(_STALE_REPORTS, {"n": limit})
    else:
        found = conn.execute(_STALE_REPORTS_OF_JOB, {"j": job_id, "n": limit})
    return [dict(row) for row in found.mappings()]


# --- pruned past their retention ------------------------------------------------------------

def settled_sql(job_id: str) -> str:
    """A condition: the job id expression ``job_id`` has no claim that is running (a worker holds it) or unknown (an
    operator reconciles it), a primary-key lookup. A job's outbox row is kept while it has one: the reconcile and
    the cancel find a task's claims through its rows."""
    return (f"NOT EXISTS (SELECT 1 FROM job_claims u WHERE u.job_id = {job_id} AND u.state IN ('running', 'unknown') "
            "OFFSET 0)")  # OFFSET 0: a lookup per row, never a join over every claim (see outbox.prune_finished_sql)


# Where a walk over the finished claims starts: before the oldest (finished time, ``job_id``).
PRUNE_START = (datetime(1, 1, 1, tzinfo=timezone.utc), "")

# One page of the walk over finished (or released) claims finished more than :retention_s ago, oldest first from
# (:after_at, :after_id) through their partial index (``job_claims_finished``, migration 0190): of the :batch it
# reads, it deletes those whose job's outbox row is gone, with their stale reports, and passes the others. Never a
# running or unknown claim, and never one whose row remains: the row is what a claim needs (outbox.claimable_cte),
# so a late delivery of a job pruned here finds no row and runs nothing.
PRUNE_SQL = f"""
    WITH page AS MATERIALIZED (
        SELECT c.job_id, COALESCE(c.finished_at, c.claimed_at) AS done_at FROM job_claims c
         WHERE c.state IN ('finished', 'released')
           AND COALESCE(c.finished_at, c.claimed_at) < now() - make_interval(secs => :retention_s)
           AND (COALESCE(c.finished_at, c.claimed_at), c.job_id) > (CAST(:after_at AS timestamptz),
                                                                     CAST(:after_id AS text))
         ORDER BY COALESCE(c.finished_at, c.claimed_at), c.job_id
         LIMIT :batch
    ),
    doomed AS (
        SELECT c.job_id FROM job_claims c
         WHERE c.job_id = ANY (ARRAY(SELECT job_id FROM page)) AND c.state IN ('finished', 'released')
           AND NOT {outbox.exists_for_job_sql('c.job_id')}
           FOR UPDATE OF c SKIP LOCKED
    ),
    reports AS (DELETE FROM job_stale_reports WHERE job_id = ANY (ARRAY(SELECT job_id FROM doomed))),
    gone AS (DELETE FROM job_claims WHERE job_id = ANY (ARRAY(SELECT job_id FROM doomed)) RETURNING 1)
    SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT count(*) FROM page) AS examined,
           last.done_at AS last_at, last.job_id AS last_id
      FROM (SELECT 1) one
      LEFT JOIN (SELECT * FROM page ORDER BY done_at DESC, job_id DESC LIMIT 1) last ON true"""
_PRUNE = text(PRUNE_SQL)


def prune_finished(conn: Connection, *, retention_s: float, batch: int,
                   after: tuple[datetime, str] = PRUNE_START) -> Page:
    """One page of up to ``batch`` finished claims past ``retention_s`` after ``after``: those whose job's outbox
    row is gone are deleted; the page's last key is where the next one starts."""
    row = conn.execute(_PRUNE, {"retention_s": retention_s, "batch": batch, "after_at": after[0],
                                "after_id": after[1]}).one()
    return page_of(row, asked=batch)


def may_resume_relation() -> str:
    """The jobs whose claim is running or released, as ``(job_id)``: the only ones a later delivery may resume,
    for owners that keep something only while a resume may need it (a job's checkpoints)."""
    return "(SELECT job_id FROM job_claims WHERE state IN ('running', 'released'))"
