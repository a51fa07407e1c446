"""The ledger's operations on a caller's SQLAlchemy ``Connection``: one statement each.

Nothing here begins or commits: each function runs inside whatever transaction the
caller holds, so the A2A edge can write its task row, the reservation and its outbox
row in one transaction, and a worker can finish a task and settle it in one. Use
READ COMMITTED (PostgreSQL's default): the functions lock the customer's account row
and rely on re-reading the newest row versions after that lock.

For an operation in its own transaction, use ``ledger.client.Ledger``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from core import db
from core.fragments import Fragment
from ledger import statements as st
from ledger.limits import LedgerSettings, default_limits
from ledger.results import AccountResult, AdjustResult, ExpiredLot, GrantResult, ReserveResult, ResolveResult, UnknownResult


def grant(
    conn: Connection,
    customer_id: str,
    credits: int,
    *,
    operator: str,
    skills: Sequence[str] = (),
    expires_at: datetime | None = None,
    expires_in: timedelta | None = None,
    skill_expires_at: datetime | None = None,
    max_parallel: int | None = None,
    priority: int | None = None,
    idempotency_key: str | None = None,
    reason: str = "",
    now: datetime | None = None,
    limits: LedgerSettings | None = None,
    require_customer: bool = False,
) -> GrantResult:
    """Grant a lot of ``credits`` (its own expiry and priority) and skill entitlements.

    Outcomes: ``created``; ``exists`` for a replay of the same idempotency key with the
    same inputs (nothing moves). Raises GrantRefused for the same key with other inputs.
    ``max_parallel`` (when given) becomes the customer's cap on open reservations.
    A customer the service does not know gets an account, unless ``require_customer``: then it is refused
    (``CustomerNotFound``) and nothing is written (the operator's grant: a typo opens no account).
    """
    params = st.grant_params(
        customer_id,
        credits,
        skills=skills,
        expires_at=expires_at,
        expires_in=expires_in,
        skill_expires_at=skill_expires_at,
        max_parallel=max_parallel,
        priority=priority,
        idempotency_key=idempotency_key,
        operator=operator,
        reason=reason,
        now=now,
        limits=limits or default_limits(),
    )
    if require_customer:
        rows = conn.exec_driver_sql(st.GRANT_EXISTING_SQL, params).mappings().all()
        return st.parse_grant_existing(rows, customer_id)
    return st.parse_grant(conn.exec_driver_sql(st.GRANT_SQL, params).mappings().one())


def open_account(
    conn: Connection,
    customer_id: str,
    *,
    operator: str,
    max_parallel: int | None = None,
    reason: str = "",
    now: datetime | None = None,
    limits: LedgerSettings | None = None,
) -> AccountResult:
    """Add a customer: its row and its credit account, with the cap ``max_parallel`` (default
    SPECIALISTS_LEDGER_DEFAULT_MAX_PARALLEL) and an audit record. Outcomes: ``created``; ``exists`` (nothing changed)."""
    params = st.open_account_params(customer_id, max_parallel, operator, reason, now=now,
                                    limits=limits or default_limits())
    return st.parse_account(conn.exec_driver_sql(st.OPEN_ACCOUNT_SQL, params).mappings().one())


def set_max_parallel(
    conn: Connection,
    customer_id: str,
    max_parallel: int,
    *,
    operator: str,
    reason: str,
    now: datetime | None = None,
    limits: LedgerSettings | None = None,
) -> AccountResult:
    """Change the customer's cap on open reservations, without a grant, with an audit record.

    Outcomes: ``changed``, ``unchanged``. Raises AccountRefused: ``account_not_found``, ``max_parallel_below_open``.
    """
    params = st.set_max_parallel_params(customer_id, max_parallel, operator, reason, now=now,
                                        limits=limits or default_limits())
    return st.parse_account(conn.exec_driver_sql(st.SET_MAX_PARALLEL_SQL, params).mappings().one())


def reserve(
    conn: Connection,
    customer_id: str,
    job_id: str,
    fingerprint: str,
    skill: str,
    credits: int,
    *,
    now: datetime | None = None,
    limits: LedgerSettings | None = None,
) -> ReserveResult:
    """Hold ``credits`` for ``job_id``. Refusals are outcomes, not exceptions.

    Outcomes: created, exists (same job and fingerprint: the original reservation),
    exists_mismatch, not_entitled, expired, insufficient_credits, concurrency_cap.
    """
    params = st.reserve_params(customer_id, job_id, fingerprint, skill, credits, now=now, limits=limits or default_limits())
    return st.parse_reserve(conn.exec_driver_sql(st.RESERVE_SQL, params).mappings().one())


def settle(
    conn: Connection,
    job_id: str,
    charged: int,
    reason: str = "",
    *,
    now: datetime | None = None,
    limits: LedgerSettings | None = None,
) -> ResolveResult:
    """Charge ``charged`` (0 <= charged <= reserved) and release the rest, once.

    Outcomes: settled; exists (the same settlement again). Raises ResolutionRefused for a
    different amount, an unknown reservation (reconcile it), or an unknown job.
    """
    params = st.settle_params(job_id, charged, reason, now=now, limits=limits or default_limits())
    [row] = db.hot_driver_sql_rows(conn, st.SETTLE_SQL, params)  # every paid job's finish: on the driver
    return st.parse_resolve(row, charged=charged)


# ``settle`` as a fragment (``core.fragments``), for a statement that settles in its own round trip: a job's finish
# writes its task's final event and settles in one (``taskstate.rows.write_event(beside=...)``, issue 44). Its
# parameters: ``settle_fragment_params``; its row (``SETTLED_COLUMNS``, the function's result): ``parse_settled``.
SETTLE = Fragment.of(
    "ledger",
    "SELECT * FROM ledger_settle(CAST(:settle_job_id AS text), CAST(:settle_charged AS bigint), "
    "CAST(:settle_reason AS text), CAST(:settle_now AS timestamptz)) WHERE {when}",
    ("settle_job_id", "settle_charged", "settle_reason", "settle_now"),
)
SETTLED_COLUMNS = ("outcome", "job_id", "customer_id", "state", "credits", "charged", "released", "expired",
                   "resolved_at", "operator", "reason")


def settle_fragment_params(job_id: str, charged: int, reason: str = "", *, now: datetime | None = None,
                           limits: LedgerSettings | None = None) -> dict[str, Any]:
    """``SETTLE``'s parameters, checked as ``settle``'s are."""
    params = st.settle_params(job_id, charged, reason, now=now, limits=limits or default_limits())
    return {f"settle_{name}": value for name, value in params.items()}


def parse_settled(row: Mapping[str, Any], *, charged: int) -> ResolveResult:
    """``SETTLE``'s row (by ``SETTLED_COLUMNS``) as ``settle`` answers: a refusal raises ResolutionRefused."""
    return st.parse_resolve(row, charged=charged)


def void(
    conn: Connection, job_id: str, reason: str = "", *, now: datetime | None = None, limits: LedgerSettings | None = None
) -> ResolveResult:
    """Release the whole reservation: a settlement that charges nothing."""
    return settle(conn, job_id, 0, reason, now=now, limits=limits)


def mark_unknown(
    conn: Connection,
    job_id: str,
    reason: str,
    operator: str,
    *,
    now: datetime | None = None,
    limits: LedgerSettings | None = None,
) -> UnknownResult:
    """Record that the job's outcome cannot be established. It keeps its hold and its slot.

    Outcomes: marked; exists (already unknown).
    """
    params = st.mark_unknown_params(job_id, reason, operator, now=now, limits=limits or default_limits())
    return st.parse_mark_unknown(conn.exec_driver_sql(st.MARK_UNKNOWN_SQL, params).mappings().one())


def reconcile(
    conn: Connection,
    job_id: str,
    charged: int,
    reason: str,
    operator: str,
    *,
    now: datetime | None = None,
    limits: LedgerSettings | None = None,
) -> ResolveResult:
    """Resolve an unknown reservation once, with an audit record (operator, time, reason, charge).

    Outcomes: reconciled; exists (the same reconcile again).
    """
    params = st.reconcile_params(job_id, charged, reason, operator, now=now, limits=limits or default_limits())
    return st.parse_resolve(conn.exec_driver_sql(st.RECONCILE_SQL, params).mappings().one(), charged=charged)


def expire(
    conn: Connection, *, now: datetime | None = None, max_lots: int | None = None, limits: LedgerSettings | None = None
) -> list[ExpiredLot]:
    """Move the unreserved remainder of expired lots to breakage; return what moved."""
    params = st.expire_params(now=now, max_lots=max_lots, limits=limits or default_limits())
    return [st.parse_expired(row) for row in conn.exec_driver_sql(st.EXPIRE_SQL, params).mappings()]


def adjust(
    conn: Connection,
    customer_id: str,
    credits: int,
    reason: str,
    operator: str,
    *,
    now: datetime | None = None,
    limits: LedgerSettings | None = None,
) -> AdjustResult:
    """An operator correction: + adds a non-expiring lot, - removes available credits (never below zero)."""
    params = st.adjust_params(customer_id, credits, reason, operator, now=now, limits=limits or default_limits())
    return st.parse_adjust(conn.exec_driver_sql(st.ADJUST_SQL, params).mappings().one())
