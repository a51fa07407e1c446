"""What ledger operations return: frozen dataclasses whose ``outcome`` is a stable string.

Outcome strings are part of the contract with callers (the A2A edge, workers, the CLI,
scripts reading ``--json``); add new ones, never rename them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ledger.errors import ReservationRefused

# reserve outcomes
CREATED = "created"
EXISTS = "exists"
EXISTS_MISMATCH = "exists_mismatch"
NOT_ENTITLED = "not_entitled"
EXPIRED = "expired"
INSUFFICIENT_CREDITS = "insufficient_credits"
CONCURRENCY_CAP = "concurrency_cap"
RESERVE_OUTCOMES = (CREATED, EXISTS, EXISTS_MISMATCH, NOT_ENTITLED, EXPIRED, INSUFFICIENT_CREDITS, CONCURRENCY_CAP)

# settle / void / reconcile / mark-unknown / adjust outcomes that are successes
SETTLED = "settled"
RECONCILED = "reconciled"
MARKED = "marked"
ADJUSTED = "adjusted"

# reservation states
OPEN = "open"
UNKNOWN = "unknown"
RESOLVED_STATES = ("settled", "voided", "reconciled")


@dataclass(frozen=True)
class Hold:
    """Credits a reservation holds on one lot."""

    lot_id: int
    credits: int


@dataclass(frozen=True)
class GrantResult:
    outcome: str  # created | exists
    grant_id: int
    lot_id: int | None  # None for an entitlement-only grant (0 credits)
    customer_id: str
    credits: int
    priority: int
    expires_at: datetime | None
    max_parallel: int | None  # the customer's cap on open reservations after this grant
    skills: tuple[str, ...]
    skill_expires_at: datetime | None
    created_at: datetime


@dataclass(frozen=True)
class ReserveResult:
    outcome: str  # one of RESERVE_OUTCOMES
    job_id: str
    customer_id: str
    skill: str | None
    credits: int | None
    state: str | None
    created_at: datetime | None
    available: int | None  # credits the customer could still reserve (after this one, when created)
    open_reservations: int | None
    max_parallel: int | None
    expired_at: datetime | None  # for `expired`: when the entitlement or the last lot expired
    holds: tuple[Hold, ...]

    def __post_init__(self) -> None:
        # A new reservation is held whole, on lots that each hold a positive part of it.
        if self.outcome == CREATED:
            assert self.credits is not None and sum(hold.credits for hold in self.holds) == self.credits, self
            assert all(hold.credits > 0 for hold in self.holds), self

    @property
    def ok(self) -> bool:
        """The job holds its reservation (new, or this same request replayed)."""
        return self.outcome in (CREATED, EXISTS)

    def refusal(self) -> ReservationRefused | None:
        """The refusal as an error with a message a person can act on, or None when ok."""
        if self.ok:
            return None
        return ReservationRefused(_refusal_message(self), code=self.outcome)

    def raise_if_refused(self) -> ReserveResult:
        problem = self.refusal()
        if problem is not None:
            raise problem
        return self


def _refusal_message(r: ReserveResult) -> str:
    who = f"customer {r.customer_id}"
    if r.outcome == EXISTS_MISMATCH:
        return (
            f"job {r.job_id} was already reserved for a different request; "
            "use a new job id for a new request, or replay the original request unchanged"
        )
    if r.outcome == NOT_ENTITLED:
        return f"{who} is not entitled to skill {r.skill}; an operator grants it with `specialists credits grant --skill`"
    if r.outcome == EXPIRED:
        when = f" at {r.expired_at.isoformat()}" if r.expired_at else ""
        return (
            f"{who}'s entitlement to {r.skill} or all of its credit expired{when}; "
            "an operator renews it with `specialists credits grant`"
        )
    if r.outcome == INSUFFICIENT_CREDITS:
        return (
            f"{who} has {r.available} credits available; this task reserves {r.credits}. "
            "Top up with `specialists credits grant`, or wait for running tasks to settle"
        )
    if r.outcome == CONCURRENCY_CAP:
        return (
            f"{who} already has {r.open_reservations} tasks running, its limit (max_parallel) is "
            f"{r.max_parallel}; retry when one finishes, or raise it with `specialists credits grant --max-parallel`"
        )
    return f"reservation of job {r.job_id} refused: {r.outcome}"


@dataclass(frozen=True)
class ResolveResult:
    """A settlement, void or reconcile: what was charged, released back, and released to breakage."""

    outcome: str  # settled | reconciled | exists
    job_id: str
    customer_id: str
    state: str
    credits: int
    charged: int
    released: int
    expired: int
    resolved_at: datetime
    operator: str | None
    reason: str

    def __post_init__(self) -> None:
        # A settle never exceeds the reservation, and every reserved credit goes somewhere: charged, released back
        # to its lot, or to breakage with a lot that expired meanwhile.
        assert 0 <= self.charged <= self.credits, self
        assert self.released >= 0 and self.expired >= 0, self
        assert self.charged + self.released + self.expired == self.credits, self


@dataclass(frozen=True)
class UnknownResult:
    outcome: str  # marked | exists
    job_id: str
    customer_id: str
    state: str
    credits: int
    unknown_at: datetime
    unknown_reason: str
    unknown_by: str | None


@dataclass(frozen=True)
class AdjustResult:
    outcome: str  # adjusted
    customer_id: str
    credits: int
    available: int
    lots: tuple[Hold, ...]  # the lot created (positive) or the lots debited (negative)


@dataclass(frozen=True)
class AccountResult:
    """An account opened (``customers add``) or its cap changed (``customers set``), with its audit record."""

    outcome: str  # created | exists (open); changed | unchanged (set)
    customer_id: str
    max_parallel: int  # the cap now
    max_parallel_before: int | None  # the cap before a change (None when opened)
    open_reservations: int
    change_id: int | None  # the audit record (ledger_account_changes); None when nothing changed
    at: datetime | None  # when it was opened or changed


@dataclass(frozen=True)
class ExpiredLot:
    customer_id: str
    lot_id: int
    credits: int  # moved to breakage by this sweep
    expires_at: datetime


@dataclass(frozen=True)
class Violation:
    """One broken ledger invariant found by ``verify``."""

    check: str  # stable name, e.g. lot_mismatch, account_held_mismatch, resolved_twice
    subject: str  # what it is about: a customer, a lot, a job
    detail: str
    customer_id: str | None = None  # whose rows disagree (the id the rows are filed under)
