"""A run's gate runs and the rule that judges the run from them (``verdict_of``), pure.

Each time the model answers in a gated run, every gate runs once: that is an
*attempt* (numbered from 1), and each gate's outcome a ``GateRun``. The run's
verdict is decided from its last attempt, what still blocks acceptance (required
remote work not resolved, children still active: the extensions' ``blockers``)
and whether an answer stands:

| gated | blocked | last attempt                     | answer | verdict        |
|-------|---------|----------------------------------|--------|----------------|
| any   | yes     | any                              | any    | `not_verified` |
| no    | no      | any                              | any    | `not_verified` |
| yes   | no      | none (no answer was checked)     | any    | `not_verified` |
| yes   | no      | the gates could not run          | any    | `not_verified` |
| yes   | no      | a gate failed                    | any    | `gates_failed` |
| yes   | no      | every gate passed                | yes    | `accepted`     |
| yes   | no      | every gate passed                | no     | `not_verified` |

A peer's result (A2A) never counts here: it is evidence, unverified. Only gates accept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rlmfamily.gates.spec import Verdict

MAX_LISTED_BLOCKERS = 5  # named in the verdict's reason; blocked_by keeps them all


@dataclass(frozen=True)
class GateRun:
    """One gate's run in one attempt, as the trajectory's ``gate`` event and ``RunResult.extra["gates"]`` keep it."""

    attempt: int
    turn: int
    name: str
    command: str
    deadline_s: float
    passed: bool  # exited with status 0 within its deadline
    state: str  # the job's: exited | killed | failed; "not_run" when it could not be started
    exit_code: int | None
    stopped_by: str | None  # "deadline" when its deadline stopped its process group
    duration_s: float | None
    job_id: str | None  # the handle to its whole output: gates.read(job_id, stream, start, size)
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    excerpt: str = ""  # head and tail of each stream, at most gate_excerpt_bytes in all
    history_id: int | None = None  # the history entry that keeps the excerpt (history.search finds it)
    error: str | None = None  # why it could not run

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Attempt:
    """Every gate, run once against the workspace as it was when the model answered."""

    number: int
    turn: int
    runs: tuple[GateRun, ...]
    error: str | None = None  # the gates could not run (the environment, not the work): why

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.runs) and all(r.passed for r in self.runs)

    @property
    def failed(self) -> tuple[GateRun, ...]:
        return tuple(r for r in self.runs if not r.passed)


def verdict_of(*, not_gated: str | None, blocked_by: Sequence[str], last: Attempt | None,
               answered: bool) -> tuple[Verdict, str]:
    """The run's verdict and why (the table above). ``not_gated``: why the run has no gates, or None."""
    if blocked_by:  # first: what the run left unresolved matters more than whether it had gates
        shown = "; ".join(blocked_by[:MAX_LISTED_BLOCKERS])
        more = f" (and {len(blocked_by) - MAX_LISTED_BLOCKERS} more)" if len(blocked_by) > MAX_LISTED_BLOCKERS else ""
        return "not_verified", f"acceptance is blocked: {shown}{more}"
    if not_gated is not None:
        return "not_verified", not_gated
    if last is None:
        return "not_verified", "the gates never ran: the run ended without an answer to check"
    if last.error is not None:
        return "not_verified", f"the gates could not run (attempt {last.number}): {last.error}"
    if last.failed:
        names = ", ".join(r.name for r in last.failed)
        return "gates_failed", f"attempt {last.number}: {names} failed"
    if not answered:
        return "not_verified", "the gates passed but no answer stands"
    return "accepted", f"every gate passed (attempt {last.number})"


def verdict_text(verdict: str, reason: str | None) -> str:
    """``verdict: gates failed: attempt 2: tests failed``, as rlm run, rlm show and the page print it."""
    return f"verdict: {verdict.replace('_', ' ')}" + (f": {reason}" if reason else "")


def how_it_ended(run: Mapping[str, Any]) -> str:
    """``exit 1 after 0.42 s`` or ``killed at its 30 s deadline after 30.01 s``: one gate run (a ``GateRun`` as a
    dict), as the model's feedback, the history, rlm show and the page say it."""
    deadline = run.get("deadline_s")
    how = (f"killed at its {deadline:g} s deadline" if run.get("state") == "killed" and isinstance(deadline, (int, float))
           else f"exit {run.get('exit_code')}")
    return how + (f" after {run['duration_s']:.2f} s" if isinstance(run.get("duration_s"), (int, float)) else "")


def outcome_text(run: Mapping[str, Any]) -> str:
    """One gate run (a ``GateRun`` as a dict) in a few words: passed or how it failed, its time and its job."""
    if run.get("error"):
        return f"could not run: {run['error']}"
    return f"{'passed' if run.get('passed') else 'FAILED'} ({how_it_ended(run)}; job {run.get('job_id')})"
