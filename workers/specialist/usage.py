"""What specialist runs used, for operators (``specialists usage``): per job, and per model call of a job.

Tokens and cost are the sums of what providers reported. A call whose usage
nobody knows (in flight when a worker died, a timeout, an answer without usage,
a model without a price) is counted apart and never as zero: a total next to a
non-zero ``calls_with_unknown_*`` is a lower bound.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

MAX_ROWS = 1000

_JOBS = text(
    """
    SELECT r.job_id, r.specialist_id, r.route, r.state, r.outcome, r.stop_reason, r.resumes, r.turns,
           r.semantic_calls_used, r.semantic_calls_charged, r.pricing, r.tariff_credits, r.credits_to_settle,
           r.started_at, r.ended_at,
           count(c.call_id) AS model_calls,
           coalesce(sum(c.replays), 0) AS replayed_calls,
           coalesce(sum(c.prompt_tokens), 0) AS prompt_tokens,
           coalesce(sum(c.completion_tokens), 0) AS completion_tokens,
           coalesce(sum(c.cost_usd), 0) AS cost_usd,
           count(c.call_id) FILTER (WHERE c.state IN ('started', 'unknown')
                                    OR (c.state = 'completed' AND (c.prompt_tokens IS NULL OR c.completion_tokens IS NULL)))
             AS calls_with_unknown_tokens,
           count(c.call_id) FILTER (WHERE c.state IN ('started', 'unknown')
                                    OR (c.state = 'completed' AND c.cost_usd IS NULL)) AS calls_with_unknown_cost
      FROM specialist_runs r LEFT JOIN specialist_calls c ON c.job_id = r.job_id
     WHERE (CAST(:sp AS text) IS NULL OR r.specialist_id = :sp)
       AND (CAST(:job AS text) IS NULL OR r.job_id = :job)
     GROUP BY r.job_id
     ORDER BY r.started_at DESC, r.job_id
     LIMIT :n
    """
)

_CALLS = text(
    """
    SELECT call_id, purpose, turn, step_index, state, model, prompt_tokens, completion_tokens, cost_usd, replays,
           superseded_by, fencing_token AS claim, note, started_at, ended_at
      FROM specialist_calls WHERE job_id = :job ORDER BY call_id LIMIT :n
    """
)


def jobs(conn: Connection, *, specialist_id: str | None = None, job_id: str | None = None,
         limit: int = 50) -> list[dict[str, Any]]:
    """One row per job, newest first."""
    rows = conn.execute(
        _JOBS, {"sp": specialist_id, "job": job_id, "n": max(1, min(limit, MAX_ROWS))}
    ).mappings()
    return [{**row, "cost_usd": float(row["cost_usd"])} for row in rows]


def calls(conn: Connection, job_id: str, *, limit: int = MAX_ROWS) -> list[dict[str, Any]]:
    """Every model call of one job, in order, with what it reported (None: unknown)."""
    rows = conn.execute(_CALLS, {"job": job_id, "n": max(1, min(limit, MAX_ROWS))}).mappings()
    return [{**row, "cost_usd": None if row["cost_usd"] is None else float(row["cost_usd"])} for row in rows]
