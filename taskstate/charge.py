"""What a job is charged: one pure function, decided from the reservation, never from a spec file.

``charged_credits`` is the only place the rule is written. The worker's finish,
the customer's cancel, the dispatcher's give-up and the operator's reconcile
all call it (``workers.settlement``, ``taskstate.cancel``,
``workers.dispatch.sweeper``, ``workers.reconcile``); the hosted runner calls it
for the figure it records in its journal. Its inputs:

- the **outcome** of the job (below);
- the **reserved** credits: what admission reserved for the task
  (``taskstate.admitted``), the ceiling of every charge;
- the **pricing** the run was started under (recorded in its journal when an
  rlm specialist opened it; ``FIXED`` for every other executor);
- the **metered usage**: answered semantic calls (a call superseded after a
  resume counts once), the job's CPU seconds (``workers.cpu_share``, measured
  after the runner stated its figure), and the runner's own figure when it
  stated one.

=====================  ====================================================
outcome                charged
=====================  ====================================================
``input_required``     nothing is settled yet (``None``): the task goes on
                       with the next message, under the same reservation
``rejected``           0: the specialist declined the work
``never_ran``          0: canceled before any claim, or given up undelivered
``completed``,         the pricing, capped by the reservation and by the
``failed``,            runner's own figure: ``fixed`` charges the reserved
``canceled``           credits, ``metered`` ``base + per call x answered
                       calls + per CPU second x CPU seconds begun`` (the
                       CPU term 0 unless the spec prices it,
                       ``core.specs.metered_credits``); the runner's
                       figure caps all but the CPU term, and a runner
                       figure of 0 charges 0
any, ``waived``        0: the service's own failure (a task it could not
                       read, a resume it could not make), not the customer's
                       (``input_required`` still settles nothing yet)
=====================  ====================================================

The names of the credits, stage by stage (docs/ARCHITECTURE.md, "Glossary"): the
spec's *tariff* (``tariff_credits``, only in specs), from admission on the task's
*reserved credits* (``reserved_credits``), and what this rule returns, the
*charged credits* (``charged_credits``), which the settlement posts.

An outcome that is *unknown* is not an input: nothing is charged until an
operator reconciles it, and then the operator states the charge
(``workers.reconcile`` shows what this rule would have charged beside it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from core.errors import ServiceError
from core.specs import metered_credits

Outcome = Literal["completed", "failed", "canceled", "rejected", "input_required", "never_ran"]
OUTCOMES: tuple[Outcome, ...] = ("completed", "failed", "canceled", "rejected", "input_required", "never_ran")
PricingMode = Literal["fixed", "metered"]


@dataclass(frozen=True)
class Pricing:
    mode: PricingMode = "fixed"
    base_credits: int = 0
    credits_per_semantic_call: int = 0
    credits_per_cpu_second: int = 0  # metered only; 0: CPU is not priced (the default)


FIXED = Pricing()


class ChargeInputInvalid(ServiceError, ValueError):
    """A caller asked the rule about an outcome it does not know, or a negative reservation: a bug, not a charge."""

    code = "charge_input_invalid"


@dataclass(frozen=True)
class Usage:
    semantic_calls_charged: int = 0
    runner_credits: int | None = None  # the runner's own figure, when it stated one: a cap, never a floor
    waived: bool = False  # the service's own failure (the runner says so): nothing is charged
    cpu_seconds: float = 0.0  # the job's processes together (workers.cpu_share); priced only if the pricing says


NO_USAGE = Usage()


def charged_credits(
    outcome: Outcome, *, reserved_credits: int, pricing: Pricing = FIXED, usage: Usage = NO_USAGE
) -> int | None:
    """The credits a job with this outcome is charged, between 0 and ``reserved_credits``; None: not yet."""
    if outcome not in OUTCOMES:
        raise ChargeInputInvalid(f"outcome {outcome!r} is not one of {OUTCOMES}")
    if reserved_credits < 0:
        raise ChargeInputInvalid(f"reserved credits cannot be negative, got {reserved_credits}")
    if outcome == "input_required":
        return None
    if outcome in ("rejected", "never_ran") or usage.waived:
        return 0
    cpu_priced = 0
    if pricing.mode == "fixed":
        priced = reserved_credits
    else:
        priced = metered_credits(pricing.base_credits, pricing.credits_per_semantic_call, usage.semantic_calls_charged,
                                 pricing.credits_per_cpu_second, usage.cpu_seconds)
        cpu_priced = metered_credits(0, 0, 0, pricing.credits_per_cpu_second, usage.cpu_seconds)
    if usage.runner_credits is not None:
        # The runner states its figure before its CPU is counted: it caps the rest of the price, never the CPU term,
        # and a figure of 0 (nothing to charge) charges nothing.
        priced = 0 if usage.runner_credits <= 0 else min(priced - cpu_priced, usage.runner_credits) + cpu_priced
    charged = min(reserved_credits, priced)
    assert 0 <= charged <= reserved_credits, (charged, reserved_credits)  # a settle never exceeds the reservation
    return charged
