"""Where an interrupted run's records leave it: what ``Session.resume`` continues from.

rlmfamily/resume.py reads the records (trajectory, host-call journal, checkpoints)
and builds a ``ResumePoint``; the session only consumes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlmfamily.family import procs
from rlmfamily.journal import Restore
from rlmfamily.protocol import Protocol
from rlmfamily.providers.base import Completion, ToolCall


@dataclass(frozen=True)
class FinalState:
    """The crash came while the model answered its final request (its reply is the point's ``completion``)."""

    stop_reason: str
    why: str


@dataclass(frozen=True)
class ResumePoint:
    """Where an interrupted run's records leave it; ``Session.resume`` goes on from here."""

    run_id: str
    question: str
    kernel: str
    protocol: Protocol  # as the run last used it (a fallback to text is kept)
    messages: list[dict[str, Any]]  # the conversation, up to the last turn's reply
    turns: int  # root turns played (their replies are recorded)
    completion: Completion | None  # the last turn's reply, whose results the model has not been given yet ...
    calls: tuple[ToolCall, ...]  # ... its calls ...
    observations: tuple[str, ...]  # ... and the results of the first of them (the rest run on resume)
    subcalls: int
    subcall_seq: int
    elapsed_s: float  # time the run was alive before (its max_run_s goes on from there)
    restore: Restore
    budget_entries: list[int]  # the earlier processes' usage entries: the run's own usage
    answer: tuple[str, int] | None = None  # set by a step before the crash (answer, turn)
    final: FinalState | None = None
    record: dict[str, Any] = field(default_factory=dict)  # what the run_resumed event says
    gate_runs: tuple[dict[str, Any], ...] = ()  # completion-gate runs recorded (``gate`` events): numbered on after
    turns_before: int = 0  # turns of the run's earlier questions (a follow-up's max_turns counts from here)


def unfinished_text(events: list[dict[str, Any]], run_id: str) -> str:
    """Why a trajectory has no ``run_finished`` (``rlm show``, the page): still running, or its process ended
    without finishing it; then the command that continues it (a child's is its root's resume)."""
    # The process that owns the run: the one that started it, or the last that resumed it.
    owner = next((e for e in reversed(events) if e.get("event") in ("run_started", "run_resumed", "follow_up")), {})
    turns = max((e.get("turn", 0) for e in events if e.get("event") == "turn"), default=0)
    pid = owner.get("pid")
    root_id = run_id.split(".")[0]  # a child's id is its root's with .cN (and .fN) after it
    resume = (f"; continue it with `rlm resume {run_id}`" if root_id == run_id
              else f"; a child is continued with its root: `rlm resume {root_id}`")
    if pid and procs.alive(pid, owner.get("pid_start")):
        why = f"still running (pid {pid})"
    elif pid:
        why = f"its process (pid {pid}) ended without finishing the run: killed or crashed{resume}"
    else:
        why = f"still running, or its process was killed or crashed{resume}"
    return f"did not finish after {turns} turns: {why}"


def endpoint_switch(event: dict[str, Any]) -> str:
    """What ``--switch-endpoint`` changed, from a ``run_resumed`` event (or the record it will write)."""
    switched = event.get("endpoint_changed") or {}
    before, after = switched.get("from") or {}, switched.get("to") or {}
    return (f"endpoint switched (--switch-endpoint) from {before.get('base_url', 'an unrecorded one')} "
            f"to {after.get('base_url', 'a scripted provider')}")


def describe_resume(event: dict[str, Any]) -> str:
    """How a resumed run got its namespace back and where it went on, from its ``run_resumed`` event."""
    steps = event.get("steps", 0)
    where = {"checkpoint": f"namespace from the Monty checkpoint after step {steps}",
             "replay": f"namespace rebuilt by replaying {steps} steps from the record",
             "fresh": "no step had run",
             "kept": "the namespace of its live kernel, kept since the last question",
             }.get(event.get("restore"), str(event.get("restore")))
    if event.get("steps_run_again"):  # the last step's record was not stored before the crash
        where = (f"namespace from the Monty checkpoint after step {steps - 1}, and step {steps} run again from the "
                 "record (its record was not stored before the crash; it printed what it had printed)")
    if event.get("checkpoint_dropped"):
        where += (f"; the checkpoint of step {event['checkpoint_dropped']}, stored before the crash but not its "
                  "trajectory line, was dropped")
    if event.get("interrupted_call"):
        where += (f"; call {event['interrupted_call']} of turn {event.get('turn')} runs again, "
                  "its recorded host calls answered from the record")
    if event.get("corpus_changed"):
        where += "; the workspace changed since the run started (its commands changed files)"
    if event.get("endpoint_changed"):
        where += "; " + endpoint_switch(event)
    children = event.get("children") or []
    if children:
        where += "; children: " + ", ".join(f"{c['run_id']} {c['outcome']}" for c in children)
    return where
