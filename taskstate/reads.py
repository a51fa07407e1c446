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

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, text

from ledger import reads as ledger_reads
from ledger.errors import LedgerInputInvalid
from ledger.limits import check_period, default_limits
from ledger.statements import customer_id_param
from taskstate import admitted, claims, liveness, outbox, push, rows

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
    "CASE WHEN e.reservation_id IS NULL THEN NULL ELSE e.reserved_credits END AS reserved_credits, "
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
# ``redelivery``: of those, the ones a dispatcher already tried to deliver (a worker unreachable, full or failing),
# which wait to be delivered again.
QUEUE_SQL = text(
    "SELECT o.specialist_id, count(*) AS queued, count(*) FILTER (WHERE o.attempts > 0) AS redelivery, "
    "min(o.created_at) AS oldest_queued_at "
    f"FROM {outbox.open_jobs_relation()} o WHERE {claims.queued_sql('o.job_id')} "
    "GROUP BY o.specialist_id ORDER BY o.specialist_id"
)


def queue(conn: Connection) -> list[dict[str, Any]]:
    """Per specialist with queued jobs: {specialist_id, queued, redelivery, oldest_queued_at} (when its oldest queued
    job was queued: its task's admission, or the follow-up message that made it)."""
    return [{"specialist_id": r.specialist_id, "queued": int(r.queued), "redelivery": int(r.redelivery),
             "oldest_queued_at": r.oldest_queued_at}
            for r in conn.execute(QUEUE_SQL)]


# --- what health reads, and the gauges of the same facts (issue 42) --------------------------------------------


@dataclass(frozen=True)
class SpecialistQueue:
    specialist_id: str
    queued: int  # jobs no worker has taken yet
    redelivery: int  # of those, the ones whose delivery was tried and must be repeated
    oldest_queued_at: datetime
    oldest_age_s: float


@dataclass(frozen=True)
class ServiceFacts:
    """Whether work can run: the workers alive and what they serve, what waits, what could not be pushed, what is
    unknown. One read for `specialists health`, the console's health page, the dispatchers' gauges and the edge's
    ``/metrics``, so they cannot disagree."""

    checked_at: datetime  # the database's clock
    live_s: float  # the bound a worker's beat must be within (SPECIALISTS_HEALTH_WORKER_LIVE_S)
    workers: list[liveness.WorkerBeat]  # live and recently dead, newest beat first
    live_workers: dict[str, int]  # per specialist asked about: how many live workers serve it
    queue: list[SpecialistQueue]  # specialists with queued jobs only
    push: push.Backlog
    unknown_jobs: int  # jobs whose outcome is unknown, holding credits (at most push.MAX_COUNTED)

    @property
    def without_live_worker(self) -> list[str]:
        return sorted(s for s, n in self.live_workers.items() if n == 0)

    @property
    def queued(self) -> int:
        return sum(q.queued for q in self.queue)

    @property
    def redelivery(self) -> int:
        return sum(q.redelivery for q in self.queue)

    @property
    def oldest_queued_age_s(self) -> float | None:
        return max((q.oldest_age_s for q in self.queue), default=None)

    def points(self) -> list[tuple[str, float, dict[str, str]]]:
        """These facts as the points of ``core.telemetry.SERVICE_GAUGES``: (gauge, value, attributes)."""
        found: list[tuple[str, float, dict[str, str]]] = [
            ("specialists.workers.live", float(n), {"specialist": s}) for s, n in sorted(self.live_workers.items())]
        for q in self.queue:
            found += [("specialists.queue.depth", float(q.queued), {"specialist": q.specialist_id}),
                      ("specialists.queue.age", q.oldest_age_s, {"specialist": q.specialist_id}),
                      ("specialists.queue.redelivery", float(q.redelivery), {"specialist": q.specialist_id})]
        return found + [
            ("specialists.push.pending", float(self.push.pending), {}),
            ("specialists.push.retrying", float(self.push.retrying), {}),
            ("specialists.push.due_age", self.push.oldest_due_age_s or 0.0, {}),
            ("specialists.push.failed_recent", float(self.push.failed), {}),
            ("specialists.jobs.unknown_open", float(self.unknown_jobs), {}),
        ]


def service_facts(conn: Connection, *, specialists: list[str], live_s: float, failures_window_s: float
                  ) -> ServiceFacts:
    """The facts of ``ServiceFacts`` for the served ``specialists``: five bounded statements, times by the
    database's clock."""
    now = conn.exec_driver_sql("SELECT now()").scalar_one()
    beats = liveness.workers(conn, live_s=live_s)
    live_workers = {s: 0 for s in specialists}
    for worker in beats:
        if worker.live:
            for served in worker.specialists:
                if served in live_workers:
                    live_workers[served] += 1
    waiting = [SpecialistQueue(q["specialist_id"], q["queued"], q["redelivery"], q["oldest_queued_at"],
                               max(0.0, (now - q["oldest_queued_at"]).total_seconds())) for q in queue(conn)]
    return ServiceFacts(
        checked_at=now, live_s=live_s, workers=beats, live_workers=live_workers, queue=waiting,
        push=push.backlog(conn, failed_since=now - timedelta(seconds=failures_window_s)),
        unknown_jobs=claims.unknown_count(conn, cap=push.MAX_COUNTED),
    )

