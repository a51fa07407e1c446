"""The charge rule (``taskstate.charge``): what every outcome charges, against a model of its docstring's table."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskstate import charge
from taskstate.charge import Pricing, Usage, charged_credits

OUTCOMES = st.sampled_from(charge.OUTCOMES)
CREDITS = st.integers(min_value=0, max_value=10**12)
PRICING = st.one_of(
    st.just(charge.FIXED),
    st.builds(Pricing, mode=st.just("metered"), base_credits=st.integers(0, 10**6),
              credits_per_semantic_call=st.integers(0, 10**6), credits_per_cpu_second=st.integers(0, 10**3)),
)
USAGE = st.builds(Usage, semantic_calls_charged=st.integers(-3, 10**4),
                  runner_credits=st.one_of(st.none(), st.integers(-3, 10**12)), waived=st.booleans(),
                  cpu_seconds=st.floats(0.0, 10**4, allow_nan=False))


@pytest.mark.parametrize(
    ("outcome", "charged"),
    [("completed", 7), ("failed", 7), ("canceled", 7), ("rejected", 0), ("never_ran", 0), ("input_required", None)],
)
def test_a_fixed_price_charges_executions_not_rejections_and_waits_while_a_task_asks_for_input(outcome, charged):
    assert charged_credits(outcome, reserved_credits=7) == charged


def test_a_metered_price_charges_base_plus_answered_calls_never_above_the_reservation():
    metered = Pricing("metered", base_credits=4, credits_per_semantic_call=1)
    charged = [charged_credits("completed", reserved_credits=20, pricing=metered, usage=Usage(n)) for n in (0, 3, 16, 40)]
    assert charged == [4, 7, 20, 20]


def test_cpu_is_priced_only_when_the_pricing_says_per_cpu_second_begun_beside_the_runners_figure():
    calls_only = Pricing("metered", base_credits=4, credits_per_semantic_call=1)
    with_cpu = Pricing("metered", base_credits=4, credits_per_semantic_call=1, credits_per_cpu_second=2)
    spun = Usage(3, runner_credits=7, cpu_seconds=2.1)  # 3 seconds begun
    assert charged_credits("completed", reserved_credits=100, pricing=calls_only, usage=spun) == 7  # off by default
    assert charged_credits("completed", reserved_credits=100, pricing=with_cpu, usage=spun) == 4 + 3 + 2 * 3
    assert charged_credits("failed", reserved_credits=100, pricing=with_cpu, usage=Usage(3, cpu_seconds=0.0)) == 7
    assert charged_credits("completed", reserved_credits=10, pricing=with_cpu, usage=spun) == 10  # the reservation
    assert charged_credits("completed", reserved_credits=100, usage=Usage(3, cpu_seconds=2.1)) == 100  # fixed: the tariff
    assert charged_credits("completed", reserved_credits=100, pricing=with_cpu,
                           usage=Usage(3, runner_credits=0, cpu_seconds=50)) == 0


def test_a_runner_that_states_zero_is_charged_nothing_whatever_the_pricing():
    for pricing in (charge.FIXED, Pricing("metered", 4, 1)):
        assert charged_credits("failed", reserved_credits=20, pricing=pricing, usage=Usage(5, runner_credits=0)) == 0


def test_a_run_the_service_failed_is_charged_nothing_but_a_task_asking_for_input_still_waits():
    for outcome in ("completed", "failed", "canceled"):
        assert charged_credits(outcome, reserved_credits=20, pricing=Pricing("metered", 4, 1),
                               usage=Usage(5, waived=True)) == 0
    assert charged_credits("input_required", reserved_credits=20, usage=Usage(waived=True)) is None


def test_an_outcome_outside_the_table_or_a_negative_reservation_is_refused():
    with pytest.raises(ValueError, match="outcome 'unknown' is not one of") as refused:
        charged_credits("unknown", reserved_credits=7)  # type: ignore[arg-type]
    assert refused.value.to_dict()["code"] == "charge_input_invalid"
    with pytest.raises(ValueError, match="cannot be negative"):
        charged_credits("completed", reserved_credits=-1)


def model(outcome: str, reserved: int, pricing: Pricing, usage: Usage) -> int | None:
    """The docstring's table, written out again as plainly as possible."""
    if outcome == "input_required":
        return None
    if outcome in ("rejected", "never_ran") or usage.waived:
        return 0
    if pricing.mode == "fixed":
        amount = reserved
    else:
        amount = pricing.base_credits + pricing.credits_per_semantic_call * max(0, usage.semantic_calls_charged)
    cpu = 0 if pricing.mode == "fixed" else pricing.credits_per_cpu_second * math.ceil(usage.cpu_seconds)
    if usage.runner_credits is not None:
        amount = min(amount, max(0, usage.runner_credits))
        if usage.runner_credits <= 0:
            return 0
    return min(amount + cpu, reserved)


@given(OUTCOMES, CREDITS, PRICING, USAGE)
def test_every_charge_follows_the_table_and_stays_within_the_reservation(outcome, reserved, pricing, usage):
    charged = charged_credits(outcome, reserved_credits=reserved, pricing=pricing, usage=usage)
    assert charged == model(outcome, reserved, pricing, usage)
    assert (charged is None) == (outcome == "input_required")
    if charged is not None:
        assert 0 <= charged <= reserved


@given(CREDITS, PRICING, st.integers(0, 10**4), st.integers(0, 10**4))
def test_answering_more_semantic_calls_never_charges_less(reserved, pricing, fewer, more):
    fewer, more = sorted((fewer, more))
    charged = [charged_credits("completed", reserved_credits=reserved, pricing=pricing, usage=Usage(n))
               for n in (fewer, more)]
    assert charged[0] <= charged[1]


@given(OUTCOMES, CREDITS, PRICING, USAGE, st.integers(0, 10**12))
def test_a_runners_figure_only_ever_lowers_the_charge(outcome, reserved, pricing, usage, figure):
    without = charged_credits(outcome, reserved_credits=reserved, pricing=pricing,
                              usage=Usage(usage.semantic_calls_charged))
    capped = charged_credits(outcome, reserved_credits=reserved, pricing=pricing,
                             usage=Usage(usage.semantic_calls_charged, runner_credits=figure))
    if without is None:
        assert capped is None
    else:
        assert capped == min(without, figure)
