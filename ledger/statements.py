"""The ledger's statements: SQL text, argument checks, and parsers from a result row to a dataclass.

Pure, so every way of running a statement shares every line of it: the functions on a
caller's ``Connection`` (``ledger.operations``, via ``exec_driver_sql``), an async twin on
an ``AsyncConnection`` (``await conn.exec_driver_sql(...)``), and the own-transaction
fast path (``ledger.client``). Build the parameters with a ``*_params`` function (it
refuses bad input before anything reaches the database), execute the statement, hand
the row mapping to the matching ``parse_*``.

The SQL uses the driver's ``%(name)s`` placeholders (psycopg) with explicit casts, so
the server plans one prepared statement per operation. Each statement is one call of a
server-side function: one round trip.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from ledger import keys
from ledger.errors import (
    AccountRefused,
    AdjustRefused,
    CustomerNotFound,
    GrantRefused,
    LedgerInputInvalid,
    ResolutionRefused,
)
from ledger.limits import (
    SCHEMA_MAX_ID_CHARS,
    SCHEMA_MAX_OPERATIONS_PER_BATCH,
    SCHEMA_MAX_PARALLEL,
    SCHEMA_MAX_PRIORITY,
    LedgerSettings,
    env_name,
)
from ledger.results import (
    AccountResult,
    AdjustResult,
    ExpiredLot,
    GrantResult,
    Hold,
    ReserveResult,
    ResolveResult,
    UnknownResult,
)

SKILL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")

GRANT_SQL: str = (
    "SELECT * FROM ledger_grant(CAST(%(customer_id)s AS text), CAST(%(credits)s AS bigint), CAST(%(priority)s AS integer), "
    "CAST(%(expires_at)s AS timestamptz), CAST(%(expires_in)s AS interval), CAST(%(max_parallel)s AS integer), "
    "CAST(%(default_max_parallel)s AS integer), CAST(%(skills)s AS text[]), CAST(%(skill_expires_at)s AS timestamptz), "
    "CAST(%(idempotency_key)s AS text), CAST(%(request_digest)s AS text), CAST(%(operator)s AS text), "
    "CAST(%(reason)s AS text), CAST(%(now)s AS timestamptz))"
)
# The same grant, only for a customer the service knows (the operator's: a mistyped id opens no account). The
# function runs once per row of ``customers`` with that id, so for an unknown id it never runs and nothing is
# written: no row comes back (``CustomerNotFound``). One round trip, and no gap between a check and the grant.
GRANT_EXISTING_SQL: str = (
    "SELECT g.* FROM customers c CROSS JOIN LATERAL ledger_grant(c.customer_id, CAST(%(credits)s AS bigint), "
    "CAST(%(priority)s AS integer), CAST(%(expires_at)s AS timestamptz), CAST(%(expires_in)s AS interval), "
    "CAST(%(max_parallel)s AS integer), CAST(%(default_max_parallel)s AS integer), CAST(%(skills)s AS text[]), "
    "CAST(%(skill_expires_at)s AS timestamptz), CAST(%(idempotency_key)s AS text), CAST(%(request_digest)s AS text), "
    "CAST(%(operator)s AS text), CAST(%(reason)s AS text), CAST(%(now)s AS timestamptz)) AS g "
    "WHERE c.customer_id = CAST(%(customer_id)s AS text)"
)
# Accounts opened and caps changed by an operator (migration 0220), each with its audit record.
OPEN_ACCOUNT_SQL: str = (
    "SELECT * FROM ledger_open_account(CAST(%(customer_id)s AS text), CAST(%(max_parallel)s AS integer), "
    "CAST(%(operator)s AS text), CAST(%(reason)s AS text), CAST(%(now)s AS timestamptz))"
)
SET_MAX_PARALLEL_SQL: str = (
    "SELECT * FROM ledger_set_max_parallel(CAST(%(customer_id)s AS text), CAST(%(max_parallel)s AS integer), "
    "CAST(%(operator)s AS text), CAST(%(reason)s AS text), CAST(%(now)s AS timestamptz))"
)
RESERVE_SQL: str = (
    "SELECT * FROM ledger_reserve(CAST(%(customer_id)s AS text), CAST(%(job_id)s AS text), CAST(%(fingerprint)s AS text), "
    "CAST(%(skill)s AS text), CAST(%(credits)s AS bigint), CAST(%(now)s AS timestamptz))"
)
SETTLE_SQL: str = (
    "SELECT * FROM ledger_settle(CAST(%(job_id)s AS text), CAST(%(charged)s AS bigint), CAST(%(reason)s AS text), "
    "CAST(%(now)s AS timestamptz))"
)
MARK_UNKNOWN_SQL: str = (
    "SELECT * FROM ledger_mark_unknown(CAST(%(job_id)s AS text), CAST(%(reason)s AS text), CAST(%(operator)s AS text), "
    "CAST(%(now)s AS timestamptz))"
)
RECONCILE_SQL: str = (
    "SELECT * FROM ledger_reconcile(CAST(%(job_id)s AS text), CAST(%(charged)s AS bigint), CAST(%(reason)s AS text), "
    "CAST(%(operator)s AS text), CAST(%(now)s AS timestamptz))"
)
# Reserves and settles in one transaction (migration 0150; ledger.batching sends one customer's
# concurrent calls): one row per operation, ``op_index`` (1-based) naming it; parse it with
# parse_reserve or parse_resolve.
BATCH_SQL: str = (
    "SELECT * FROM ledger_batch(CAST(%(customer_ids)s AS text[]), CAST(%(kinds)s AS text[]), "
    "CAST(%(job_ids)s AS text[]), CAST(%(fingerprints)s AS text[]), CAST(%(skills)s AS text[]), "
    "CAST(%(credits)s AS bigint[]), CAST(%(reasons)s AS text[]), CAST(%(nows)s AS timestamptz[]))"
)
EXPIRE_SQL: str = "SELECT * FROM ledger_expire(CAST(%(now)s AS timestamptz), CAST(%(max_lots)s AS integer))"
ADJUST_SQL: str = (
    "SELECT * FROM ledger_adjust(CAST(%(customer_id)s AS text), CAST(%(credits)s AS bigint), CAST(%(priority)s AS integer), "
    "CAST(%(reason)s AS text), CAST(%(operator)s AS text), CAST(%(now)s AS timestamptz))"
)


# --- argument checks ----------------------------------------------------------


def _invalid(message: str) -> LedgerInputInvalid:
    return LedgerInputInvalid(message)


def _customer(customer_id: str) -> str:
    if not isinstance(customer_id, str) or not keys.CUSTOMER_RE.match(customer_id):
        raise _invalid(
            f"customer id {customer_id!r} is not valid: use 1-63 lowercase letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return customer_id


def _credits(value: int, what: str, limits: LedgerSettings, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"{what} must be a whole number of credits, got {value!r}")
    ceiling = limits.max_credits_per_operation
    if not minimum <= value <= ceiling:
        raise _invalid(
            f"{what} is {value}; it must be between {minimum} and {ceiling} "
            f"({env_name('max_credits_per_operation')})"
        )
    return value


def _identifier(value: str, what: str, max_chars: int, setting: str) -> str:
    if not isinstance(value, str) or not value or _CONTROL_RE.search(value):
        raise _invalid(f"{what} must be non-empty text without control characters, got {value!r}")
    if len(value) > max_chars:
        raise _invalid(f"{what} has {len(value)} characters; at most {max_chars} are accepted ({env_name(setting)})")
    return value


def _skill(skill: str) -> str:
    if not isinstance(skill, str) or not SKILL_RE.match(skill):
        raise _invalid(f"skill {skill!r} is not valid: 1-64 of letters, digits, '_', '.', ':', '-'")
    return skill


def _reason(reason: str, limits: LedgerSettings, *, required: bool) -> str:
    if not isinstance(reason, str):
        raise _invalid(f"reason must be text, got {reason!r}")
    reason = reason.strip()
    if required and not reason:
        raise _invalid("a reason is required (--reason): say why, for the audit record")
    if len(reason) > limits.max_reason_chars:
        raise _invalid(
            f"the reason has {len(reason)} characters; at most {limits.max_reason_chars} are accepted "
            f"({env_name('max_reason_chars')})"
        )
    return reason


def _operator(operator: str) -> str:
    if (
        not isinstance(operator, str)
        or not operator.strip()
        or _CONTROL_RE.search(operator)
        or len(operator) > SCHEMA_MAX_ID_CHARS
    ):
        raise _invalid(
            f"operator must be 1-{SCHEMA_MAX_ID_CHARS} characters naming who acts (--operator), got {operator!r}"
        )
    return operator.strip()


def _max_parallel(value: int) -> int:
    if not isinstance(value, bool) and isinstance(value, int) and 1 <= value <= SCHEMA_MAX_PARALLEL:
        return value
    # 0 once meant "paused", but the customer was told it was busy and to retry: what stops a customer is its keys.
    zero = (
        ": 0 would refuse every task as if the customer were busy; to stop a customer, revoke its keys "
        "(`specialists keys revoke`)"
    ) if value == 0 and value is not False else ""
    raise _invalid(
        f"max_parallel (--max-parallel) is the customer's cap on tasks at once, a whole number from 1 to "
        f"{SCHEMA_MAX_PARALLEL}; got {value!r}{zero}"
    )


def _aware(value: datetime | None, what: str) -> datetime | None:
    if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
        raise _invalid(f"{what} must be a timezone-aware datetime (e.g. 2030-01-31T00:00:00+00:00), got {value!r}")
    return value


def _priority(priority: int | None, limits: LedgerSettings) -> int:
    if priority is None:
        return limits.default_priority
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= SCHEMA_MAX_PRIORITY:
        raise _invalid(f"priority must be a whole number from 0 (drawn first) to {SCHEMA_MAX_PRIORITY}, got {priority!r}")
    return priority


# --- parameters ---------------------------------------------------------------


def grant_params(
    customer_id: str,
    credits: int,
    *,
    skills: Sequence[str],
    expires_at: datetime | None,
    expires_in: timedelta | None,
    skill_expires_at: datetime | None,
    max_parallel: int | None,
    priority: int | None,
    idempotency_key: str | None,
    operator: str,
    reason: str,
    now: datetime | None,
    limits: LedgerSettings,
) -> dict[str, Any]:
    _customer(customer_id)
    _credits(credits, "credits", limits, minimum=0)
    if isinstance(skills, str):
        raise _invalid("skills must be a list of skill names, not one string")
    skill_list = sorted({_skill(s) for s in skills})
    if len(skill_list) > limits.max_skills_per_grant:
        raise _invalid(
            f"a grant names {len(skill_list)} skills; at most {limits.max_skills_per_grant} are accepted "
            f"({env_name('max_skills_per_grant')})"
        )
    if credits == 0 and not skill_list:
        raise _invalid("a grant needs credits, skills, or both")
    if expires_at is not None and expires_in is not None:
        raise _invalid("give the grant's expiry either as an instant (expires_at) or a duration (expires_in), not both")
    _aware(expires_at, "expires_at")
    _aware(skill_expires_at, "skill_expires_at")
    _aware(now, "now")
    if expires_in is not None and (not isinstance(expires_in, timedelta) or expires_in <= timedelta(0)):
        raise _invalid(f"expires_in must be a positive duration, got {expires_in!r}")
    if max_parallel is not None:
        _max_parallel(max_parallel)
    resolved_priority = _priority(priority, limits)
    if idempotency_key is not None:
        _identifier(idempotency_key, "idempotency key", limits.max_idempotency_key_chars, "max_idempotency_key_chars")
    reason = _reason(reason, limits, required=False)
    operator = _operator(operator)
    # The digest is what "the same request" means for an idempotent replay: every input
    # as the caller stated it (a relative expiry stays relative, so a replay tomorrow matches).
    digest = hashlib.sha256(
        json.dumps(
            {
                "customer_id": customer_id,
                "credits": credits,
                "skills": skill_list,
                "expires_at": expires_at.isoformat() if expires_at else None,
                "expires_in_s": expires_in.total_seconds() if expires_in is not None else None,
                "skill_expires_at": skill_expires_at.isoformat() if skill_expires_at else None,
                "max_parallel": max_parallel,
                "priority": resolved_priority,
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()
    return {
        "customer_id": customer_id,
        "credits": credits,
        "priority": resolved_priority,
        "expires_at": expires_at,
        "expires_in": expires_in,
        "max_parallel": max_parallel,
        "default_max_parallel": limits.default_max_parallel,
        "skills": skill_list,
        "skill_expires_at": skill_expires_at,
        "idempotency_key": idempotency_key,
        "request_digest": digest,
        "operator": operator,
        "reason": reason,
        "now": now,
    }


def open_account_params(
    customer_id: str, max_parallel: int | None, operator: str, reason: str, *, now: datetime | None,
    limits: LedgerSettings,
) -> dict[str, Any]:
    return {
        "customer_id": _customer(customer_id),
        "max_parallel": limits.default_max_parallel if max_parallel is None else _max_parallel(max_parallel),
        "operator": _operator(operator),
        "reason": _reason(reason, limits, required=False),
        "now": _aware(now, "now"),
    }


def set_max_parallel_params(
    customer_id: str, max_parallel: int, operator: str, reason: str, *, now: datetime | None, limits: LedgerSettings
) -> dict[str, Any]:
    return {
        "customer_id": _customer(customer_id),
        "max_parallel": _max_parallel(max_parallel),
        "operator": _operator(operator),
        "reason": _reason(reason, limits, required=True),
        "now": _aware(now, "now"),
    }


def customer_id_param(customer_id: str) -> str:
    """A customer id checked as every statement checks it."""
    return _customer(customer_id)


def reserve_params(
    customer_id: str, job_id: str, fingerprint: str, skill: str, credits: int, *, now: datetime | None, limits: LedgerSettings
) -> dict[str, Any]:
    return {
        "customer_id": _customer(customer_id),
        "job_id": _identifier(job_id, "job id", limits.max_job_id_chars, "max_job_id_chars"),
        "fingerprint": _identifier(fingerprint, "request fingerprint", limits.max_fingerprint_chars, "max_fingerprint_chars"),
        "skill": _skill(skill),
        "credits": _credits(credits, "credits to reserve", limits),
        "now": _aware(now, "now"),
    }


def settle_params(job_id: str, charged: int, reason: str, *, now: datetime | None, limits: LedgerSettings) -> dict[str, Any]:
    return {
        "job_id": _identifier(job_id, "job id", limits.max_job_id_chars, "max_job_id_chars"),
        "charged": _credits(charged, "charged", limits, minimum=0),
        "reason": _reason(reason, limits, required=False),
        "now": _aware(now, "now"),
    }


def batch_params(operations: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """One ``ledger_batch`` call from ("reserve", reserve_params(...)) and ("settle", settle_params(...)) pairs.

    A settlement's customer is the one its reservation names.
    """
    kinds = [kind for kind, _ in operations]
    if not kinds or not set(kinds) <= {"reserve", "settle"}:
        raise _invalid(f"a batch is one or more reserve or settle operations, got {kinds!r}")
    if len(kinds) > SCHEMA_MAX_OPERATIONS_PER_BATCH:
        raise _invalid(
            f"a batch of {len(kinds)} operations; at most {SCHEMA_MAX_OPERATIONS_PER_BATCH} are accepted "
            f"({env_name('max_operations_per_batch')} stops there)"
        )
    return {
        "customer_ids": [params.get("customer_id") for _, params in operations],
        "kinds": kinds,
        "job_ids": [params["job_id"] for _, params in operations],
        "fingerprints": [params.get("fingerprint") for _, params in operations],
        "skills": [params.get("skill") for _, params in operations],
        "credits": [params["credits"] if kind == "reserve" else params["charged"] for kind, params in operations],
        "reasons": [params.get("reason") for _, params in operations],
        "nows": [params["now"] for _, params in operations],
    }


def mark_unknown_params(
    job_id: str, reason: str, operator: str, *, now: datetime | None, limits: LedgerSettings
) -> dict[str, Any]:
    return {
        "job_id": _identifier(job_id, "job id", limits.max_job_id_chars, "max_job_id_chars"),
        "reason": _reason(reason, limits, required=True),
        "operator": _operator(operator),
        "now": _aware(now, "now"),
    }


def reconcile_params(
    job_id: str, charged: int, reason: str, operator: str, *, now: datetime | None, limits: LedgerSettings
) -> dict[str, Any]:
    return {
        "job_id": _identifier(job_id, "job id", limits.max_job_id_chars, "max_job_id_chars"),
        "charged": _credits(charged, "charged", limits, minimum=0),
        "reason": _reason(reason, limits, required=True),
        "operator": _operator(operator),
        "now": _aware(now, "now"),
    }


def expire_params(*, now: datetime | None, max_lots: int | None, limits: LedgerSettings) -> dict[str, Any]:
    ceiling = limits.max_expire_lots_per_call
    if max_lots is None:
        max_lots = ceiling
    if isinstance(max_lots, bool) or not isinstance(max_lots, int) or not 1 <= max_lots <= ceiling:
        raise _invalid(f"max_lots must be between 1 and {ceiling} ({env_name('max_expire_lots_per_call')})")
    return {"now": _aware(now, "now"), "max_lots": max_lots}


def adjust_params(
    customer_id: str, credits: int, reason: str, operator: str, *, now: datetime | None, limits: LedgerSettings
) -> dict[str, Any]:
    if isinstance(credits, bool) or not isinstance(credits, int) or credits == 0:
        raise _invalid(f"an adjustment is a non-zero whole number of credits (+ adds, - removes), got {credits!r}")
    _credits(abs(credits), "the adjustment", limits)
    return {
        "customer_id": _customer(customer_id),
        "credits": credits,
        "priority": limits.default_priority,
        "reason": _reason(reason, limits, required=True),
        "operator": _operator(operator),
        "now": _aware(now, "now"),
    }


# --- parsers ------------------------------------------------------------------


def _holds(lot_ids: Sequence[int] | None, credits: Sequence[int] | None) -> tuple[Hold, ...]:
    return tuple(Hold(int(lot), int(c)) for lot, c in zip(lot_ids or (), credits or ()))


def parse_grant(row: Mapping[str, Any]) -> GrantResult:
    outcome = row["outcome"]
    if outcome == "idempotency_mismatch":
        raise GrantRefused(
            f"idempotency key was already used (grant {row['grant_id']} to {row['customer_id']}, "
            f"{row['credits']} credits) with different inputs; use a new key for a new grant, "
            "or repeat the original grant exactly",
            code="grant_idempotency_mismatch",
        )
    if outcome == "max_parallel_below_open":
        raise GrantRefused(
            f"customer {row['customer_id']} has {row['open_reservations']} open reservations, more than the "
            "max_parallel requested; wait for them to settle, or choose a max_parallel at least that high",
            code="max_parallel_below_open",
        )
    if outcome == "expiry_not_in_future":
        raise GrantRefused(
            "the grant's expiry (or its skills' expiry) is not in the future; choose a later --expires-at",
            code="expiry_not_in_future",
        )
    return GrantResult(
        outcome=outcome,
        grant_id=row["grant_id"],
        lot_id=row["lot_id"],
        customer_id=row["customer_id"],
        credits=row["credits"],
        priority=row["priority"],
        expires_at=row["expires_at"],
        max_parallel=row["max_parallel"],
        skills=tuple(row["skills"] or ()),
        skill_expires_at=row["skill_expires_at"],
        created_at=row["created_at"],
    )


def parse_grant_existing(rows: Sequence[Mapping[str, Any]], customer_id: str) -> GrantResult:
    """``GRANT_EXISTING_SQL``'s rows: none means the customer is unknown and nothing was written."""
    if not rows:
        raise CustomerNotFound.of(customer_id)
    return parse_grant(rows[0])


def parse_account(row: Mapping[str, Any]) -> AccountResult:
    outcome, customer = row["outcome"], row["customer_id"]
    if outcome == "account_not_found":
        raise AccountRefused(
            f"customer {customer} has no credit account; `specialists customers add --customer {customer}` opens it",
            code="account_not_found",
        )
    if outcome == "max_parallel_below_open":
        raise AccountRefused(
            f"customer {customer} has {row['open_reservations']} open or unknown reservations, more than the "
            "max_parallel requested; wait for them to settle (or reconcile the unknown ones), or choose a "
            "--max-parallel at least that high",
            code="max_parallel_below_open",
        )
    return AccountResult(
        outcome=outcome,
        customer_id=customer,
        max_parallel=row["max_parallel"],
        max_parallel_before=row["max_parallel_before"],
        open_reservations=row["open_reservations"],
        change_id=row["change_id"],
        at=row["at"],
    )


def parse_reserve(row: Mapping[str, Any]) -> ReserveResult:
    return ReserveResult(
        outcome=row["outcome"],
        job_id=row["job_id"],
        customer_id=row["customer_id"],
        skill=row["skill"],
        credits=row["credits"],
        state=row["state"],
        created_at=row["created_at"],
        available=row["available"],
        open_reservations=row["open_reservations"],
        max_parallel=row["max_parallel"],
        expired_at=row["expired_at"],
        holds=_holds(row["hold_lot_ids"], row["hold_credits"]),
    )


def parse_resolve(row: Mapping[str, Any], *, charged: int) -> ResolveResult:
    """Parse a settle or reconcile row; refusals raise ResolutionRefused."""
    outcome, job = row["outcome"], row["job_id"]
    if outcome == "not_found":
        raise ResolutionRefused(
            f"no reservation for job {job}; check the job id (`specialists reservations list`)",
            code="reservation_not_found",
        )
    if outcome == "charge_exceeds_reserved":
        raise ResolutionRefused(
            f"job {job} reserved {row['credits']} credits; it cannot be charged {charged}", code="charge_exceeds_reserved"
        )
    if outcome == "unknown":
        raise ResolutionRefused(
            f"job {job} is marked unknown; only an operator resolves it: "
            f"`specialists reconcile {job} --charged N --reason ...`",
            code="reservation_unknown",
        )
    if outcome == "not_unknown":
        raise ResolutionRefused(
            f"job {job} is still open (its worker may be running); if its outcome cannot be established, "
            f"mark it first: `specialists reservations mark-unknown {job} --reason ...`",
            code="reservation_not_unknown",
        )
    if outcome == "settle_mismatch":
        raise ResolutionRefused(
            f"job {job} was already resolved ({row['state']}, charged {row['charged']} at "
            f"{row['resolved_at']:%Y-%m-%d %H:%M:%S}); a different charge ({charged}) is refused",
            code="settle_mismatch",
        )
    if outcome == "already_resolved":
        by = f" by {row['operator']}" if row["operator"] else ""
        raise ResolutionRefused(
            f"job {job} was already resolved{by} ({row['state']}, charged {row['charged']}); nothing to reconcile",
            code="reservation_already_resolved",
        )
    return ResolveResult(
        outcome=outcome,
        job_id=job,
        customer_id=row["customer_id"],
        state=row["state"],
        credits=row["credits"],
        charged=row["charged"],
        released=row["released"],
        expired=row["expired"],
        resolved_at=row["resolved_at"],
        operator=row["operator"],
        reason=row["reason"],
    )


def parse_mark_unknown(row: Mapping[str, Any]) -> UnknownResult:
    outcome, job = row["outcome"], row["job_id"]
    if outcome == "not_found":
        raise ResolutionRefused(
            f"no reservation for job {job}; check the job id (`specialists reservations list`)",
            code="reservation_not_found",
        )
    if outcome == "already_resolved":
        raise ResolutionRefused(
            f"job {job} is already resolved ({row['state']}); its outcome is known", code="reservation_already_resolved"
        )
    return UnknownResult(
        outcome=outcome,
        job_id=job,
        customer_id=row["customer_id"],
        state=row["state"],
        credits=row["credits"],
        unknown_at=row["unknown_at"],
        unknown_reason=row["unknown_reason"],
        unknown_by=row["unknown_by"],
    )


def parse_expired(row: Mapping[str, Any]) -> ExpiredLot:
    return ExpiredLot(
        customer_id=row["customer_id"], lot_id=row["lot_id"], credits=row["credits"], expires_at=row["expires_at"]
    )


def parse_adjust(row: Mapping[str, Any]) -> AdjustResult:
    outcome, customer = row["outcome"], row["customer_id"]
    if outcome == "account_not_found":
        raise AdjustRefused(
            f"customer {customer} has no credit account; a first `specialists credits grant` creates it",
            code="account_not_found",
        )
    if outcome == "insufficient_credits":
        raise AdjustRefused(
            f"customer {customer} has {row['available']} credits available (unexpired, not held); "
            f"an adjustment of {row['credits']} would make that negative",
            code="adjust_exceeds_available",
        )
    return AdjustResult(
        outcome=outcome,
        customer_id=customer,
        credits=row["credits"],
        available=row["available"],
        lots=_holds(row["lot_ids"], row["lot_credits"]),
    )
