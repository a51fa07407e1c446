"""Errors of the evaluation runner: one class per failure an operator can act on (``code`` is stable)."""

from __future__ import annotations

from rlmfamily.errors import RLMError


class EvalError(RLMError):
    code = "eval_error"


class PackInvalid(EvalError):
    """A task or the pack file does not match the schema; the message names the file and the field."""

    code = "eval_pack_invalid"


class ConditionInvalid(EvalError):
    code = "eval_condition_invalid"


class SpendCapRequired(EvalError):
    """A paid (non-scripted) condition was asked for without ``--max-usd``."""

    code = "eval_spend_cap_required"


class ResultsMismatch(EvalError):
    """A results folder holds another experiment (another pack, other conditions or repeats)."""

    code = "eval_results_mismatch"


class ResultsNotFound(EvalError):
    code = "eval_results_not_found"
