"""The operator's reads of admitted tasks (issue 20): tasks by outcome per day, a customer's newest tasks, and the
queue of jobs no worker has taken yet. The CLI and the console show the same rows.

Each read is one statement composed of its owners' relations (``admitted``, ``rows``, ``outbox``, ``claims``,
and the ledger's reservations), so no table is named outside its owner. Each is bounded: a period of at most
``SPECIALISTS_LEDGER_MAX_USAGE_DAYS`` (``ledger.limits.check_period``), a number of rows, or the jobs in flight.

A task's ``state`` is its A2A state as the CLI shows it (``TASK_STATE_COMPLETED`` reads ``completed``), except
that a task with a job whose outcome is unknown now is ``unknown``: its A2A state stays ``working`` until an
operator reconciles it, and that is what an operator must see.

These functions check ids' form only; whether the service knows a customer is the caller's check
(``Ledger.require_customer``), so that a typo is an error and never an empty answer.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from ledger import reads as ledger_reads
from ledger.errors import LedgerInputInvalid
from ledger.limits import check_period, default_limits
from ledger.statements import customer_id_param
from taskstate import admitted, claims, outbox, rows

# A task's state: 'unknown' when one of its jobs is, else its A2A state without the prefix, in lower case.
_STATE = (f"CASE WHEN {claims.task_unknown_sql('e.task_id')} THEN 'unknown' "
          "ELSE COALESCE(lower(replace(s.a2a_state, 'TASK_STATE_', '')), 'unspecified') END")

# Tasks admitted in [since, until) by UTC day, specialist and state: the admissions' time index
# (edge_tasks_admitted; one customer's: edge_tasks_customer), each task's status and jobs by their keys.
_BY_OUTCOME = (
    f"SELECT CAST(e.admitted_at AT TIME ZONE 'UTC' AS date) AS day, e.specialist_id, {_STATE} AS state, "
    f"count(*) AS task_count FROM {admitted.admitted_relation()} e CROSS JOIN {rows.status_of_sql('e.task_id')} s "
    "WHERE e.admitted_at >= :since AND e.admitted_at < :until {customer}"
    "GROUP BY 1, 2, 3 ORDER BY day, e.specialist_id, state"
)
BY_OUTCOME_SQL = text(_BY_OUTCOME.format(customer=""))
BY_OUTCOME_OF_CUSTOMER_SQL = text(_BY_OUTCOME.format(customer="AND e.customer_id = :c "))


def tasks_by_outcome(
    conn: Connection, *, since: datetime, until: datetime, customer_id: str | None = None
) -> list[dict[str, Any]]:
    """Tasks admitted in [``since``, ``until``) per UTC day, specialist and state: rows {day, specialist_id, state,
    tasks}, by day, specialist, state. The period is at most SPECIALISTS_LEDGER_MAX_USAGE_DAYS; the rows are at
    most its days times the specialists times the states."""
    check_period(since, until, default_limits())
    params: dict[str, Any] = {"since": since, "until": until}
    if customer_id is not None:
        params["c"] = customer_id_param(customer_id)
    sql = BY_OUTCOME_OF_CUSTOMER_SQL if customer_id is not None else BY_OUTCOME_SQL
    return [
        {"day": row.day, "specialist_id": row.specialist_id, "state": row.state, "tasks": int(row.task_count)}
        for row in conn.execute(sql, params)
    ]


# A customer's newest tasks (edge_tasks_customer, backwards), each with its status, its reservation (by its key) and
# its jobs (the outbox rows still kept, by the task's index).
CUSTOMER_TASKS_SQL = text(
    f"SELECT e.task_id, e.specialist_id, {_STATE} AS state, e.admitted_at AS created_at, "
    "s.last_updated AT TIME ZONE 'UTC' AS updated_at, "
    "CASE WHEN e.reservation_id IS NULL THEN NULL ELSE e.tariff_credits END AS reserved_credits, "
    "r.charged AS charged_credits, "
    f"ARRAY(SELECT o.job_id FROM {outbox.jobs_relation()} o WHERE o.task_id = e.task_id ORDER BY o.dispatch_id) "
    "AS job_ids "
    f"FROM {admitted.admitted_relation()} e CROSS JOIN {rows.status_of_sql('e.task_id')} s "
    f"LEFT JOIN {ledger_reads.reservations_relation()} r ON r.job_id = e.reservation_id "
    "WHERE e.customer_id = :c ORDER BY e.admitted_at DESC, e.task_id DESC LIMIT :n"
)


def customer_tasks(conn: Connection, customer_id: str, *, limit: int) -> list[dict[str, Any]]:
    """The customer's newest ``limit`` tasks (at most SPECIALISTS_LEDGER_MAX_ROWS_PER_LISTING), newest first: rows
    {task_id, specialist_id, state, created_at, updated_at, reserved_credits (None: a free specialist, nothing
    held), charged_credits (None: free, or not settled yet), job_ids (the jobs whose outbox rows are kept:
    SPECIALISTS_DISPATCH_OUTBOX_RETENTION_DAYS)}."""
    if limit < 1:
        raise LedgerInputInvalid(f"a listing shows at least 1 row, got {limit}")
    found = conn.execute(CUSTOMER_TASKS_SQL, {"c": customer_id_param(customer_id),
                                              "n": min(limit, default_limits().max_rows_per_listing)}).mappings()
    return [
        dict(row) | {"reserved_credits": _int(row["reserved_credits"]), "charged_credits": _int(row["charged_credits"]),
                     "job_ids": list(row["job_ids"])}
        for row in found
    ]


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


# The jobs no worker has taken yet, per specialist: the open outbox rows (the jobs in flight), each one's claim by
# its key. A job whose delivery is in flight but not yet claimed counts as queued.
QUEUE_SQL = text(
    "SELECT o.specialist_id, count(*) AS queued, min(o.created_at) AS oldest_queued_at "
    f"FROM {outbox.open_jobs_relation()} o WHERE {claims.queued_sql('o.job_id')} "
    "GROUP BY o.specialist_id ORDER BY o.specialist_id"
)


def queue(conn: Connection) -> list[dict[str, Any]]:
    """Per specialist with queued jobs: {specialist_id, queued, oldest_queued_at} (when its oldest queued job was
    queued: its task's admission, or the follow-up message that made it)."""
    return [{"specialist_id": r.specialist_id, "queued": int(r.queued), "oldest_queued_at": r.oldest_queued_at}
            for r in conn.execute(QUEUE_SQL)]

