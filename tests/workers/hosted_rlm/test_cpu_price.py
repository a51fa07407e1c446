"""A spec may price a run's CPU (issue 41 §2): the metered formula's CPU term, recorded when the run opens, charged
from the CPU seconds the job's process measured (``workers.cpu_share``), beside the runner's figure for its calls."""

from __future__ import annotations

import dataclasses

from taskstate import charge
from tests.workers.hosted_rlm import support
from tests.workers.hosted_rlm.test_runner import FILES, RULE
from workers.hosted_rlm.usage import RLM_USAGE

CPU_PRICED = {"mode": "metered", "base_credits": 4, "credits_per_semantic_call": 1, "credits_per_cpu_second": 2}


def _settled_charge(engine, tmp_path, cpu_seconds: float, **spec_overrides) -> int | None:
    """A real review run (two answered semantic calls), its outcome carrying ``cpu_seconds``, charged as the
    worker's settlement charges it: the usage source's record of the run, then the charge rule."""
    spec = support.write_spec(tmp_path / "specs", **spec_overrides)
    job_id = support.new_job_id()
    token = support.claim(engine, job_id)
    run = support.runner(engine, spec, support.routes_for("review_sql.toml"), support.message(RULE, files=FILES))
    outcome = run.run(support.context(job_id, "reviewer", token, reserved_credits=30))
    assert outcome.state == "completed" and outcome.detail["semantic_calls_used"] == 2
    measured = dataclasses.replace(outcome, cpu_seconds=cpu_seconds)  # as the job's process states it
    with engine.connect() as conn:
        usage = RLM_USAGE.usage_of_job(conn, job_id, measured)
    assert usage is not None
    return charge.charged_credits("completed", reserved_credits=30, pricing=usage.pricing, usage=usage.usage)


def test_a_spec_that_prices_cpu_charges_each_cpu_second_begun_beside_its_calls(engine, tmp_path):
    charged = _settled_charge(engine, tmp_path, 2.2, pricing=CPU_PRICED, tariff_credits=30, limits={"max_cpu_s": 3.0})
    assert charged == 4 + 1 * 2 + 2 * 3  # base, two answered calls, three CPU seconds begun


def test_cpu_is_not_priced_unless_the_spec_says_so(engine, tmp_path):
    assert _settled_charge(engine, tmp_path, 2.2) == 4 + 1 * 2  # the shipped reviewer: base and calls only
