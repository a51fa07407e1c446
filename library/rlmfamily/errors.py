"""Errors of the RLM library: one class per failure a caller can act on.

Every error carries a stable, machine-readable ``code`` (callers and the CLI
switch on it, never on the message) and a message a person can act on; when a
limit caused the error, the message names the setting that raises it.
"""

from __future__ import annotations

from typing import Any, ClassVar

# An error that names what matched (runs of a prefix, open delegations) lists at most this many.
MAX_LISTED_NAMES = 5


class RLMError(Exception):
    """Base class. ``code`` is stable; ``message`` is for people; ``setting`` names the knob."""

    code: ClassVar[str] = "rlm_error"

    def __init__(self, message: str, *, setting: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.setting = setting
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.setting:
            data["setting"] = self.setting
        if self.details:
            data["details"] = self.details
        return data


class SettingsInvalid(RLMError):
    code = "settings_invalid"


class ContextError(RLMError):
    code = "context_error"


class ContextSourceMissing(ContextError):
    code = "context_source_missing"


class FileNotInContext(ContextError):
    code = "file_not_in_context"


class ReadTooLarge(ContextError):
    code = "read_too_large"


class BundleInvalid(ContextError):
    code = "bundle_invalid"


class PatternUnsupported(ContextError):
    """A search pattern the linear-time engine (RE2) refuses, or one over the pattern caps."""

    code = "pattern_unsupported"


class SearchTimeout(ContextError):
    """One search ran past ``search_timeout_s``; it stopped between two matches or files."""

    code = "search_timeout"


class ProviderError(RLMError):
    """The model endpoint failed. ``billed`` is None when nobody can know if it charged."""

    code = "provider_error"

    def __init__(self, message: str, *, billed: bool | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.billed = billed


class ProviderTimeout(ProviderError):
    code = "provider_timeout"


class MissingAPIKey(ProviderError):
    code = "missing_api_key"


class ScriptInvalid(RLMError):
    code = "script_invalid"


class ScriptExhausted(ProviderError):
    code = "script_exhausted"


class BudgetError(RLMError):
    code = "budget_error"


class BudgetExhausted(BudgetError):
    code = "budget_exhausted"


class BudgetUnknownUsage(BudgetError):
    code = "budget_unknown_usage"


class BudgetLimitsMismatch(BudgetError):
    code = "budget_limits_mismatch"


class ReconcileRefused(BudgetError):
    code = "reconcile_refused"


class UsageEntryNotFound(BudgetError):
    code = "usage_entry_not_found"


class KernelError(RLMError):
    code = "kernel_error"


class KernelUnavailable(KernelError):
    code = "kernel_unavailable"


class HistoryEntryNotFound(RLMError):
    code = "history_entry_not_found"


class HistoryQueryTooLong(RLMError):
    code = "history_query_too_long"


class RunNotFound(RLMError):
    code = "run_not_found"


class StoreUnavailable(RLMError):
    """A library file (budget, history, family, delegations) cannot be opened, read or written."""

    code = "store_unavailable"


class TrajectoryInvalid(RLMError):
    code = "trajectory_invalid"


class ResumeError(RLMError):
    """``rlm resume`` refused a run (rlmfamily/resume.py); the code says why, the message what to do."""

    code = "resume_error"


class RunRunning(ResumeError):
    """The run's trajectory is locked by the process that owns the run: it is still going."""

    code = "run_running"


class RunFinished(ResumeError):
    code = "run_finished"


class RunNotFinished(ResumeError):
    """A follow-up question was asked of a run whose last question has not finished (running, or interrupted)."""

    code = "run_not_finished"


class ResumeUnsupported(ResumeError):
    """The run's state cannot be rebuilt faithfully (its kernel state, or how it was recorded)."""

    code = "resume_unsupported"


class ResumeInconsistent(ResumeError):
    """The run's records disagree (trajectory, host-call journal, checkpoints, corpus)."""

    code = "resume_inconsistent"


class ResumeEndpointChanged(ResumeError):
    """``rlm resume`` was pointed at another model endpoint than the run's; only ``--switch-endpoint`` allows it."""

    code = "resume_endpoint_changed"


class ResumeNeedsReconcile(ResumeError):
    """The run's family has usage of unknown cost that blocks its token or USD limit: reconcile it first."""

    code = "resume_needs_reconcile"
