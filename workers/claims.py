"""Claims: at most one execution per job, whatever the deliveries do (migration 0020).

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
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection, Engine, text

from core.errors import ServiceError

ClaimOutcome = Literal["claimed", "finished", "busy", "lease_expired_unknown"]
RenewOutcome = Literal["renewed", "expired", "fenced"]
FinishOutcome = Literal["finished", "already_finished", "stale"]
CancelOutcome = Literal["canceled_before_claim", "cancel_requested", "already_finished", "unknown"]
JobOutcome = Literal["completed", "failed", "canceled", "rejected", "input_required"]
JOB_OUTCOMES: tuple[str, ...] = ("completed", "failed", "canceled", "rejected", "input_required")


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


def claim(conn: Connection, job_id: str, *, worker_id: str, lease_s: float, now: datetime | None = None) -> ClaimResult:
    _check_lease(lease_s)
    row = conn.execute(
        text("SELECT * FROM job_claim(:j, :w, :l, CAST(:n AS timestamptz))"),
        {"j": job_id, "w": worker_id[:200], "l": lease_s, "n": _aware(now)},
    ).mappings().one()
    return ClaimResult(
        outcome=row["outcome"],
        fencing_token=int(row["fencing_token"]),
        lease_expires_at=row["lease_expires_at"],
        retry_after_s=row["retry_after_s"],
        job_outcome=row["job_outcome"],
        job_outcome_detail=row["job_outcome_detail"],
        newly_unknown=bool(row["newly_unknown"]),
    )


def renew(
    conn: Connection, job_id: str, *, fencing_token: int, lease_s: float, now: datetime | None = None
) -> RenewResult:
    _check_lease(lease_s)
    row = conn.execute(
        text("SELECT * FROM job_renew(:j, :t, :l, CAST(:n AS timestamptz))"),
        {"j": job_id, "t": fencing_token, "l": lease_s, "n": _aware(now)},
    ).mappings().one()
    return RenewResult(row["outcome"], row["lease_expires_at"], bool(row["cancel_requested"]))


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
    if outcome not in JOB_OUTCOMES:
        raise ClaimError(f"job outcome {outcome!r} is not one of {JOB_OUTCOMES}", code="outcome_invalid")
    row = conn.execute(
        text("SELECT * FROM job_finish(:j, :t, :o, CAST(:d AS jsonb), :w, CAST(:n AS timestamptz))"),
        {
            "j": job_id,
            "t": fencing_token,
            "o": outcome,
            "d": None if detail is None else json.dumps(detail, sort_keys=True),
            "w": worker_id[:200],
            "n": _aware(now),
        },
    ).mappings().one()
    return FinishResult(row["outcome"], row["state"])


def release(conn: Connection, job_id: str, *, fencing_token: int) -> bool:
    """Give a claim back before any work started; the next delivery re-claims it (token + 1)."""
    return bool(conn.execute(text("SELECT job_release(:j, :t)"), {"j": job_id, "t": fencing_token}).scalar())


def request_cancel(conn: Connection, job_id: str, *, reason: str) -> CancelOutcome:
    """Cancel from any API instance: before a claim the job never runs; while running the worker
    sees it at its next heartbeat (the cancellation bound is worker_heartbeat_s)."""
    return conn.execute(text("SELECT job_request_cancel(:j, :r)"), {"j": job_id, "r": reason[:500]}).scalar_one()


def resolve_unknown(conn: Connection, job_id: str, *, outcome: str, reason: str, operator: str) -> bool:
    """An operator's verdict on an unknown job. False when the job is not unknown."""
    if outcome not in JOB_OUTCOMES:
        raise ClaimError(f"job outcome {outcome!r} is not one of {JOB_OUTCOMES}", code="outcome_invalid")
    if not reason.strip():
        raise ClaimError("resolving an unknown outcome needs a reason (--reason)", code="reason_required")
    return bool(
        conn.execute(
            text("SELECT job_resolve_unknown(:j, :o, :r, :p)"),
            {"j": job_id, "o": outcome, "r": reason.strip()[:500], "p": operator},
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
    return bool(conn.execute(text("SELECT job_abandon(:j, :r)"), {"j": job_id, "r": reason[:500]}).scalar())


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
