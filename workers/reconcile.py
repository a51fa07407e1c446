"""An operator's verdict on an unknown job: the claim, the A2A task and the ledger resolved in one transaction.

`specialists reconcile <job> --charged N --state completed|failed|canceled --reason ...`
names the job as the ledger does (a task's reservation has the task's id). For a
task whose job is unknown it, in one transaction: resolves the job's claim with
the stated outcome (``job_resolve_unknown``, the reason kept for audit), closes
its outbox row, finishes the A2A task in that state (the customer sees the
operator's verdict, not the reason), and reconciles the reservation in the
ledger (``ledger_reconcile``: charged N, the rest released, once). A task of a
free specialist has no reservation: ``--charged`` must be 0. A ledger job with no
A2A task (marked unknown by hand) is reconciled in the ledger alone.

Repeating the same reconcile answers "exists"; a different amount is refused by
the ledger, and nothing else changes. Lock order as everywhere: claims, outbox,
task, ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, text

from core.errors import ServiceError
from ledger import operations
from ledger.limits import LedgerSettings
from ledger.results import ResolveResult
from workers import claims
from workers.tasks import TaskEvents, TaskRef

RECONCILE_STATES = ("completed", "failed", "canceled")

_UNKNOWN_JOBS = text(
    "SELECT c.job_id, o.task_id, o.dispatch_id, o.owner, o.context_id "
    "FROM dispatch_outbox o JOIN job_claims c ON c.job_id = o.task_id || '.' || o.dispatch_id "
    "WHERE o.task_id = :task AND c.state = 'unknown' ORDER BY o.dispatch_id FOR UPDATE OF c"
)
_EDGE_TASK = text("SELECT task_id, reservation_id, owner FROM edge_tasks WHERE task_id = :task")
_CLOSE_ROW = text(
    "UPDATE dispatch_outbox SET status = 'done', finished_at = now() "
    "WHERE dispatch_id = :d AND status IN ('pending', 'sent', 'undeliverable')"
)


class ReconcileRefused(ServiceError):
    """codes: state_required, state_invalid, charge_without_reservation."""

    code = "reconcile_refused"


@dataclass(frozen=True)
class Reconciled:
    job_id: str
    jobs_resolved: tuple[str, ...]  # the claims resolved now (one per unknown job of the task)
    task_state: str | None  # the A2A task's final state, when this reconcile finished it
    ledger: ResolveResult | None  # None: the task reserved nothing

    def as_record(self) -> dict[str, Any]:
        from dataclasses import asdict

        record: dict[str, Any] = asdict(self.ledger) if self.ledger else {"job_id": self.job_id, "outcome": "reconciled"}
        record.update(jobs_resolved=list(self.jobs_resolved), task_state=self.task_state)
        return record


def reconcile(
    engine: Engine,
    job_id: str,
    *,
    charged: int,
    state: str | None,
    reason: str,
    operator: str,
    limits: LedgerSettings | None = None,
) -> Reconciled:
    if state is not None and state not in RECONCILE_STATES:
        raise ReconcileRefused(f"--state must be one of {', '.join(RECONCILE_STATES)}", code="state_invalid")
    tasks = TaskEvents(engine)
    with engine.begin() as conn:
        result = _reconcile(conn, tasks, job_id, charged=charged, state=state, reason=reason, operator=operator,
                            limits=limits)
    if result.task_state is not None:
        tasks.notify(job_id)
    return result


def _reconcile(
    conn: Connection,
    tasks: TaskEvents,
    job_id: str,
    *,
    charged: int,
    state: str | None,
    reason: str,
    operator: str,
    limits: LedgerSettings | None,
) -> Reconciled:
    unknown = conn.execute(_UNKNOWN_JOBS, {"task": job_id}).all()
    edge = conn.execute(_EDGE_TASK, {"task": job_id}).one_or_none()
    if edge is None:  # a ledger job without an A2A task
        return Reconciled(job_id, (), None, operations.reconcile(conn, job_id, charged, reason, operator, limits=limits))
    if state is None:
        raise ReconcileRefused(
            f"job {job_id} is an A2A task: say how it ended with --state {'|'.join(RECONCILE_STATES)}",
            code="state_required",
        )
    if edge.reservation_id is None and charged != 0:
        raise ReconcileRefused(
            f"task {job_id} is of a free specialist and reserved nothing; --charged must be 0",
            code="charge_without_reservation",
        )
    resolved: list[str] = []
    finished = False
    for row in unknown:
        claims.resolve_unknown(conn, row.job_id, outcome=state, reason=reason, operator=operator)
        conn.execute(_CLOSE_ROW, {"d": row.dispatch_id})
        resolved.append(row.job_id)
        ref = TaskRef(row.task_id, int(row.dispatch_id), row.owner, row.context_id)
        finished = tasks.resolve(conn, ref, state) or finished
    ledger = (
        operations.reconcile(conn, edge.reservation_id, charged, reason, operator, limits=limits)
        if edge.reservation_id is not None
        else None
    )
    return Reconciled(job_id, tuple(resolved), state if finished else None, ledger)


_UNKNOWN_FREE = text(
    "SELECT o.task_id AS job_id, e.customer_id, e.specialist_id AS skill, 0 AS credits, 'unknown' AS state, "
    "NULL AS charged, e.admitted_at AS created_at, c.unknown_reason, NULL AS resolved_by "
    "FROM job_claims c JOIN dispatch_outbox o ON c.job_id = o.task_id || '.' || o.dispatch_id "
    "JOIN edge_tasks e ON e.task_id = o.task_id "
    "WHERE c.state = 'unknown' AND e.reservation_id IS NULL "
    "AND (CAST(:customer AS text) IS NULL OR e.customer_id = :customer) ORDER BY c.unknown_at LIMIT :n"
)


def unknown_free_tasks(engine: Engine, *, customer_id: str | None, limit: int) -> list[dict[str, Any]]:
    """Unknown jobs of free specialists' tasks: no reservation to list, but an operator must still see them."""
    with engine.connect() as conn:
        return [dict(row) for row in conn.execute(_UNKNOWN_FREE, {"customer": customer_id, "n": limit}).mappings()]
