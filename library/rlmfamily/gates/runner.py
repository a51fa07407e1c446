"""Running a root run's completion gates as command jobs, and telling the model what failed.

``GateKeeper.check`` runs every gate, in order, through the run's command broker
(rlmfamily/bash: ``command_broker``), so a gate gets what any command job gets:
a durable receipt in ``jobs.sqlite3`` (surface ``gate``), its own process group,
its deadline (then SIGTERM, SIGKILL after ``bash_kill_grace_s``), output stored
to files (the whole output stays readable by job id) and the run's environment
(the container of a container run, once the broker runs jobs there). A gate is
a mutating job: it holds the workspace lease while it runs, so no other command
of the family changes the files under it. Gates are not limited by
``bash_max_deadline_s`` (the model's commands) but by ``gate_max_deadline_s``.

The model's side: a note in the system prompt naming the gates, and ``gates``
in the namespace (``gates.list()``, ``gates.last()``, ``gates.read(job_id, stream, start, size)``).
When a gate fails, ``feedback`` is the message the model gets: which gates
failed, how (exit status, deadline), the head and tail of each stream (at most
``gate_excerpt_bytes``), and the job id that reads the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rlmfamily.bash.extension import command_broker, workspace_of
from rlmfamily.bash.errors import JobError, JobRefused
from rlmfamily.bash.store import Job
from rlmfamily.gates.spec import GateSpec
from rlmfamily.gates.verdict import Attempt, GateRun, how_it_ended

if TYPE_CHECKING:
    from pathlib import Path

    from rlmfamily.bash.broker import CommandBroker
    from rlmfamily.context import Context
    from rlmfamily.extensions import RunInfo
    from rlmfamily.settings import RLMSettings

STREAMS = ("stdout", "stderr")
HISTORY_TITLE_CHARS = 80

GATES_PRELUDE = r'''

class _Gates:
    def __init__(self):
        self._rlm_kind = "gates"

    def list(self):
        return _gates_list()

    def last(self):
        return _gates_last()

    def read(self, job_id, stream="stdout", start=0, size=None):
        return _gates_read(job_id, stream, start, size)

    def __repr__(self):
        return "<gates: list(), last(), read(job_id, stream='stdout', start=0, size=None)>"


gates = _Gates()
'''

PROMPT_NOTE = """

Completion gates are on. When you call final_answer, the run waits for your children and required remote work,
then runs these commands in the workspace {workspace}:
{listed}
The answer is accepted only when every gate exits 0. If one fails, your answer is withdrawn and you are told
which gate failed, with the start and end of its output; `gates.read(job_id, stream, start, size)` reads the rest.
Fix the cause and call final_answer again. `gates.list()` lists the gates, `gates.last()` their last runs."""


def gate_settings(settings: RLMSettings) -> RLMSettings:
    """The settings of the gates' broker: a gate's deadline is bounded by gate_max_deadline_s, not by the
    model's bash_max_deadline_s (every gate's deadline was checked against it at start-up)."""
    return settings.model_copy(update={"bash_max_deadline_s": settings.gate_max_deadline_s})


class GateKeeper:
    """A root run's gates: their namespace names, their runs, and what the model is told."""

    def __init__(self, info: RunInfo, gates: Sequence[GateSpec], *, earlier: Sequence[dict[str, Any]] = ()) -> None:
        assert gates, "a GateKeeper is built for a run that has gates"
        self.info = info
        self.settings = info.settings
        self.gates = list(gates)
        self.attempts: list[Attempt] = []
        # A resumed run: the gate runs of its earlier processes, as recorded; its attempts are numbered after them.
        self.earlier = [dict(run) for run in earlier]
        self.attempts_before = max((int(run.get("attempt") or 0) for run in self.earlier), default=0)
        self.broker: CommandBroker = command_broker(info, settings=gate_settings(info.settings))
        self.prelude = GATES_PRELUDE
        listed = "\n".join(f"- {g.name}: `{g.command}` (deadline {self.deadline_s(g):g} s)" for g in self.gates)
        self.notes = PROMPT_NOTE.format(workspace=self.broker.workspace, listed=listed)

    def deadline_s(self, gate: GateSpec) -> float:
        return gate.deadline_s if gate.deadline_s is not None else self.settings.gate_default_deadline_s

    def functions(self) -> dict[str, Callable[..., Any]]:
        return {"_gates_list": self._list, "_gates_last": self._last, "_gates_read": self._read}

    @property
    def last(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def record(self) -> list[dict[str, Any]]:
        """Every gate run of the run, its earlier processes' included, in order (``RunResult.extra["gates"]``)."""
        return self.earlier + [run.to_dict() for attempt in self.attempts for run in attempt.runs]

    # ---------- running ----------

    def check(self, turn: int) -> Attempt:
        """Run every gate once against the workspace as it is now; record each run and the attempt."""
        number = self.attempts_before + len(self.attempts) + 1
        runs: list[GateRun] = []
        error = None
        for gate in self.gates:
            run = self._run(gate, number, turn)
            runs.append(run)
            if run.error is not None:  # the environment refused it: the other gates would be refused alike
                error = f"gate {gate.name!r}: {run.error}"
                break
        attempt = Attempt(number=number, turn=turn, runs=tuple(runs), error=error)
        self.attempts.append(attempt)
        return attempt

    def _run(self, gate: GateSpec, attempt: int, turn: int) -> GateRun:
        info = self.info
        deadline_s = self.deadline_s(gate)
        info.emit({"event": "gate_started", "turn": turn, "gate": gate.name, "attempt": attempt})
        try:
            job, _ = self.broker.run(gate.command, deadline_s=deadline_s, surface="gate")
        except JobError as exc:  # refused before it ran: the lease held by an unknown job, no slot, no jobs left
            run = GateRun(attempt=attempt, turn=turn, name=gate.name, command=gate.command, deadline_s=deadline_s,
                          passed=False, state="not_run", exit_code=None, stopped_by=None, duration_s=None,
                          job_id=None, error=f"[{exc.code}] {exc.message}")
        else:
            run = self._judged(gate, job, attempt, turn)
        info.trajectory.write("gate", **run.to_dict())
        info.emit({"event": "gate", "turn": turn, "gate": gate.name, "attempt": attempt, "passed": run.passed})
        return run

    def _judged(self, gate: GateSpec, job: Job, attempt: int, turn: int) -> GateRun:
        passed = job.state == "exited" and job.exit_code == 0
        error = None if job.state in ("exited", "killed") else (job.error or f"the job ended {job.state}")
        run = GateRun(attempt=attempt, turn=turn, name=gate.name, command=gate.command, deadline_s=job.deadline_s,
                      passed=passed, state=job.state, exit_code=job.exit_code, stopped_by=job.stopped_by,
                      duration_s=job.duration_s, job_id=job.id, stdout_bytes=job.stdout_bytes,
                      stderr_bytes=job.stderr_bytes, excerpt="" if passed else self.excerpt(job), error=error)
        if passed or error is not None:
            return run
        headline = f"gate {gate.name} failed: {how_it_ended(run.to_dict())} (job {job.id})"
        history_id = self.info.history.add(
            "gate", f"{headline}\n$ {gate.command}\n{run.excerpt}", turn=turn,
            title=f"gate {gate.name} (attempt {attempt}): {gate.command}"[:HISTORY_TITLE_CHARS])
        return replace(run, history_id=history_id)

    # ---------- what the model sees ----------

    def excerpt(self, job: Job) -> str:
        """The head and tail of each stream that has output, at most ``gate_excerpt_bytes`` in all."""
        streams = [s for s in STREAMS if getattr(job, f"{s}_bytes")]
        if not streams:
            return "(no output)"
        share = self.settings.gate_excerpt_bytes // len(streams)
        parts = []
        for stream in streams:
            total, stored = getattr(job, f"{stream}_bytes"), getattr(job, f"{stream}_stored")
            parts.append(f"{stream} ({total:,} bytes):")
            if stored <= share:
                parts.append(self._slice(job, stream, 0, stored).rstrip("\n"))
            else:
                head = share // 2
                tail = share - head
                parts.append(self._slice(job, stream, 0, head))
                parts.append(f"[... {stored - head - tail:,} bytes not shown: gates.read({job.id!r}, {stream!r}, "
                             f"{head}, size) reads them ...]")
                parts.append(self._slice(job, stream, stored - tail, tail).rstrip("\n"))
            if stored < total:
                parts.append(f"[{total - stored:,} more bytes were counted, not kept (RLM_BASH_MAX_STORED_BYTES)]")
        return "\n".join(parts)

    def _slice(self, job: Job, stream: str, start: int, size: int) -> str:
        """Bytes ``start`` to ``start + size`` of a stream, read in slices the broker allows."""
        cap = self.settings.bash_max_read_bytes
        pieces = []
        while size > 0:
            piece = self.broker.read(job.id, stream, start, min(size, cap))
            if not piece:
                break
            pieces.append(piece)
            read = min(size, cap)
            start, size = start + read, size - read
        return "".join(pieces)

    def feedback(self, attempt: Attempt, *, turns_left: int) -> str:
        """The message that withdraws the answer: each failed gate, how, its excerpt and its handle."""
        failed = attempt.failed
        lines = [f"[completion gates, attempt {attempt.number}] Your answer was not accepted: {len(failed)} of "
                 f"{len(attempt.runs)} gates failed."]
        for run in attempt.runs:
            if run.passed:
                lines.append(f"gate {run.name} passed.")
                continue
            lines.append(f"gate {run.name} FAILED: {how_it_ended(run.to_dict())} (job {run.job_id})")
            lines.append(f"$ {run.command}")
            lines.append(run.excerpt)
            streams = [s for s in STREAMS if getattr(run, f"{s}_bytes")] or ["stdout"]
            reads = " and ".join(f"gates.read({run.job_id!r}, {s!r}, start, size)" for s in streams)
            lines.append(f"[the whole output: {reads}"
                         + (f"; this excerpt is history entry {run.history_id}" if run.history_id else "") + "]")
        lines.append(f"Fix what failed, then call final_answer again: the gates run again. {turns_left} turns left.")
        return "\n".join(lines)

    # ---------- host functions ----------

    def _list(self) -> list[dict[str, Any]]:
        return [{"name": g.name, "command": g.command, "deadline_s": self.deadline_s(g)} for g in self.gates]

    def _last(self) -> list[dict[str, Any]]:
        """The gate runs of the last attempt (job ids, how each ended, the excerpt of a failed one)."""
        return [run.to_dict() for run in self.last.runs] if self.last else []

    def _read(self, job_id: str, stream: str = "stdout", start: int = 0, size: int | None = None) -> str:
        job = self.broker.store.job(str(job_id))
        if job.run_id != self.info.run_id or job.surface != "gate":
            raise JobRefused(f"job {job_id} is not a gate job of this run; gates.list() names the gates")
        return self.broker.read(job.id, str(stream), int(start or 0), size)


def gate_workspace(settings: RLMSettings, context: Context) -> Path:
    """Where the gates run (the bash profile's workspace: RLM_BASH_WORKSPACE, else the repository), checked
    when a gated session is built so that a run without one is refused before it starts."""
    return workspace_of(settings, context, needed_by="completion gates (RLM_GATES, --gate)")
