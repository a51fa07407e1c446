"""What a drill or a load run leaves behind, checked against what the service promises.

For a set of customers: every admitted task is terminal or its reservation is
listed unknown; every terminal task's reservation is resolved exactly once
(one journal entry of kind settle, void or reconcile, and one
``ledger_settlements`` row, which holds at most one per reservation); a task that ended without being claimed was
charged nothing; and the ledger's own verification is clean for each customer.

A task's claims are kept only for ``SPECIALISTS_JOB_CLAIMS_RETENTION_DAYS`` after
they finished, and only as long as its jobs' outbox rows (docs/OPERATIONS.md,
"Retention"): the check that an unclaimed task was charged nothing is made only
for tasks whose outbox rows are still there. The ledger's part is kept forever.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, bindparam, text

from ledger.client import Ledger
from taskstate.ids import job_id_sql

TERMINAL = frozenset({"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED"})

_TASKS = text(
    f"""
    SELECT e.task_id, e.customer_id, e.tariff_credits, e.reservation_id,
           EXISTS (SELECT 1 FROM dispatch_outbox o JOIN job_claims c ON c.job_id = {job_id_sql("o")}
                    WHERE o.task_id = e.task_id AND c.first_claimed_at IS NOT NULL) AS claimed,
           EXISTS (SELECT 1 FROM dispatch_outbox o WHERE o.task_id = e.task_id) AS jobs_kept,
           t.status ->> 'state' AS state, r.state::text AS reservation_state, r.charged,
           (SELECT count(DISTINCT j.entry_id) FROM ledger_journal j
             WHERE j.job_id = e.reservation_id AND j.kind IN ('settle', 'void', 'reconcile')) AS resolutions
      FROM edge_tasks e
      JOIN tasks t ON t.id = e.task_id
      LEFT JOIN ledger_reservations r ON r.job_id = e.reservation_id
     WHERE e.customer_id IN :customers
    """
).bindparams(bindparam("customers", expanding=True))


@dataclass
class Audit:
    tasks: int = 0
    states: Counter = field(default_factory=Counter)
    unknown: list[str] = field(default_factory=list)  # held, listed by `reservations list --unknown`
    charged: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems

    def summary(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "states": {k.removeprefix("TASK_STATE_").lower(): v for k, v in sorted(self.states.items())},
            "unknown": len(self.unknown),
            "charged": self.charged,
            "problems": self.problems,
        }


def audit(engine: Engine, customers: list[str], *, max_problems: int = 20) -> Audit:
    """Check every task of ``customers`` and their ledger (see the module doc). Read-only."""
    found = Audit()
    if not customers:
        return found

    def problem(message: str) -> None:
        if len(found.problems) < max_problems:
            found.problems.append(message)

    with engine.connect() as conn:
        rows = conn.execute(_TASKS, {"customers": customers}).all()
        settlements = conn.execute(
            text("SELECT count(*) FROM ledger_settlements WHERE customer_id IN :customers")
            .bindparams(bindparam("customers", expanding=True)),
            {"customers": customers},
        ).scalar_one()
    found.tasks = len(rows)
    for row in rows:
        found.states[row.state] += 1
        if row.reservation_id is None:
            continue  # tariff 0: nothing held
        if row.reservation_state == "unknown":
            # Held for an operator. The task may still be terminal: a customer's cancel of a running task whose
            # worker then died ends the task, but what the run used (and so the charge) is unknown.
            found.unknown.append(row.task_id)
            continue
        if row.state not in TERMINAL:
            problem(f"task {row.task_id} is {row.state}: neither terminal nor listed unknown "
                    f"(reservation {row.reservation_state})")
            continue
        if row.resolutions != 1 or row.reservation_state not in ("settled", "voided", "reconciled"):
            problem(f"task {row.task_id} ({row.state}) has {row.resolutions} resolutions, reservation "
                    f"{row.reservation_state}")
            continue
        found.charged += row.charged or 0
        if row.jobs_kept and not row.claimed and row.charged:  # pruned jobs' claims cannot be told
            problem(f"task {row.task_id} ended without a claim but was charged {row.charged}")
        if row.charged is not None and row.charged > row.tariff_credits:
            problem(f"task {row.task_id} was charged {row.charged}, above its tariff {row.tariff_credits}")
    resolutions = sum(row.resolutions for row in rows)
    if settlements != resolutions:
        problem(f"the journal holds {resolutions} resolutions for these customers' tasks, the settlements "
                f"{settlements}")
    ledger = Ledger(engine)
    for customer in customers:
        for violation in ledger.verify(customer):
            problem(f"ledger verify, customer {customer}: {violation}")
    return found
