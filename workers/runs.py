"""Running a specialist on a worker: the Runner protocol, its context, and the scripted specialist.

A runner is synchronous and runs in a process of its own (``workers.isolation``;
in tests, possibly a thread of the worker). It should stop cooperatively:
``ctx.cancelled()`` turns true when the job is cancelled, its deadline passes or
the worker lost its claim, and ``ctx.wait(s)`` sleeps but wakes on any of those.
A runner that does not stop within ``worker_cancel_grace_s`` is killed (a thread:
abandoned) and its result is ignored. Progress goes through ``ctx.report`` to an ``EventSink``:
on a worker that is ``workers.tasks.TaskEvents``, which writes fenced task events
every API instance streams. The outcome a runner returns becomes the task's
final state in the finish transaction (``RunOutcome.final_event`` carries the
exact A2A event when the specialist produced one).

Runners: ``ScriptedRunner`` here (the scripted specialist: steps, delays and
failures a test scripts, in the signed payload of a raw job or in a data part
``{"script": {"steps": [...]}}`` of the A2A message), ``ExecutorRunner`` in
``workers.executor_runner`` (an a2a-sdk AgentExecutor, such as the conformance
specialist). Monty specialists register under their own ids (issue 7).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workers.auth import VerifiedJob

MAX_MESSAGE_CHARS = 2000
MAX_ARTIFACTS = 32


class EventSink(Protocol):
    def emit(self, job: VerifiedJob, fencing_token: int, kind: str, data: dict[str, Any]) -> None:
        """Record a progress event. Writers must check the fencing token: a stale worker writes nothing.

        Kinds: ``progress`` (``text``), ``artifact`` (``name``, ``text``), ``a2a`` (``event``: an a2a-sdk
        TaskStatusUpdateEvent or TaskArtifactUpdateEvent).
        """
        ...


@dataclass
class RunContext:
    job: VerifiedJob
    fencing_token: int
    deadline_at: float  # time.monotonic() value
    cancel: threading.Event  # or a multiprocessing Event, in a job's process: the same is_set/wait
    events: EventSink

    @property
    def reserved_credits(self) -> int:
        """The credits the task reserved at admission (read by the claim, ``taskstate.admitted``): the ceiling of
        every credit figure a runner states, never a spec file's tariff. 0: nothing was reserved (a free
        specialist, or a raw job, which serves no task)."""
        credits = self.job.reserved_credits or 0
        assert credits >= 0, credits
        return credits

    def cancelled(self) -> bool:
        return self.cancel.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when woken because the run must stop."""
        return self.cancel.wait(max(0.0, seconds))

    def report(self, kind: str, data: dict[str, Any]) -> None:
        self.events.emit(self.job, self.fencing_token, kind, data)


@dataclass(frozen=True)
class RunOutcome:
    state: Literal["completed", "failed", "canceled", "rejected", "input_required"]
    message: str = ""
    artifacts: tuple[dict[str, Any], ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)
    # The A2A event that ended the run (a final TaskStatusUpdateEvent, or a direct-reply Message), written as
    # the task's last event. Not part of the claim's record.
    final_event: Any = field(default=None, compare=False, repr=False)
    # A2A events written with the finish, in its transaction and before the final event (a run's artifacts): the
    # customer sees them with the final state, in one commit and one wake-up. Not part of the claim's record.
    events: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    # The CPU seconds of the job's processes together (``workers.cpu_share``), measured in its process; None: not
    # measured (a runner in a thread of the worker, or a process that died before its outcome).
    cpu_seconds: float | None = field(default=None, compare=False)

    def as_record(self) -> dict[str, Any]:
        """What the claim row stores and a later delivery answers with (bounded)."""
        return {
            "message": self.message[:MAX_MESSAGE_CHARS],
            "artifacts": list(self.artifacts[:MAX_ARTIFACTS]),
            **({"detail": self.detail} if self.detail else {}),
            **({"cpu_seconds": self.cpu_seconds} if self.cpu_seconds is not None else {}),
        }


class Runner(Protocol):
    def run(self, ctx: RunContext) -> RunOutcome: ...


# --- the scripted specialist --------------------------------------------------------


class ScriptStep(BaseModel):
    """One step. ``sleep`` wakes on cancel; ``stubborn_sleep`` ignores it (to test the grace bound);
    ``hold_gil`` keeps the interpreter's lock for ``seconds`` the way a long C call does (a catastrophic regex
    match in the host code of an rlm run, issue 15): it cannot be interrupted, and in the job's process nothing
    else of Python runs meanwhile; ``allocate`` takes ``megabytes`` of memory at once and lets it go (a run whose
    state blows up, against the job's memory cap); ``spin`` runs a process of the job that burns a core for up to
    ``seconds`` (as Monty's process does on code that loops: in the job's process group), and ends it early on a
    cancel (against the job's CPU share and cap, ``workers.cpu_share``)."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["progress", "sleep", "stubborn_sleep", "hold_gil", "allocate", "spin", "artifact", "fail", "raise",
                "complete"]
    text: str = Field(default="", max_length=MAX_MESSAGE_CHARS)
    seconds: float = Field(default=0.0, ge=0.0, le=600.0)
    megabytes: int = Field(default=0, ge=0, le=65_536)


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: list[ScriptStep] = Field(default_factory=list, max_length=100)


ScriptSource = Callable[[VerifiedJob], Any]

# Catastrophic backtracking: ``(a+)+$`` against n ``a`` and a ``!`` tries about 2**n ways, in one C call of
# Python's ``re`` that never releases the GIL. Calibrated at CALIBRATION_CHARS, each match is sized to the time
# that is left, so one call lasts as long as possible (the seen case: a single match of about 100 s).
_CATASTROPHIC = re.compile(r"(a+)+$")
CALIBRATION_CHARS = 16
MAX_HOLD_CHARS = 40


def hold_gil(seconds: float) -> None:
    """Hold the GIL for about ``seconds`` (at least), in uninterruptible regex matches."""
    start = time.monotonic()
    _CATASTROPHIC.match("a" * CALIBRATION_CHARS + "!")
    unit_s = max(1e-6, time.monotonic() - start)  # one match of CALIBRATION_CHARS
    while (left_s := seconds - (time.monotonic() - start)) > 0:
        doublings = math.floor(math.log2(left_s / unit_s)) if left_s > unit_s else 0
        chars = min(MAX_HOLD_CHARS, CALIBRATION_CHARS + max(0, doublings))
        _CATASTROPHIC.match("a" * chars + "!")


def spin(ctx: RunContext, seconds: float) -> bool:
    """A child process that loops for up to ``seconds``; True when the run was asked to stop meanwhile."""
    # Not a role: the job's own busy child, in the job's process group, killed with it.
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
    try:
        return ctx.wait(seconds)
    finally:
        child.kill()
        child.wait()


class ScriptedRunner:
    """A deterministic specialist: its steps come from the job payload's ``script``, or from ``script_of(job)``
    (on a worker: the ``script`` key of the A2A message's first data part). No script: it completes at once.

    ``on_step(job_id, index, step)`` lets a test observe each step as it starts.
    """

    def __init__(
        self,
        on_step: Callable[[str, int, ScriptStep], None] | None = None,
        script_of: ScriptSource | None = None,
    ) -> None:
        self.on_step = on_step
        self.script_of = script_of

    def run(self, ctx: RunContext) -> RunOutcome:
        raw = ctx.job.payload.get("script")
        if raw is None and self.script_of is not None:
            raw = self.script_of(ctx.job)
        try:
            script = Script.model_validate(raw or {})
        except ValidationError as exc:
            return RunOutcome("failed", f"the script is not valid: {exc.errors()[0]['msg']}")
        artifacts: list[dict[str, Any]] = []
        for index, step in enumerate(script.steps):
            if ctx.cancelled():
                return RunOutcome("canceled", "stopped before step %d" % index, tuple(artifacts))
            if self.on_step:
                self.on_step(ctx.job.job_id, index, step)
            if step.op == "progress":
                ctx.report("progress", {"step": index, "text": step.text})
            elif step.op == "sleep":
                if ctx.wait(step.seconds):
                    return RunOutcome("canceled", f"stopped during step {index}", tuple(artifacts))
            elif step.op == "stubborn_sleep":
                time.sleep(step.seconds)
            elif step.op == "hold_gil":
                hold_gil(step.seconds)
            elif step.op == "allocate":
                held = bytearray(step.megabytes << 20)
                del held
            elif step.op == "spin":
                if spin(ctx, step.seconds):
                    return RunOutcome("canceled", f"stopped during step {index}", tuple(artifacts))
            elif step.op == "artifact":
                artifact = {"name": f"artifact-{len(artifacts) + 1}", "text": step.text}
                artifacts.append(artifact)
                ctx.report("artifact", artifact)
            elif step.op == "fail":
                return RunOutcome("failed", step.text or "the script failed", tuple(artifacts))
            elif step.op == "raise":
                raise RuntimeError(step.text or "scripted crash")
            elif step.op == "complete":
                return RunOutcome("completed", step.text, tuple(artifacts))
        return RunOutcome("completed", "done", tuple(artifacts))
