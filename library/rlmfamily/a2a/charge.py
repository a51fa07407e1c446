"""What a finished paid delegation costs the family: its hold settled to the charge its peer reports, or kept.

A paid delegation holds its peer's tariff from the root family's credit
allowance before it is sent (``credit_ceiling``, the figure it states to the
peer). When the peer's task finishes, its metadata may say what the peer
actually charged, at ``CHARGE_METADATA_KEY`` (``rlmfamily.a2a.wire`` reads
it). ``settle`` is the rule for what then stays drawn:

| what the finished task reports                                  | charge    | stays drawn | back to the allowance |
|-----------------------------------------------------------------|-----------|-------------|-----------------------|
| a whole number of credits, 0 <= n <= held (``5``, ``5.0``)      | settled   | n           | held - n              |
| nothing (no such key, or null)                                  | unknown   | held        | 0                     |
| anything else: text, a bool, a fraction, below 0, above held    | unknown   | held        | 0                     |

A charge that is unknown is never guessed: the hold stays drawn, and the
record says why. The store applies the outcome once, in the transaction that
records the finished state (``DelegationStore.update``).

The charge states a delegation goes through (``delegations.charge_state``):
``free`` (a free peer: nothing held), ``held`` (the tariff is drawn; the work
is open, or finished before this was known), ``settled``, ``unknown`` (kept
drawn), ``released`` (the peer refused the send: nothing was taken, the hold
went back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# Where a finished task's metadata (a direct reply's: the message's) states the credits it was charged, as this
# project's hosted service writes it: {"specialist": {"creditsCharged": 5}} (docs/RLM.md, "Paid peers").
CHARGE_METADATA_KEY = ("specialist", "creditsCharged")
CHARGE_KEY_NAME = "metadata." + ".".join(CHARGE_METADATA_KEY)
ChargeState = Literal["free", "held", "settled", "unknown", "released"]
CHARGE_STATES: tuple[ChargeState, ...] = ("free", "held", "settled", "unknown", "released")
MAX_QUOTED_CHARGE_CHARS = 40  # of a malformed reported charge quoted in the record


@dataclass(frozen=True)
class Settlement:
    """What finishing a held delegation leaves: its charge state, the credits still drawn, and why."""

    charge_state: Literal["settled", "unknown"]
    credits_held: int  # what stays drawn from the family's allowance
    credits_charged: int | None  # None: the charge is unknown
    credits_returned: int
    note: str


def settle(credits_held: int, reported: Any) -> Settlement:
    """The outcome for a hold of ``credits_held`` whose finished task reported ``reported`` (None: nothing)."""
    assert credits_held >= 0, credits_held
    problem = _problem(credits_held, reported)
    if problem is not None:
        return Settlement("unknown", credits_held, None, 0,
                          f"charge unknown: {problem}; the hold of {credits_held} credits is kept")
    charged = int(reported)
    outcome = Settlement("settled", charged, charged, credits_held - charged,
                         f"the peer reported {charged} credits charged ({CHARGE_KEY_NAME}); "
                         f"{credits_held - charged} of the {credits_held} held returned to the allowance")
    assert 0 <= outcome.credits_charged <= credits_held and outcome.credits_held + outcome.credits_returned == credits_held
    return outcome


def _problem(credits_held: int, reported: Any) -> str | None:
    if reported is None:
        return f"the peer's finished task reports no charge ({CHARGE_KEY_NAME})"
    quoted = repr(reported)
    if len(quoted) > MAX_QUOTED_CHARGE_CHARS:
        quoted = quoted[:MAX_QUOTED_CHARGE_CHARS] + "..."
    whole = isinstance(reported, int) or (isinstance(reported, float) and reported.is_integer())
    if isinstance(reported, bool) or not whole:
        return f"the peer reports {quoted}, not a whole number of credits"
    if reported < 0:
        return f"the peer reports {quoted} credits, below 0"
    if reported > credits_held:
        return f"the peer reports {quoted} credits, more than the {credits_held} held"
    return None


def credits_text(row: dict[str, Any], *, short: bool = False) -> str:
    """A delegation's credits as a person reads them (``rlm delegations``, ``rlm show``, after ``rlm run``).

    ``row`` holds ``charge``/``charge_state``, ``credits_held``, ``credits_charged`` and ``credit_ceiling``
    (a delegation's status, its store row, or its record in a run's trajectory). Empty for a free peer.
    """
    state = row.get("charge_state", row.get("charge"))
    held, charged, ceiling = row.get("credits_held"), row.get("credits_charged"), row.get("credit_ceiling")
    unit = "" if short else " credits"
    if state == "settled":
        return f"{charged}{unit} charged of {ceiling} held" + ("" if short else f" ({ceiling - charged} returned)")
    if state == "unknown":
        return f"{held}{unit} held, charge unknown"
    if state == "held":
        return f"{held}{unit} held"
    if state == "released":
        return "0" if short else "0 credits (the send was refused; the hold went back)"
    if state is None and held:  # a record from before the charge came back
        return f"{held}{unit} held"
    return "-" if short else ""
