"""A root run's records read back: the conversation, the namespace's restore, the budget entries and counters.

What ``rlm resume`` continues an interrupted run from, and what a follow-up question (``rlm ask``,
``Session.follow_up``) continues a finished one from: a ``ResumePoint`` (rlmfamily/resumption.py). rlmfamily/resume.py
documents what comes back from where; this module reads it and knows no command line.

A run's trajectory is one or more segments: ``run_started``, then a ``run_resumed`` for each process that continued
it after a crash, and a ``follow_up`` for each question asked after it finished. Each question ends with its own
``run_finished``; an earlier one stays as it was written. Turns and steps are numbered across the segments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlmfamily.context import Context
from rlmfamily.errors import (
    ResumeInconsistent,
    ResumeUnsupported,
    RunFinished,
    RunRunning,
)
from rlmfamily.family import procs
from rlmfamily.journal import FILENAME as JOURNAL_FILENAME
from rlmfamily.journal import RecordedStep, Restore, digest, load
from rlmfamily.prompts import final_request, first_message, in_text_words
from rlmfamily.protocol import TEXT, Protocol, protocol_named
from rlmfamily.providers.base import Completion, ToolCall
from rlmfamily.resumption import FinalState, ResumePoint
from rlmfamily.settings import RLMSettings
from rlmfamily.trajectory import lock_trajectory

Event = dict[str, Any]
SEGMENT_EVENTS = ("run_started", "run_resumed", "follow_up")
UNREPLAYABLE_CODES = ("timeout", "killed")  # a step cut off where the clock or a kill said: not reproducible
# The tool results of calls that run no step (the session gives them; the conversation's rebuild gives them again).
NOT_RUN = "[not run: the run is ending]"
EMPTY_CODE = "[error: empty code; send Python source in the code argument]"


def no_such_tool(name: str, tools: Sequence[str] = ("python",)) -> str:
    if tuple(tools) == ("python",):
        return f"[error: there is no tool {name!r}; the only tool is python]"
    return f"[error: there is no tool {name!r}; the tools are {', '.join(tools)}]"


# ---------- checks ----------


def check_resumable(settings: RLMSettings, path: Path, events: list[Event]) -> Event:
    """The run's ``run_started``, once the run is known to be an unfinished root that no process runs."""
    started = events[0] if events and events[0]["event"] == "run_started" else None
    run_id = path.parent.name
    if started is None:
        raise ResumeInconsistent(f"{path} does not begin with run_started; it is not a whole trajectory")
    finished = [e for e in events if e["event"] == "run_finished"]
    if finished:
        raise RunFinished(f"run {run_id} already finished ({finished[-1].get('stop_reason')}); "
                          f"`rlm show {run_id}` shows it. Ask again with `rlm run`")
    if settings.family_path.is_file():
        from rlmfamily.family.store import FamilyStore

        member = FamilyStore(settings.family_path).run(run_id)
        if member is not None and member.root_id != run_id:
            raise ResumeUnsupported(f"run {run_id} is a child of {member.root_id}; a child is not resumed on its own. "
                                    f"Resume its root (`rlm resume {member.root_id}`), which settles its children")
    owner = [e for e in events if e["event"] in SEGMENT_EVENTS][-1]
    with path.open("a") as probe:  # the owner holds the writer's lock as long as it lives
        lock_trajectory(probe.fileno(), path)
    if owner.get("pid") and procs.alive(owner["pid"], owner.get("pid_start")):
        raise RunRunning(f"run {run_id} is still running (pid {owner['pid']}); wait for it, or stop it first")
    if "system_prompt" not in started or any(e["event"] == "turn" and "calls" not in e for e in events):
        raise ResumeUnsupported(f"run {run_id} was recorded by a version of rlmfamily without resume support "
                                "(its trajectory lacks the system prompt or the call ids); start it again with `rlm run`")
    return started


# ---------- the plan ----------


@dataclass
class _Conversation:
    """The conversation rebuilt event by event, as the session built it (rlmfamily/session.py, protocol.py)."""

    protocol: Protocol
    messages: list[dict[str, Any]]
    turn: int = 0
    completion: Completion | None = None  # the current turn's reply, until its results are given
    calls: tuple[ToolCall, ...] = ()
    observations: list[str] = field(default_factory=list)
    final_turn: bool = False  # the current turn answers the final request
    asked_final: FinalState | None = None  # a final request whose reply is not recorded (yet)
    final: FinalState | None = None
    answer: tuple[str, int] | None = None
    steps: list[Event] = field(default_factory=list)
    tools: tuple[str, ...] = ("python",)  # the tools the run offered (run_started records them)
    gate_runs: list[Event] = field(default_factory=list)  # the completion-gate runs recorded

    def feed(self, event: Event) -> None:
        kind = event["event"]
        if kind == "protocol_fallback":  # the first root call was refused for its tools (RLM_PROTOCOL=auto)
            for message in (self.messages[0], self.messages[-1]):
                message["content"] = in_text_words(message["content"])
            self.protocol = TEXT
        elif kind == "final_request":
            self.asked_final = FinalState(event.get("stop_reason") or "max_turns", event.get("why", ""))
        elif kind == "turn":
            self.close_turn()
            self.open_turn(event)
        elif kind == "step":
            self.take_step(event)
        elif kind == "tool_step":  # a call of a model tool beside python (the bash tool): its observation
            self.take_step(event, kernel_step=False)
        elif kind == "answer_withdrawn":  # a completion gate failed: the model was told, its answer withdrawn
            self.close_turn()
            self.messages.append({"role": "user", "content": event["message"]})
            self.answer = None
        elif kind == "gate":
            self.gate_runs.append({k: v for k, v in event.items() if k not in ("event", "seq", "ts")})

    def open_turn(self, event: Event) -> None:
        if self.asked_final is not None:
            self.messages.append({"role": "user", "content": final_request(self.asked_final.why, self.protocol.name)})
            self.final, self.final_turn, self.asked_final = self.asked_final, True, None
        self.turn = int(event["turn"])
        recorded = tuple(ToolCall(c["id"], c["name"], code, c.get("arguments"))
                         for c, code in zip(event["calls"], event.get("code") or [], strict=True))
        completion = Completion(text=event.get("text") or "", tool_calls=recorded, usage=None,
                                model=event.get("model") or "")
        self.calls = self.protocol.calls(completion)
        self.messages.append(self.protocol.assistant_message(completion, self.calls))
        if self.calls:
            self.completion, self.observations = completion, []
        else:
            self.messages.append({"role": "user", "content": self.protocol.nudge})
            self.completion = None

    def take_step(self, event: Event, *, kernel_step: bool = True) -> None:
        while len(self.observations) < len(self.calls) and (fixed := self.result_without_step()) is not None:
            self.observations.append(fixed)
        if len(self.observations) >= len(self.calls):
            raise ResumeInconsistent(f"turn {self.turn} records more steps than python calls; the trajectory is damaged")
        self.observations.append(event["observation"])
        if not kernel_step:
            return
        self.steps.append(event)
        if "answer" in event:
            self.answer = (event["answer"], int(event["turn"]))

    def close_turn(self) -> None:
        """A new turn began: the one before ended, and the model was given its results."""
        if self.completion is None:
            return
        while len(self.observations) < len(self.calls):
            fixed = self.result_without_step()
            if fixed is None:
                raise ResumeInconsistent(f"turn {self.turn} has a python call with no step, yet a later turn began")
            self.observations.append(fixed)
        self.messages.extend(self.protocol.result_messages(self.completion, self.calls, self.observations))
        self.completion = None

    def result_without_step(self) -> str | None:
        """The fixed result of the next call if it runs no step (as Session.run_calls gives it); None for a step."""
        index = len(self.observations)
        call = self.calls[index]
        if self.answer is not None or (self.final_turn and index >= 1):
            return NOT_RUN
        if call.name in self.tools and call.name != "python":
            return None  # its tool_step event holds its observation
        if call.name != "python":
            return no_such_tool(call.name, self.tools)
        return EMPTY_CODE if not call.code.strip() else None


def plan(settings: RLMSettings, path: Path, events: list[Event], context: Context) -> ResumePoint:
    """The point an interrupted run resumes from, or the reason it cannot (ResumeUnsupported / ResumeInconsistent)."""
    started = check_resumable(settings, path, events)
    run_id, kernel = path.parent.name, started["kernel"]
    protocol = protocol_named(started.get("protocol") or "tools")
    shown = first_message(started["question"], context.stats(), protocol.name)
    # A python-bash run changes its workspace by design: its model was told `context` is the corpus as the run
    # started, so the conversation stays true over the changed files, and run_resumed says they changed.
    corpus_changed = shown != started.get("first_message")
    if corpus_changed and started.get("profile") != "python-bash":
        raise ResumeInconsistent(f"the corpus of run {run_id} changed since it started (its shape is not the one the "
                                 "model was shown); resume it over the same files, or ask again with `rlm run`")
    talk = _Conversation(protocol, [{"role": "system", "content": started["system_prompt"]},
                                    {"role": "user", "content": started["first_message"]}],
                         tools=tuple(started.get("tools") or ("python",)))
    for event in events:
        talk.feed(event)
    journal = load(path.parent / JOURNAL_FILENAME)
    completed = len(talk.steps)
    _check_journal(run_id, talk.steps, journal)
    restore = _restore(settings, path.parent, run_id, kernel, talk.steps, journal)
    subcalls = [e for e in events if e["event"] == "subcall"]
    segments = [e for e in events if e["event"] in SEGMENT_EVENTS]
    interrupted = talk.completion is not None and len(talk.observations) < len(talk.calls)
    return ResumePoint(
        run_id=run_id, question=started["question"], kernel=kernel, protocol=talk.protocol, messages=talk.messages,
        turns=talk.turn, completion=talk.completion, calls=talk.calls, observations=tuple(talk.observations),
        subcalls=len(subcalls),
        subcall_seq=max((int(e.get("seq") or 0) for e in subcalls), default=0), elapsed_s=_alive_s(events),
        restore=restore, budget_entries=_earlier_entries(settings, run_id, segments), answer=talk.answer,
        final=talk.final, gate_runs=tuple(talk.gate_runs),
        record={"after_pid": segments[-1].get("pid"), "steps": completed, "restore": restore.mode,
                "checkpoint_seq": completed if restore.mode == "checkpoint" else None,
                "interrupted_call": len(talk.observations) + 1 if interrupted else None,
                "final": talk.final is not None, "children": _recover_children(settings, run_id),
                **({"corpus_changed": True} if corpus_changed else {})},
    )


def _check_journal(run_id: str, steps: list[Event], journal: dict[int, RecordedStep]) -> None:
    if steps and not journal:
        raise ResumeUnsupported(f"run {run_id} has no host-call journal ({JOURNAL_FILENAME}): it was run without "
                                "one (a custom kernel factory, or an older rlmfamily); start it again with `rlm run`")
    for number, step in enumerate(steps, 1):
        recorded = journal.get(number)
        if recorded is None or recorded.end is None or recorded.code_sha256 != digest(step["code"]):
            raise ResumeInconsistent(f"step {number} of run {run_id} is in the trajectory but not (or with other "
                                     f"code) in its journal {JOURNAL_FILENAME}: the two records disagree")


def _restore(settings: RLMSettings, run_dir: Path, run_id: str, kernel: str, steps: list[Event],
             journal: dict[int, RecordedStep]) -> Restore:
    completed = len(steps)
    if kernel == "monty":
        from rlmfamily.kernels.checkpoints import FileCheckpointStore

        kept = FileCheckpointStore(run_dir / "checkpoints").list(run_id)
        if not kept and completed == 0:
            return Restore("fresh", 0, steps=journal)  # killed before the kernel started
        if not kept or kept[-1] != completed:
            raise ResumeInconsistent(
                f"run {run_id} records {completed} steps but its newest Monty checkpoint is "
                f"{'missing' if not kept else f'seq {kept[-1]}'} (one is written after each step): "
                "the trajectory and the checkpoints disagree")
        return Restore("checkpoint", completed, steps=journal)
    for number, step in enumerate(steps, 1):
        if step.get("error_code") in UNREPLAYABLE_CODES or step.get("restored"):
            raise ResumeUnsupported(
                f"the host kernel of run {run_id} cannot be rebuilt faithfully: step {number} was cut off "
                f"({step.get('error_code')}) and a replay would not stop where it stopped. Runs on the monty kernel "
                "(RLM_KERNEL=monty) resume from checkpoints; start this question again with `rlm run`")
    return Restore("replay" if steps else "fresh", completed, codes=tuple(s["code"] for s in steps), steps=journal)


def _alive_s(events: list[Event]) -> float:
    """Seconds the run's processes were alive: from each start (or resume) to the last event it wrote."""
    total, began, last = 0.0, None, None
    for event in events:
        if event["event"] in SEGMENT_EVENTS:
            if began is not None and last is not None:
                total += last - began
            began = float(event.get("ts", 0))
        last = float(event.get("ts", 0))
    if began is not None and last is not None:
        total += last - began
    return max(0.0, total)


def _earlier_entries(settings: RLMSettings, run_id: str, segments: list[Event]) -> list[int]:
    from rlmfamily.budget import BudgetLedger

    ledger = BudgetLedger(settings.budget_path)
    return [i for s in segments if s.get("pid") for i in ledger.entries_admitted_by(run_id, s["pid"], s.get("pid_start"))]


def _recover_children(settings: RLMSettings, run_id: str) -> list[dict[str, Any]]:
    """What each child of the family became while its root was down (see Family.recover)."""
    if not settings.family_path.is_file():
        return []
    from rlmfamily.family.children import Family
    from rlmfamily.family.store import FamilyStore

    if not FamilyStore(settings.family_path).family_exists(run_id):
        return []
    return Family.open(settings, run_id).recover()
