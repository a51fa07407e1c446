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

The operator states the charge. Beside it the record shows what the charge rule
(``taskstate.charge``) would have charged had the job ended in the stated state
(``rule_credits``), from the reserved credits and the executor's record of the
job: the ``UsageSource`` its caller passes (``workers.assembly.USAGE``, which the
finish's settlement reads too; for an rlm run its journal), so this module knows no
executor. A figure to compare, never applied on its own.

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
from taskstate import admitted, charge, claims, outbox
from taskstate.updates import TaskEvents
from workers.runs import RunOutcome
from workers.settlement import UsageSource

RECONCILE_STATES = ("completed", "failed", "canceled")

class ReconcileRefused(ServiceError):
    """codes: state_required, state_invalid, charge_without_reservation."""

    code = "reconcile_refused"


@dataclass(frozen=True)
class Reconciled:
    job_id: str
    jobs_resolved: tuple[str, ...]  # the claims resolved now (one per unknown job of the task)
    task_state: str | None  # the A2A task's final state, when this reconcile finished it
    ledger: ResolveResult | None  # None: the task reserved nothing
    rule_credits: int | None = None  # what the charge rule gives for the stated state (None: not an A2A task)

    def as_record(self) -> dict[str, Any]:
        from dataclasses import asdict

        record: dict[str, Any] = asdict(self.ledger) if self.ledger else {"job_id": self.job_id, "outcome": "reconciled"}
        record.update(jobs_resolved=list(self.jobs_resolved), task_state=self.task_state,
                      rule_credits=self.rule_credits)
        return record


def reconcile(
    engine: Engine,
    job_id: str,
    *,
    charged: int,
    state: str | None,
    reason: str,
    operator: str,
    usage: UsageSource | None,
    limits: LedgerSettings | None = None,
) -> Reconciled:
    """``usage``: the executors' record of a job (``workers.assembly.USAGE``; None: every job at its fixed price)."""
    if state is not None and state not in RECONCILE_STATES:
        raise ReconcileRefused(f"--state must be one of {', '.join(RECONCILE_STATES)}", code="state_invalid")
    tasks = TaskEvents(engine)
    with engine.begin() as conn:
        result = _reconcile(conn, tasks, job_id, charged=charged, state=state, reason=reason, operator=operator,
                            usage=usage, limits=limits)
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
    usage: UsageSource | None,
    limits: LedgerSettings | None,
) -> Reconciled:
    unknown = claims.unknown_of_task(conn, job_id)
    hold = admitted.hold_of(conn, job_id)
    if hold is None:  # a ledger job without an A2A task
        return Reconciled(job_id, (), None, operations.reconcile(conn, job_id, charged, reason, operator, limits=limits))
    if state is None:
        raise ReconcileRefused(
            f"job {job_id} is an A2A task: say how it ended with --state {'|'.join(RECONCILE_STATES)}",
            code="state_required",
        )
    if hold.reservation_id is None and charged != 0:
        raise ReconcileRefused(
            f"task {job_id} is of a free specialist and reserved nothing; --charged must be 0",
            code="charge_without_reservation",
        )
    resolved: list[str] = []
    finished = False
    rule = _rule_credits(conn, state, hold, [job.job_id for job in unknown], usage)
    for job in unknown:
        claims.resolve_unknown(conn, job.job_id, outcome=state, reason=reason, operator=operator)
        outbox.close(conn, job.ref.dispatch_id)
        resolved.append(job.job_id)
        finished = tasks.resolve(conn, job.ref, state) or finished
    ledger = (
        operations.reconcile(conn, hold.reservation_id, charged, reason, operator, limits=limits)
        if hold.reservation_id is not None
        else None
    )
    return Reconciled(job_id, tuple(resolved), state if finished else None, ledger, rule)


def _rule_credits(conn: Connection, state: str, hold: admitted.Hold, job_ids: list[str],
                  usage: UsageSource | None) -> int:
    """What the charge rule gives for the stated state: from the usage source's record of the last unknown job,
    if it keeps one (an rlm run's journal), else at the fixed price."""
    if hold.reservation_id is None:
        return 0
    outcome = RunOutcome(state)  # type: ignore[arg-type]  # one of RECONCILE_STATES, checked above
    used = usage.usage_of_job(conn, job_ids[-1], outcome) if usage is not None and job_ids else None
    credits = charge.charged_credits(
        outcome.state,
        reserved_credits=hold.reserved_credits,
        pricing=charge.FIXED if used is None else used.pricing,
        usage=charge.NO_USAGE if used is None else used.usage,
    )
    return credits or 0


def rule_charges(conn: Connection, task_id: str, job_ids: list[str], usage: UsageSource | None) -> dict[str, int] | None:
    """What the charge rule gives for each way the task may have ended (``RECONCILE_STATES``), from its reservation
    and ``usage``'s record of its last job in ``job_ids`` (``workers.assembly.USAGE``): the figures an operator
    chooses between (the console's reservations). None: not an A2A task (a ledger job alone)."""
    hold = admitted.hold_of(conn, task_id)
    if hold is None:
        return None
    return {state: _rule_credits(conn, state, hold, job_ids, usage) for state in RECONCILE_STATES}


_UNKNOWN_FREE = text(
    "SELECT u.task_id AS job_id, f.customer_id, f.specialist_id AS skill, 0 AS credits, 'unknown' AS state, "
    "NULL AS charged, f.admitted_at AS created_at, u.unknown_reason, NULL AS resolved_by "
    f"FROM {claims.unknown_tasks_relation()} u JOIN {admitted.free_tasks_relation()} f ON f.task_id = u.task_id "
    "WHERE (CAST(:customer AS text) IS NULL OR f.customer_id = :customer) ORDER BY u.unknown_at LIMIT :n"
)


def unknown_free_tasks(engine: Engine, *, customer_id: str | None, limit: int) -> list[dict[str, Any]]:
    """Unknown jobs of free specialists' tasks: no reservation to list, but an operator must still see them."""
    with engine.connect() as conn:
        return [dict(row) for row in conn.execute(_UNKNOWN_FREE, {"customer": customer_id, "n": limit}).mappings()]
