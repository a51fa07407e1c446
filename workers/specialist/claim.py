"""The claim a specialist worker makes: an expired lease with a checkpoint is resumed, within a limit.

``claim`` is ``workers.claims.claim`` with one more way out, decided in the same
server-side function (``specialist_claim``, migration 0070) under the claim row's
lock: a job whose running claim's lease expired, which has a Monty checkpoint
and has been resumed fewer than ``max_resumes`` times
(``SPECIALISTS_SPECIALIST_MAX_RESUMES``), is claimed again with the next fencing
token and ``resumed=True``; the runner then continues it from the checkpoint.
Without a checkpoint, or past the limit, the job becomes unknown exactly as
before (``newly_unknown``: mark the ledger and the task in this transaction).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from workers.claims import ClaimResult, _aware, _check_lease


@dataclass(frozen=True)
class SpecialistClaim:
    claim: ClaimResult
    resumed: bool


def claim(
    conn: Connection, job_id: str, *, worker_id: str, lease_s: float, max_resumes: int, now: datetime | None = None
) -> SpecialistClaim:
    """``now``: None is the database clock; a time decides as of then (see ``workers.claims``)."""
    _check_lease(lease_s)
    row = conn.execute(
        text("SELECT * FROM specialist_claim(:j, :w, :l, :m, CAST(:n AS timestamptz))"),
        {"j": job_id, "w": worker_id[:200], "l": lease_s, "m": max_resumes, "n": _aware(now)},
    ).mappings().one()
    return SpecialistClaim(
        claim=ClaimResult(
            outcome=row["outcome"],
            fencing_token=int(row["fencing_token"]),
            lease_expires_at=row["lease_expires_at"],
            retry_after_s=row["retry_after_s"],
            job_outcome=row["job_outcome"],
            job_outcome_detail=row["job_outcome_detail"],
            newly_unknown=bool(row["newly_unknown"]),
        ),
        resumed=bool(row["resumed"]),
    )
