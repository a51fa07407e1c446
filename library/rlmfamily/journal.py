"""The host-call journal of a root run: each step's code and what each of its host calls returned.

``runs/<run id>/host_calls.jsonl``, one JSON object per line, flushed as written
(a killed run leaves everything up to the kill):

- ``{"kind": "step", "step": n, "code_sha256": ...}`` when step ``n`` first begins;
- ``{"kind": "call", "step": n, "index": i, "name": ..., "args_sha256": ..., "ok": true, "value": ...}``
  (or ``"ok": false`` with ``exc_type`` and ``message``): what the sandbox got from
  its ``i``-th host call: a sub-call's answer, a read, a search, a child's handle;
- ``{"kind": "step_end", "step": n, "ok": ..., "error_code": ..., "restored": ..., "output_sha256": ...}``;
- ``{"kind": "call_begun", "step": n, "index": i, "name": ...}`` before a call of a custom tool that is not
  safe to repeat (rlmfamily/tools.py): a resume that finds it without its result knows the call may have
  done its work, and does not run it twice.

Steps are numbered by the run's ``Kernel.execute`` calls, counted across resumes.
``JournaledKernel`` wraps the real kernel of every root run and writes the
journal. When a run is resumed (rlmfamily/resume.py) it is given a ``Restore``:
it restores the kernel (a Monty checkpoint, or the host kernel rebuilt by running
the recorded steps again), and while a recorded step runs again its host calls
are answered from the journal, in order, each checked against the recorded name
and arguments. Nothing recorded is asked again of a model, the corpus, a child
or a peer. ``_final_answer`` is the exception: it only sets the run's answer, so
it runs again; so do the custom tools declared ``repeat_safe`` (``live_on_replay``).
A call of one that is not, begun and never answered, gets ``tool_outcome_unknown``.
A call past the record (the interrupted step going on) runs for
real and is journaled. A replayed step that prints or fails differently from the
record means the code depends on something outside it (time, randomness, files):
the host kernel cannot be rebuilt faithfully, and the resume is refused.

The journal holds every host-call result whole, as the history holds every
observation; each is bounded by its own setting (``max_read_chars``,
``max_search_hits``, ``max_response_chars``, ...).
"""

from __future__ import annotations

import builtins
import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from rlmfamily.errors import ResumeInconsistent, ResumeUnsupported
from rlmfamily.kernels._calls import HOST_CALL_TIMEOUT_MARK, PASSABLE_EXCEPTIONS, exception_outcome
from rlmfamily.kernels.base import Bridge, Kernel, StepResult

FILENAME: Final = "host_calls.jsonl"
# Host functions that run again when their step is replayed: they change only this run's own state.
LIVE_ON_REPLAY: Final = frozenset({"_final_answer"})

RestoreMode = Literal["fresh", "checkpoint", "replay", "kept"]  # kept: a follow-up on the live kernel
Record = dict[str, Any]
_position = threading.local()  # the host call being answered in this thread: (step, index)


def current_call() -> tuple[int, int] | None:
    """The (step, index) of the journaled host call running in this thread, or None outside one.

    A step that runs again after a resume makes its calls at the same positions, so a host function
    can derive an idempotency key from it (a command job's request id: rlmfamily/bash/extension.py).
    """
    return getattr(_position, "value", None)


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def output_digest(result: StepResult) -> str:
    """What a replayed step must reproduce: its outcome and everything it printed."""
    return digest([result.ok, result.error_code, result.stdout, result.stdout_truncated, result.error])


@dataclass
class RecordedStep:
    number: int
    code_sha256: str
    calls: dict[int, Record] = field(default_factory=dict)  # by index; a later record of an index wins
    begun: set[int] = field(default_factory=set)  # indexes of once-only calls that began (call_begun)
    end: Record | None = None


def load(path: Path) -> dict[int, RecordedStep]:
    """The recorded steps of a journal, by number. A torn last line (a kill mid-write) is left out."""
    steps: dict[int, RecordedStep] = {}
    if not path.is_file():
        return steps
    with path.open(encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):
                break
            raise ResumeInconsistent(f"{path}: line {number} is not JSON; the journal was damaged") from None
        kind, step = record.get("kind"), int(record.get("step", 0))
        if kind == "step":
            steps.setdefault(step, RecordedStep(step, record["code_sha256"]))
        elif step in steps and kind == "call":
            steps[step].calls[int(record["index"])] = record
        elif step in steps and kind == "call_begun":
            steps[step].begun.add(int(record["index"]))
        elif step in steps and kind == "step_end":
            steps[step].end = record
    return steps


@dataclass(frozen=True)
class Restore:
    """How a resumed run gets its namespace back: ``fresh`` (no step had run), the Monty ``checkpoint``
    after step ``completed``, or ``replay`` of the recorded ``codes`` (host kernel).

    A ``checkpoint`` restore with one code goes on from the record one step behind the trajectory (the crash
    came after the step's trajectory line, before the kernel's record of it was stored: a Session writes the
    line without waiting for it) and runs that step again, its host calls answered from the journal; the step
    must print and end as the journal recorded it, or the resume is refused. One with ``ahead`` goes on from the
    record of the trajectory's last step although the store holds the next step's too (``MontyKernel.recover``
    with ``seq`` drops it)."""

    mode: RestoreMode
    completed: int  # steps whose record is complete (the trajectory has their observation)
    codes: tuple[str, ...] = ()  # replay: every recorded step; checkpoint: the step after the record, or none
    steps: dict[int, RecordedStep] = field(default_factory=dict)
    # checkpoint: the newest record is one step AHEAD of the trajectory (the crash came after a step's record, before
    # its trajectory line): it is dropped once the record before it is loaded, and that step runs again as cut off.
    ahead: bool = False

    def __post_init__(self) -> None:
        assert self.mode != "checkpoint" or len(self.codes) <= 1, "a checkpoint restore runs at most one step again"

    @property
    def checkpoint_seq(self) -> int:
        """The Monty record a ``checkpoint`` restore loads: the step count, or one behind it."""
        return self.completed - len(self.codes)


class JournaledKernel:
    """A kernel whose steps and host calls are journaled; on a resume, restored and replayed from the journal."""

    def __init__(self, inner: Kernel, path: Path, *, host_call_timeout_s: float, restore: Restore | None = None,
                 live_on_replay: frozenset[str] = frozenset(), once_only: frozenset[str] = frozenset()) -> None:
        self.inner = inner
        self.live_on_replay = LIVE_ON_REPLAY | live_on_replay  # run again when replayed (rlmfamily/tools.py)
        self.once_only = once_only  # never run twice: their beginning is journaled (call_begun)
        self.name = inner.name
        self.path = path
        self.host_call_timeout_s = host_call_timeout_s
        self.restore = restore
        self.recorded: dict[int, RecordedStep] = dict(restore.steps) if restore else {}
        self.checkpoint_seq: int | None = None  # the Monty record a resume started from
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")
        self._step = 0
        self._index = 0
        self._replaying: RecordedStep | None = None  # the recorded step running again, until it diverges
        self._diverged: str | None = None
        # While ``start`` rebuilds the namespace nothing runs live: a call the record does not answer is refused in
        # the sandbox (the rebuild is then refused), never asked of a model or a peer, never journaled.
        self._restoring = False

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self, bridge: Bridge, prelude: str) -> None:
        wrapped = {name: self._wrap(name, fn) for name, fn in bridge.items()}
        restore = self.restore
        self._restoring = restore is not None and restore.mode in ("checkpoint", "replay")
        try:
            if restore is None or restore.mode == "fresh":
                self.inner.start(wrapped, prelude)
            elif restore.mode == "checkpoint":
                self._recover(wrapped, prelude, restore)
            else:
                self.inner.start(wrapped, prelude)
                for code in restore.codes:
                    self._replay(code)
        finally:
            self._restoring = False

    def _recover(self, bridge: Bridge, prelude: str, restore: Restore) -> None:
        from rlmfamily.kernels.checkpoints import CheckpointError

        recover = getattr(self.inner, "recover", None)
        if recover is None:
            raise ResumeUnsupported(f"the {self.name} kernel has no checkpoints to recover from")
        try:
            recovery = recover(bridge, prelude, seq=restore.checkpoint_seq)
        except CheckpointError as exc:
            raise ResumeUnsupported(f"the Monty checkpoint cannot be loaded: [{exc.code}] {exc.message}") from None
        if recovery.kind != "session" or recovery.seq != restore.checkpoint_seq:
            raise ResumeInconsistent(
                f"the newest Monty checkpoint is {recovery.kind} seq {recovery.seq}, but the trajectory records "
                f"{restore.completed} steps: the checkpoint and the trajectory disagree")
        self.checkpoint_seq = recovery.seq
        self._step = recovery.seq
        for code in restore.codes:  # the step whose record was never stored: run again, kept only if it agrees
            self._rerun(code)

    def _rerun(self, code: str) -> None:
        """Run the recorded step after the checkpoint again from it; its record is stored only if the step
        printed and ended as the journal says it did (``MontyKernel.rerun``), else the resume is refused and
        the store, the journal and the trajectory stay as they were."""
        rerun = getattr(self.inner, "rerun", None)
        if rerun is None:
            raise ResumeUnsupported(f"the {self.name} kernel cannot run a step again from its checkpoint")
        recorded = self._begin(code)
        assert recorded is not None and recorded.end is not None, "the trajectory's steps are all in the journal"
        step, expected = self._step, recorded.end.get("output_sha256")

        def accept(result: StepResult) -> None:
            problem = self._diverged
            if problem is None and output_digest(result) != expected:
                problem = "it printed or failed differently than it did"
            if problem is not None:
                raise ResumeInconsistent(
                    f"the newest Monty checkpoint is the one before step {step}, whose record was not stored before "
                    f"the crash; step {step} was run again from it and {problem} (its code depends on something "
                    "outside the record, such as time or random numbers), so the namespace it would leave is not "
                    f"the one the model saw. Nothing was changed; start this question again with `rlm run`")

        try:
            rerun(code, accept)
        finally:
            self._end(recorded, None)

    def _replay(self, code: str) -> None:
        """Run a recorded step again; it must end as recorded, or the namespace is not the one the model saw."""
        result = self.execute(code)
        recorded = self.recorded[self._step].end or {}
        problem = self._diverged
        if problem is None and output_digest(result) != recorded.get("output_sha256"):
            problem = "it printed or failed differently than it did"
        if problem is not None:
            raise ResumeUnsupported(
                f"the host kernel cannot be rebuilt faithfully: replaying step {self._step}, {problem} (its code "
                "depends on something outside the record, such as time, randomness or files). Use the monty "
                "kernel (RLM_KERNEL=monty) for runs you may resume; start this question again with `rlm run`")

    def execute(self, code: str) -> StepResult:
        recorded = self._begin(code)
        result = self.inner.execute(code)
        self._end(recorded, result)
        return result

    def _begin(self, code: str) -> RecordedStep | None:
        """The next step begins: its record, when it runs again (its calls are answered from it), else journaled."""
        with self._lock:
            self._step += 1
            self._index = 0
            self._diverged = None
            recorded = self.recorded.get(self._step)
            if recorded is not None and recorded.code_sha256 != digest(code):
                raise ResumeInconsistent(f"step {self._step} of the journal {self.path} ran other code than the "
                                         "trajectory records")
            self._replaying = recorded
            if recorded is None:
                self._write({"kind": "step", "step": self._step, "code_sha256": digest(code)})
            return recorded

    def _end(self, recorded: RecordedStep | None, result: StepResult | None) -> None:
        with self._lock:
            self._replaying = None
            if result is not None and (recorded is None or recorded.end is None):
                self._write({"kind": "step_end", "step": self._step, "ok": result.ok, "error_code": result.error_code,
                             "restored": result.restored_from_checkpoint, "output_sha256": output_digest(result)})

    def flush(self) -> None:
        """Wait for the inner kernel's record of its last step, where it takes it in the background
        (``MontyKernel.flush``); a no-op for a kernel that records in ``execute`` or not at all."""
        flush = getattr(self.inner, "flush", None)
        if flush is not None:
            flush()

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            with self._lock:
                if not self._file.closed:
                    self._file.close()

    # ---- host calls --------------------------------------------------------------------------

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def journaled(*args: Any, **kwargs: Any) -> Any:
            step, index, recorded = self._next_call(name, args, kwargs)
            if recorded is not None and name not in self.live_on_replay:
                return _replayed(recorded)
            if name in self.once_only and recorded is None:
                with self._lock:
                    self._write({"kind": "call_begun", "step": step, "index": index, "name": name})
            began = time.monotonic()
            _position.value = (step, index)
            try:
                value = fn(*args, **kwargs)
            except BaseException as exc:
                self._record_call(step, index, name, args, kwargs, began, exc=exc, skip=recorded is not None)
                raise
            finally:
                _position.value = None
            self._record_call(step, index, name, args, kwargs, began, value=value, skip=recorded is not None)
            return value

        journaled.__name__ = getattr(fn, "__name__", name)
        return journaled

    def _next_call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int, Record | None]:
        """This call's step and index, and its record when the step is replayed and the record matches."""
        with self._lock:
            self._index += 1
            step, index, replaying = self._step, self._index, self._replaying
            recorded = replaying.calls.get(index) if replaying is not None else None
            if replaying is None:
                return step, index, None
            if recorded is None and index in replaying.begun and name in self.once_only:
                # Begun and never answered: it may have done its work. Never run twice; the step goes on live.
                self._replaying = None
                unknown = _outcome_unknown(name)
                self._write({"kind": "call", "step": step, "index": index, "name": name,
                             "args_sha256": digest([list(args), kwargs]), **unknown})
                return step, index, unknown
            if recorded is None:
                if replaying.end is not None or index < max(replaying.calls, default=0):
                    # The step made this call, but it never returned to the step in time.
                    recorded = _timed_out(name, self.host_call_timeout_s)
                else:
                    self._replaying = None  # the interrupted step goes on past its record
                    return step, index, None
            elif recorded["name"] != name or recorded["args_sha256"] != digest([list(args), kwargs]):
                self._diverged = (f"its host call {index} is {name}({_preview(args)}) where the record has "
                                  f"{recorded['name']} with other arguments")
                self._replaying = None
                if self._restoring:
                    return step, index, _not_run(name)
                return step, index, None
            return step, index, recorded

    def _record_call(self, step: int, index: int, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                     began: float, *, value: Any = None, exc: BaseException | None = None, skip: bool) -> None:
        if skip:
            return
        record: Record = {"kind": "call", "step": step, "index": index, "name": name,
                          "args_sha256": digest([list(args), kwargs])}
        if time.monotonic() - began > self.host_call_timeout_s:
            # The kernel stopped waiting for it: the sandbox got its TimeoutError, not this outcome.
            record.update(_timed_out(name, self.host_call_timeout_s))
        elif exc is not None:
            outcome = exception_outcome(exc)
            record.update(ok=False, exc_type=outcome.exc_type, message=outcome.message)
        else:
            record.update(ok=True, value=value)
        with self._lock:
            self._write(record)

    def _write(self, record: Record) -> None:
        if not self._file.closed:
            self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
            self._file.flush()


def _timed_out(name: str, timeout_s: float) -> Record:
    # The message the kernels' HostCaller gives a call it abandoned at its deadline.
    return {"ok": False, "exc_type": "TimeoutError",
            "message": f"host function {name} {HOST_CALL_TIMEOUT_MARK}={timeout_s:g}s; it was abandoned"}


def _not_run(name: str) -> Record:
    return {"ok": False, "exc_type": "RuntimeError",
            "message": f"host function {name} was not run: the step diverged from its record while the namespace "
                       "was rebuilt"}


def _outcome_unknown(name: str) -> Record:
    tool = name.removeprefix("_tool_")
    return {"ok": False, "exc_type": "RuntimeError",
            "message": f"[tool_outcome_unknown] {tool} was running when the run was interrupted; it is not run twice "
                       "(its outcome is unknown: check what it did before calling it again; a tool safe to run again "
                       "is declared repeat_safe=True)"}


def _replayed(record: Record) -> Any:
    if record.get("ok"):
        return record.get("value")
    exc_type = record.get("exc_type", "RuntimeError")
    raise getattr(builtins, exc_type if exc_type in PASSABLE_EXCEPTIONS else "RuntimeError")(record.get("message", ""))


PREVIEW_ARG_CHARS: Final = 60  # of a diverging call's arguments quoted in a refusal


def _preview(args: tuple[Any, ...]) -> str:
    text = ", ".join(repr(a) for a in args)
    return text if len(text) <= PREVIEW_ARG_CHARS else text[: PREVIEW_ARG_CHARS - 1] + "…"
