"""What the edge may ask about the jobs it dispatched: their ids, whether any ran, and cancel.

The edge imports dispatch only (docs/ARCHITECTURE.md); cancelling is the one
claim operation it needs, so it is offered here rather than the edge reaching
into ``workers.claims``. Every function runs on the caller's connection, inside
its transaction (the cancel's: claim rows first, then outbox, task and ledger).
"""

from __future__ import annotations

from sqlalchemy import Connection, text

from workers import claims
from workers.claims import CancelOutcome
from workers.dispatch.base import job_id_for

__all__ = ["CancelOutcome", "any_claimed", "any_unknown", "job_id_for", "request_cancel"]


def request_cancel(conn: Connection, task_id: str, dispatch_id: int, *, reason: str) -> CancelOutcome:
    """Cancel one job: ``canceled_before_claim`` (it never runs), ``cancel_requested`` (its worker stops
    within a heartbeat), ``already_finished`` or ``unknown``."""
    return claims.request_cancel(conn, job_id_for(task_id, dispatch_id), reason=reason)


def any_claimed(conn: Connection, task_id: str) -> bool:
    """Whether a worker ever claimed one of the task's jobs (work started: a cancel charges the tariff)."""
    return bool(
        conn.execute(
            text(
                "SELECT EXISTS (SELECT 1 FROM dispatch_outbox o JOIN job_claims c "
                "ON c.job_id = o.task_id || '.' || o.dispatch_id WHERE o.task_id = :t AND c.claims > 0)"
            ),
            {"t": task_id},
        ).scalar()
    )


def any_unknown(conn: Connection, task_id: str) -> bool:
    """Whether one of the task's jobs has an unknown outcome (its row may be closed: the claim decides)."""
    return bool(
        conn.execute(
            text(
                "SELECT EXISTS (SELECT 1 FROM dispatch_outbox o JOIN job_claims c "
                "ON c.job_id = o.task_id || '.' || o.dispatch_id WHERE o.task_id = :t AND c.state = 'unknown')"
            ),
            {"t": task_id},
        ).scalar()
    )
