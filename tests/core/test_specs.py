"""Hosted specs: the schema of issue 7 and its clamps. A spec asking for more than a hosted specialist may
have is refused at load time, naming the file, the field and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from core.settings import PROJECT_ROOT
from core.specs import SpecInvalid, load_spec, load_specs, require_runnable
from taskstate import charge
from tests.workers.hosted_rlm import support
from workers.hosted_rlm.journal import pricing_of


def refused(tmp_path: Path, **overrides) -> str:
    with pytest.raises(SpecInvalid) as caught:
        support.write_spec(tmp_path, **overrides)
    assert caught.value.code == "spec_invalid"
    message = str(caught.value)
    assert str(tmp_path / "reviewer.yaml") in message
    return message


def test_the_shipped_reviewer_and_analyst_load_and_are_runnable():
    specs = load_specs(PROJECT_ROOT / "specs")
    reviewer, analyst = specs["reviewer"].spec, specs["analyst"].spec
    assert (reviewer.executor, reviewer.answer_kind, reviewer.pricing.mode) == ("rlm", "findings", "metered")
    assert (analyst.executor, analyst.answer_kind, analyst.pricing.mode) == ("rlm", "cited_answer", "fixed")
    for loaded in (specs["reviewer"], specs["analyst"]):
        require_runnable(loaded)
        limits = loaded.spec.limits
        assert limits.max_semantic_calls <= 16 and limits.max_subcall_concurrency <= 2
        assert limits.max_prompt_chars <= 32_000 and limits.max_response_chars <= 4_000
        assert loaded.spec.sandbox.max_child_depth == 0 and not loaded.spec.sandbox.a2a


@pytest.mark.parametrize(
    ("sandbox", "field", "reason"),
    [
        ({"shell": True}, "sandbox.shell", "hosted specialists have no shell"),
        ({"writes": True}, "sandbox.writes", "hosted specialists are read-only"),
        ({"max_child_depth": 1}, "sandbox.max_child_depth", "hosted specialists run at depth 0"),
        ({"a2a": True}, "sandbox.a2a", "make no outbound A2A calls"),
        ({"kernel": "host"}, "sandbox.kernel", "Monty sandbox only"),
    ],
)
def test_a_spec_asking_for_shell_writes_children_or_a2a_is_refused(tmp_path, sandbox, field, reason):
    message = refused(tmp_path, sandbox=sandbox)
    assert field in message and reason in message


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        ({"max_semantic_calls": 17}, "limits.max_semantic_calls"),
        ({"max_subcall_concurrency": 3}, "limits.max_subcall_concurrency"),
        ({"max_prompt_chars": 32_001}, "limits.max_prompt_chars"),
        ({"max_response_chars": 4_001}, "limits.max_response_chars"),
        ({"monty": {"step_timeout_s": 0}}, "limits.monty.step_timeout_s"),
    ],
)
def test_a_limit_above_the_hosted_ceiling_is_refused_naming_the_field(tmp_path, limits, field):
    message = refused(tmp_path, limits=limits)
    assert field in message and ("less than or equal" in message or "greater than" in message)


def test_metered_pricing_above_the_reserved_tariff_is_refused(tmp_path):
    message = refused(tmp_path, pricing={"mode": "metered", "base_credits": 5, "credits_per_semantic_call": 1})
    assert "= 21 is above tariff_credits (20)" in message
    assert "credits_per_cpu_second" not in message  # a spec that does not price CPU is not told of its term


def test_a_cpu_price_needs_a_cpu_cap_and_counts_in_the_most_a_task_can_cost(tmp_path):
    metered = {"mode": "metered", "base_credits": 2, "credits_per_semantic_call": 1, "credits_per_cpu_second": 1}
    assert "credits_per_cpu_second needs limits.max_cpu_s" in refused(tmp_path, pricing=metered)
    # 2 + 1 x 16 calls + 1 x 3 CPU seconds = 21, above the tariff of 20.
    message = refused(tmp_path, pricing=metered, limits={"max_cpu_s": 2.5})
    assert "= 21 is above tariff_credits (20)" in message
    assert "+ credits_per_cpu_second (1) x limits.max_cpu_s (2.5) = 21" in message
    fixed = {"mode": "fixed", "base_credits": None, "credits_per_semantic_call": None, "credits_per_cpu_second": 1}
    assert "remove credits_per_cpu_second" in refused(tmp_path, pricing=fixed)


def test_pricing_fields_must_fit_the_mode(tmp_path):
    assert "metered pricing needs base_credits" in refused(
        tmp_path, pricing={"mode": "metered", "base_credits": 1, "credits_per_semantic_call": None}
    )
    assert "fixed pricing settles the tariff: remove base_credits and credits_per_semantic_call" in refused(
        tmp_path, pricing={"mode": "fixed", "base_credits": 1, "credits_per_semantic_call": 1}
    )
    # Only what the spec states is named.
    one = refused(tmp_path, pricing={"mode": "fixed", "base_credits": 1, "credits_per_semantic_call": None})
    assert "remove base_credits" in one and "credits_per_semantic_call" not in one


def test_metered_pricing_settles_base_plus_answered_calls_and_never_above_the_tariff(tmp_path):
    pricing = pricing_of(support.write_spec(tmp_path).spec.pricing)
    charged = [charge.charged_credits("completed", reserved_credits=20, pricing=pricing, usage=charge.Usage(n))
               for n in (0, 3, 16, 40)]
    assert charged == [4, 7, 20, 20]


def test_the_deadline_must_leave_time_to_investigate(tmp_path):
    assert "answer_reserve_s (60) must be below deadline_s (30)" in refused(
        tmp_path, limits={"deadline_s": 30, "answer_reserve_s": 60}
    )


def test_a_spec_without_a_model_runs_no_route_or_prompt(tmp_path):
    document = yaml.safe_load((PROJECT_ROOT / "specs" / "conformance.yaml").read_text())
    document["model_route"] = "reviewer"
    (tmp_path / "conformance.yaml").write_text(yaml.safe_dump(document))
    with pytest.raises(SpecInvalid, match="runs no model: remove model_route and prompt"):
        load_spec(tmp_path / "conformance.yaml")


def test_an_rlm_spec_without_a_route_loads_but_a_worker_refuses_it(tmp_path):
    loaded = support.write_spec(tmp_path, model_route=None)
    with pytest.raises(SpecInvalid) as caught:
        require_runnable(loaded)
    assert str(loaded.path) in str(caught.value) and "model_route" in str(caught.value)
