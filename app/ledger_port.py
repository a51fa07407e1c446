"""The edge's calls into the credit ledger, inside the caller's transaction, with customer-facing refusals.

The ledger returns refusals as data (``ReserveResult.outcome``); here each
outcome becomes the edge's A2A error for it, with a message written for the
customer (the ledger's own messages name operator commands). A task's ledger
job id is its A2A task id; the entitlement a customer needs is the
specialist's id.
"""

from __future__ import annotations

from sqlalchemy import Connection

from app.errors import RESERVATION_REFUSALS, ReservationConflict
from ledger import operations, reads, results
from ledger import statements as ledger_statements
from ledger.limits import default_limits

def _customer_message(result: results.ReserveResult, specialist_id: str, credits: int) -> str:
    outcome = result.outcome
    if outcome == results.NOT_ENTITLED:
        return f"your account is not entitled to the specialist {specialist_id!r}; ask your operator to grant it"
    if outcome == results.EXPIRED:
        when = f" on {result.expired_at.isoformat()}" if result.expired_at else ""
        return f"your entitlement to {specialist_id!r}, or all of your credits, expired{when}; ask your operator to renew it"
    if outcome == results.INSUFFICIENT_CREDITS:
        return (
            f"your account has {result.available} credits available; this specialist reserves {credits} per task. "
            "Ask your operator for credits, or wait for your running tasks to settle"
        )
    if outcome == results.CONCURRENCY_CAP:
        return (
            f"your account already has {result.open_reservations} tasks running, its limit is {result.max_parallel}; "
            "retry when one finishes"
        )
    return f"the reservation was refused ({outcome})"


def reserve(
    conn: Connection, *, customer_id: str, task_id: str, fingerprint_hex: str, specialist_id: str, credits: int
) -> str:
    """Hold ``credits`` for the task; return the reservation's job id, or raise the refusal."""
    result = operations.reserve(conn, customer_id, task_id, fingerprint_hex, specialist_id, credits)
    if result.ok:
        assert result.job_id == task_id
        return result.job_id
    if result.outcome == results.EXISTS_MISMATCH:
        raise ReservationConflict(
            f"task {task_id} already holds a reservation for other terms; send the message again with a new messageId"
        )
    refusal = RESERVATION_REFUSALS.get(result.outcome)
    if refusal is None:  # an outcome added to the ledger after this edge was written
        raise ReservationConflict(_customer_message(result, specialist_id, credits), code=result.outcome)
    details: dict[str, object] = {"specialist": specialist_id, "tariff_credits": credits}
    if result.available is not None:
        details["available_credits"] = result.available
    if result.max_parallel is not None:
        details["max_parallel"] = result.max_parallel
    raise refusal(_customer_message(result, specialist_id, credits), **details)


def check_reserve(*, customer_id: str, task_id: str, fingerprint_hex: str, specialist_id: str, credits: int) -> None:
    """Check what ``reserve`` would hand the ledger, as the ledger checks it, without a round trip: admission in one
    statement calls ``ledger_reserve`` itself with these (app/admission.py). Raises the ledger's LedgerInputInvalid."""
    ledger_statements.reserve_params(customer_id, task_id, fingerprint_hex, specialist_id, credits, now=None,
                                     limits=default_limits())


def available_credits(conn: Connection, customer_id: str) -> int | None:
    """Credits the customer can reserve now; None when the ledger has no account for them."""
    account = reads.account(conn, customer_id, max_rows=1)
    return None if account is None else account.available
