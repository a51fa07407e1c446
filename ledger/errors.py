"""The ledger's errors: each a ServiceError with a stable ``code`` and a message a person can act on.

A refused reservation is normally returned as data (``ReserveResult.outcome``); these
classes are for inputs that were never valid and for refusals of grant, settle,
reconcile, mark-unknown and adjust, which a correct caller does not expect.
"""

from __future__ import annotations

from core.errors import ServiceError


class LedgerError(ServiceError):
    code = "ledger_error"


class LedgerInputInvalid(LedgerError):
    """An argument is outside what the ledger accepts; nothing was sent to the database."""

    code = "ledger_input_invalid"


class ReadTooLarge(LedgerInputInvalid):
    """A read would return more rows than it may (SPECIALISTS_LEDGER_MAX_ROWS_PER_LISTING): it is refused, never
    cut, since part of it would read as the whole (a usage total)."""

    code = "read_too_large"


class CustomerNotFound(LedgerError):
    """The service knows no customer by this id (a typo, or one never added: `specialists customers add`)."""

    code = "customer_not_found"

    customer_id: str = ""  # the id not found, for a "did you mean" (ledger/near.py)

    @classmethod
    def of(cls, customer_id: str) -> "CustomerNotFound":
        found = cls(
            f"no customer {customer_id!r}: check the id (`specialists customers list`), or add the customer first "
            f"(`specialists customers add --customer {customer_id}`)"
        )
        found.customer_id = customer_id
        return found


class AccountRefused(LedgerError):
    """Opening an account or changing its cap was refused. codes: account_not_found, max_parallel_below_open."""

    code = "account_refused"


class GrantRefused(LedgerError):
    """codes: grant_idempotency_mismatch, max_parallel_below_open, expiry_not_in_future."""

    code = "grant_refused"


class ReservationRefused(LedgerError):
    """code: the reserve outcome (not_entitled, expired, insufficient_credits, concurrency_cap, exists_mismatch)."""

    code = "reservation_refused"


class ResolutionRefused(LedgerError):
    """settle, void, reconcile or mark-unknown was refused.

    codes: reservation_not_found, settle_mismatch, reservation_unknown, charge_exceeds_reserved,
    reservation_not_unknown, reservation_already_resolved.
    """

    code = "resolution_refused"


class AdjustRefused(LedgerError):
    """codes: account_not_found, adjust_exceeds_available."""

    code = "adjust_refused"
