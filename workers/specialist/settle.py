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

from workers.specialist import a2a


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


def final_metadata(conn: Connection, job_id: str, detail: dict[str, Any], credits_charged: int | None
                   ) -> dict[str, Any] | None:
    """The ``specialist`` metadata of the task's final state (None: not a specialist run): semantic calls
    used and charged come from the journal, credits charged from the settlement itself."""
    row = conn.execute(
        text(
            "SELECT count(*) FILTER (WHERE purpose = 'subcall' AND superseded_by IS NULL) AS used, "
            "count(*) FILTER (WHERE purpose = 'subcall' AND superseded_by IS NULL AND state = 'completed') AS charged, "
            "(SELECT resumes FROM specialist_runs WHERE job_id = :j) AS resumes "
            "FROM specialist_calls WHERE job_id = :j"
        ),
        {"j": job_id},
    ).one()
    if row.resumes is None:
        return None
    merged = {**detail, "semantic_calls_used": int(row.used), "semantic_calls_charged": int(row.charged),
              "resumes": int(row.resumes)}
    return a2a.final_metadata(merged, credits_charged)


def semantic_calls_used(conn: Connection, job_id: str) -> int:
    return int(
        conn.execute(
            text("SELECT count(*) FROM specialist_calls WHERE job_id = :j AND purpose = 'subcall' "
                 "AND superseded_by IS NULL"),
            {"j": job_id},
        ).scalar_one()
    )
