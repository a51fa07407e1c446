"""The rlm executor's usage, as the finish's settlement reads it (``workers.settlement.UsageSource``).

The run's record in the journal (``journal.RUN_RECORD``: the pricing the run was opened under, its semantic calls
used and charged, its resumes) is joined into the finish's one statement; this module turns it into what the
charge rule takes, with the runner's own figure (``charged_credits``) beside it, and into the ``specialist``
metadata of the task's final state (``a2a.final_metadata``). ``workers.assembly`` wires ``RLM_USAGE`` into the
worker's settlement and hands it to the operator's reconcile (``usage_of_job``: the record read alone, for the
charge rule's figure), so neither the generic finish nor the reconcile knows an executor.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection

from core.fragments import Fragment
from taskstate import charge
from workers.hosted_rlm import a2a, journal
from workers.runs import RunOutcome
from workers.settlement import ExecutorUsage, finish_statement


def runner_credits(detail: Mapping[str, Any]) -> int | None:
    """The figure the rlm runner recorded (``charged_credits``: the charge rule's for its run), if it stated one."""
    credits = detail.get("charged_credits")
    return credits if isinstance(credits, int) and not isinstance(credits, bool) else None


class RlmUsage:
    """The rlm executor's ``UsageSource``: its run record, from the journal."""

    name = "rlm"
    record: Fragment = journal.RUN_RECORD

    def usage_of(self, record: Mapping[str, Any] | None, outcome: RunOutcome) -> ExecutorUsage | None:
        return _usage(journal.run_record_of(None if record is None else SimpleNamespace(**record)), outcome)

    def usage_of_job(self, conn: Connection, job_id: str, outcome: RunOutcome) -> ExecutorUsage | None:
        return _usage(journal.run_record(conn, job_id), outcome)

    def final_metadata(self, usage: ExecutorUsage, outcome: RunOutcome, credits_charged: int) -> dict[str, Any]:
        run: journal.RunRecord = usage.record
        merged = {**outcome.detail, "semantic_calls_used": run.semantic_calls_used,
                  "semantic_calls_charged": run.semantic_calls_charged, "resumes": run.resumes,
                  "cpu_seconds": outcome.cpu_seconds}
        return a2a.final_metadata(merged, credits_charged)


def _usage(run: journal.RunRecord | None, outcome: RunOutcome) -> ExecutorUsage | None:
    if run is None:
        return None
    usage = charge.Usage(run.semantic_calls_charged, runner_credits=runner_credits(outcome.detail),
                         cpu_seconds=outcome.cpu_seconds or 0.0)
    return ExecutorUsage(run.pricing, usage, run)


RLM_USAGE = RlmUsage()
FINISH_RLM_JOB = finish_statement(RLM_USAGE)  # composed, and checked, when the module loads
