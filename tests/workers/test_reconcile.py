"""The charge rule's figure beside an operator's reconcile reads the job's usage through the source the assembly
wires in, as the finish's settlement does (workers.reconcile, workers.assembly.USAGE)."""

from __future__ import annotations

from sqlalchemy import text

from ledger.client import Ledger
from tests.workers.test_settlement import admitted_task
from workers.assembly import USAGE
from workers.reconcile import rule_charges

RESERVED = 9
BASE_CREDITS = 2


def test_the_rule_beside_a_reconcile_charges_a_metered_rlm_run_from_its_journal(engine) -> None:
    """A metered run that made no semantic call costs its base, not the reservation: the console's figure for an
    unknown rlm job must say so, read from the run's journal through the assembly's usage source."""
    ref = admitted_task(engine, Ledger(engine), credits=RESERVED)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO specialist_runs (job_id, specialist_id, route, pricing, tariff_credits, "
                          "base_credits, credits_per_semantic_call, session_id) "
                          "VALUES (:j, 'drill', 'root', 'metered', :r, :b, 5, 's')"),
                     {"j": ref.job_id, "r": RESERVED, "b": BASE_CREDITS})
    with engine.connect() as conn:
        metered = rule_charges(conn, ref.task_id, [ref.job_id], USAGE)
        fixed = rule_charges(conn, ref.task_id, [ref.job_id], None)  # no source: every job at its fixed price
    assert metered == {"completed": BASE_CREDITS, "failed": BASE_CREDITS, "canceled": BASE_CREDITS}
    assert fixed == {"completed": RESERVED, "failed": RESERVED, "canceled": RESERVED}
