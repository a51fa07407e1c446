"""Where an interrupted run's records leave it: what ``Session.resume`` continues from.

rlmfamily/resume.py reads the records (trajectory, host-call journal, checkpoints)
and builds a ``ResumePoint``; the session only consumes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlmfamily.journal import Restore
from rlmfamily.providers.base import Completion, ToolCall


@dataclass(frozen=True)
class FinalState:
    """The crash came while the model answered its final request."""

    stop_reason: str
    why: str
    completion: Completion  # the final reply, as recorded


@dataclass(frozen=True)
class ResumePoint:
    """Where an interrupted run's records leave it; ``Session.resume`` goes on from here."""

    run_id: str
    question: str
    kernel: str
    messages: list[dict[str, Any]]  # the conversation, up to the last recorded tool result
    turns: int  # root turns played (their replies are recorded)
    calls: tuple[ToolCall, ...]  # the last turn's calls ...
    first_call: int  # ... from this one on, they have no result yet
    subcalls: int
    subcall_seq: int
    elapsed_s: float  # time the run was alive before (its max_run_s goes on from there)
    restore: Restore
    budget_entries: list[int]  # the earlier processes' usage entries: the run's own usage
    answer: tuple[str, int] | None = None  # set by a step before the crash (answer, turn)
    final: FinalState | None = None
    record: dict[str, Any] = field(default_factory=dict)  # what the run_resumed event says
