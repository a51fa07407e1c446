"""What a specialist job settles, decided in the finish's transaction from the job's own journal.

``credits_for_job`` is the settlement's answer for a job a specialist ran:
``rejected`` charges 0, ``input_required`` settles nothing yet; otherwise the
runner's own figure when it returned one (``credits_to_settle``: 0 for a refused
task or a resume the service could not make), else the journal's
(``specialist_credits``, migration 0070: the tariff for ``fixed`` pricing, the
base plus each answered semantic call for ``metered``, never above the tariff),
which also covers a run the worker stopped or abandoned. ``None`` for a job
that is not a specialist run: the caller's own policy applies.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text


def credits_for_job(conn: Connection, job_id: str, state: str, detail: dict[str, Any]) -> int | None:
    journal = conn.execute(text("SELECT specialist_credits(:j)"), {"j": job_id}).scalar()
    if journal is None:
        return None
    if state == "rejected":
        return 0
    runner = detail.get("credits_to_settle")
    if isinstance(runner, int) and not isinstance(runner, bool):
        return min(runner, int(journal)) if runner else 0
    return int(journal)


def semantic_calls_used(conn: Connection, job_id: str) -> int:
    return int(
        conn.execute(
            text("SELECT count(*) FROM specialist_calls WHERE job_id = :j AND purpose = 'subcall' "
                 "AND superseded_by IS NULL"),
            {"j": job_id},
        ).scalar_one()
    )
