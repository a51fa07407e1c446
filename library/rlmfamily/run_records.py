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
    RunNotFinished,
    RunRunning,
)
from rlmfamily.family import procs
from rlmfamily.journal import FILENAME as JOURNAL_FILENAME
from rlmfamily.journal import RecordedStep, Restore, digest, load
from rlmfamily.prompts import final_request, first_message, follow_up, in_text_words
from rlmfamily.protocol import TEXT, Protocol, protocol_named
from rlmfamily.providers.base import Completion, ToolCall, message_chars
from rlmfamily.resumption import FinalState, ResumePoint
from rlmfamily.settings import RLMSettings
from rlmfamily.trajectory import lock_trajectory

Event = dict[str, Any]
SEGMENT_EVENTS = ("run_started", "run_resumed", "follow_up")
UNREPLAYABLE_CODES = ("timeout", "killed")  # a step cut off where the clock or a kill said: not reproducible
SUMMARY_ANSWER_CHARS = 400  # of a question or an answer quoted in a compacted conversation's summary
SUMMARY_LINE_CHARS = 100  # of a step's first line quoted there
SUMMARY_RESERVE_CHARS = 300  # of follow_up_summary_chars left for the summary's headings and "left out" notes
# The tool results of calls that run no step (the session gives them; the conversation's rebuild gives them again).
NOT_RUN = "[not run: the run is ending]"
EMPTY_CODE = "[error: empty code; send Python source in the code argument]"


def no_such_tool(name: str, tools: Sequence[str] = ("python",)) -> str:
    if tuple(tools) == ("python",):
        return f"[error: there is no tool {name!r}; the only tool is python]"
    return f"[error: there is no tool {name!r}; the tools are {', '.join(tools)}]"


# ---------- checks ----------


def last_question(events: list[Event]) -> list[Event]:
    """The events of the run's last question: from its last ``follow_up`` on (all of them without one)."""
    starts = [i for i, e in enumerate(events) if e["event"] == "follow_up"]
    return events[starts[-1]:] if starts else events


def check_resumable(settings: RLMSettings, path: Path, events: list[Event], *, finished: bool = False) -> Event:
    """The run's ``run_started``, once the run is known to be a root that no process runs, whose last question is
    unfinished (``rlm resume``) or, with ``finished=True``, finished (a follow-up question)."""
    started = events[0] if events and events[0]["event"] == "run_started" else None
    run_id = path.parent.name
    if started is None:
        raise ResumeInconsistent(f"{path} does not begin with run_started; it is not a whole trajectory")
    ended = [e for e in last_question(events) if e["event"] == "run_finished"]
    if ended and not finished:
        raise RunFinished(f"run {run_id} already finished ({ended[-1].get('stop_reason')}); "
                          f"`rlm show {run_id}` shows it. Ask it a follow-up with `rlm ask {run_id} QUESTION`, "
                          "or ask again with `rlm run`")
    if finished and not ended:
        raise RunNotFinished(f"run {run_id} has not finished its question; a follow-up continues a finished run. "
                             f"Resume it first (`rlm resume {run_id}`), or wait for it")
    if settings.family_path.is_file():
        from rlmfamily.family.store import FamilyStore

        member = FamilyStore(settings.family_path).run(run_id)
        if member is not None and member.root_id != run_id:
            if finished:
                raise ResumeUnsupported(f"run {run_id} is a child of {member.root_id}; a child's follow-up is "
                                        f"`rlm follow-up {member.root_id} {member.agent_id} PROMPT`")
            raise ResumeUnsupported(f"run {run_id} is a child of {member.root_id}; a child is not resumed on its own. "
                                    f"Resume its root (`rlm resume {member.root_id}`), which settles its children")
    owner = [e for e in events if e["event"] in SEGMENT_EVENTS][-1]
    with path.open("a") as probe:  # the owner holds the writer's lock as long as it lives
        lock_trajectory(probe.fileno(), path)
    # A finished question's process may live on (this one, asking a follow-up): the lock alone says no one writes.
    if not finished and owner.get("pid") and procs.alive(owner["pid"], owner.get("pid_start")):
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
        elif kind == "follow_up":  # a further question after a finished one: as Session.follow_up built it
            self.close_turn()
            self.asked_final = self.final = None
            self.final_turn, self.answer = False, None
            self.messages = follow_up_messages(self.messages, event["message"], compacted="compacted" in event)

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
    corpus_changed = _corpus_changed(started, context)
    if corpus_changed and started.get("profile") != "python-bash":
        raise ResumeInconsistent(f"the corpus of run {path.parent.name} changed since it started (its shape is not "
                                 "the one the model was shown); resume it over the same files, or ask again with "
                                 "`rlm run`")
    talk, restore = _rebuild(settings, path, events, started)
    run_id, question = path.parent.name, last_question(events)
    subcalls = [e for e in events if e["event"] == "subcall"]
    segments = [e for e in question if e["event"] in SEGMENT_EVENTS]
    interrupted = talk.completion is not None and len(talk.observations) < len(talk.calls)
    asked = question[0] if question[0]["event"] == "follow_up" else started
    return ResumePoint(
        run_id=run_id, question=asked["question"], kernel=started["kernel"], protocol=talk.protocol,
        messages=talk.messages, turns=talk.turn, completion=talk.completion, calls=talk.calls,
        observations=tuple(talk.observations), subcalls=sum(e["event"] == "subcall" for e in question),
        subcall_seq=max((int(e.get("seq") or 0) for e in subcalls), default=0), elapsed_s=_alive_s(question),
        restore=restore, budget_entries=_earlier_entries(settings, run_id, segments), answer=talk.answer,
        final=talk.final, gate_runs=tuple(talk.gate_runs), turns_before=int(asked.get("turn") or 0),
        record={"after_pid": segments[-1].get("pid"), "steps": restore.completed, "restore": restore.mode,
                "checkpoint_seq": restore.checkpoint_seq if restore.mode == "checkpoint" else None,
                **({"steps_run_again": len(restore.codes)} if restore.mode == "checkpoint" and restore.codes else {}),
                **({"checkpoint_dropped": restore.completed + 1} if restore.ahead else {}),
                "interrupted_call": len(talk.observations) + 1 if interrupted else None,
                "final": talk.final is not None, "children": _recover_children(settings, run_id),
                **({"corpus_changed": True} if corpus_changed else {})},
    )


def follow_up_point(settings: RLMSettings, path: Path, events: list[Event], context: Context,
                    question: str, *, kept_namespace: bool = False) -> ResumePoint:
    """Where a further question to a finished root run starts: its conversation with the question added (compacted
    past ``follow_up_compact_chars``), its namespace restored from its checkpoint or journal (or, ``kept_namespace``,
    the live kernel's: ``Session(keep_kernel=True)``), no turn played yet."""
    started = check_resumable(settings, path, events, finished=True)
    talk, restore = _rebuild(settings, path, events, started, restore=not kept_namespace)
    talk.close_turn()
    run_id = path.parent.name
    asked = [e for e in events if e["event"] == "follow_up"]
    corpus_changed = _corpus_changed(started, context)
    text = follow_up(question, talk.protocol.name)
    if corpus_changed:
        text += f"\n\nThe corpus changed since the run started; its shape now: {context.stats()}"
    compacted = None
    if message_chars(talk.messages) > settings.follow_up_compact_chars:
        compacted = compaction(settings, run_id, events, talk.messages)
        text = compacted["summary"] + "\n\n" + text
    messages = follow_up_messages(talk.messages, text, compacted=compacted is not None)
    return ResumePoint(
        run_id=run_id, question=question, kernel=started["kernel"], protocol=talk.protocol, messages=messages,
        turns=talk.turn, completion=None, calls=(), observations=(), subcalls=0,
        subcall_seq=max((int(e.get("seq") or 0) for e in events if e["event"] == "subcall"), default=0),
        elapsed_s=0.0, restore=restore, budget_entries=[], gate_runs=tuple(talk.gate_runs), turns_before=talk.turn,
        record={"number": len(asked) + 1, "question": question, "message": text, "steps": restore.completed,
                "restore": restore.mode, **({"compacted": compacted} if compacted else {}),
                **({"corpus_changed": True} if corpus_changed else {})},
    )


def follow_up_messages(messages: list[dict[str, Any]], text: str, *, compacted: bool) -> list[dict[str, Any]]:
    """The conversation a follow-up continues: the question added, or (compacted) the system prompt and the first
    message, then one message holding the summary of the rest and the question."""
    if compacted:
        return [dict(messages[0]), dict(messages[1]), {"role": "user", "content": text}]
    return [*messages, {"role": "user", "content": text}]


def compaction(settings: RLMSettings, run_id: str, events: list[Event], messages: list[dict[str, Any]]) -> Event:
    """A summary of a long conversation from its records: the questions and answers, each step's first line and the
    history entry holding its whole output, the newest of each kept within ``follow_up_summary_chars`` (at most half
    of it for the questions). Nothing is deleted: the trajectory and the history keep all of it, and the summary
    says where."""
    limit = settings.follow_up_summary_chars
    head = (f"[The conversation so far ({len(messages) - 2} messages, {message_chars(messages):,} characters) was "
            f"compacted past RLM_FOLLOW_UP_COMPACT_CHARS ({settings.follow_up_compact_chars:,}) into this summary. "
            "Nothing was deleted: each step's whole output is in the history (history.read(id), history.search(...)), "
            f"and the whole conversation is in the run's trajectory (`rlm show {run_id}`). Your namespace is as "
            "you left it.]")
    answers = [e for e in events if e["event"] == "run_finished"]
    questions = [e for e in events if e["event"] in ("run_started", "follow_up")]
    qa = [f"- Q{n}: {_clip(q.get('question', ''))}\n  A{n}: {_clip(_answer_of(a))}"
          for n, (q, a) in enumerate(zip(questions, answers, strict=False), 1)]
    steps = [_step_line(e) for e in events if e["event"] == "step"]
    room = limit - len(head) - SUMMARY_RESERVE_CHARS
    qa_kept = _newest(qa, room // 2)
    steps_kept = _newest(steps, room - sum(len(line) + 1 for line in qa_kept))
    body = [head, "Questions and answers so far:"]
    if len(qa_kept) < len(qa):
        body.append(f"- ({len(qa) - len(qa_kept)} earlier questions left out of this summary; the trajectory has them)")
    body += [*qa_kept, "Steps (first line of the code; newest last):"]
    if len(steps_kept) < len(steps):
        body.append(f"- ({len(steps) - len(steps_kept)} earlier steps left out of this summary; the trajectory has "
                    "them)")
    summary = "\n".join(body + steps_kept)
    assert len(summary) <= limit, "the summary keeps within follow_up_summary_chars (its notes: SUMMARY_RESERVE_CHARS)"
    return {"messages": len(messages) - 2, "chars": message_chars(messages), "summary": summary}


def _newest(lines: list[str], room: int) -> list[str]:
    """The newest of ``lines`` that fit in ``room`` characters (one newline each), in their order."""
    kept: list[str] = []
    for line in reversed(lines):
        if len(line) + 1 > room:
            break
        kept.insert(0, line)
        room -= len(line) + 1
    return kept


def _answer_of(finished: Event) -> str:
    return finished.get("answer") or f"(no answer: {finished.get('stop_reason')})"


def _step_line(step: Event) -> str:
    code = (step.get("code") or "").strip()
    outcome = "ok" if step.get("ok") else f"error {step.get('error_code')}"
    where = f", history {step['history_id']}" if step.get("history_id") is not None else ""
    first_line = _clip(code.splitlines()[0] if code else "", SUMMARY_LINE_CHARS)
    return f"- turn {step.get('turn')}: `{first_line}` -> {outcome}{where}"


def _clip(text: str, limit: int | None = None) -> str:
    limit = limit or SUMMARY_ANSWER_CHARS
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _corpus_changed(started: Event, context: Context) -> bool:
    # A python-bash run changes its workspace by design: its model was told `context` is the corpus as the run
    # started, so the conversation stays true over the changed files, and run_resumed says they changed.
    protocol = protocol_named(started.get("protocol") or "tools")
    return first_message(started["question"], context.stats(), protocol.name) != started.get("first_message")


def _rebuild(settings: RLMSettings, path: Path, events: list[Event], started: Event, *,
             restore: bool = True) -> tuple[_Conversation, Restore]:
    """The conversation as the session built it, and how the namespace comes back (``kept``: it never left)."""
    run_id, kernel = path.parent.name, started["kernel"]
    protocol = protocol_named(started.get("protocol") or "tools")
    talk = _Conversation(protocol, [{"role": "system", "content": started["system_prompt"]},
                                    {"role": "user", "content": started["first_message"]}],
                         tools=tuple(started.get("tools") or ("python",)))
    for event in events:
        talk.feed(event)
    if not restore:
        return talk, Restore("kept", len(talk.steps))
    journal = load(path.parent / JOURNAL_FILENAME)
    _check_journal(run_id, talk.steps, journal)
    return talk, _restore(settings, path.parent, run_id, kernel, talk.steps, journal)


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
        if kept and completed >= 1 and kept[-1] == completed - 1:
            # The crash came after the last step's trajectory line and before its record was stored (the session
            # writes the line without waiting for the record): that step runs again from the record before it.
            return Restore("checkpoint", completed, codes=(steps[-1]["code"],), steps=journal)
        if kept and kept[-1] == completed + 1 and completed in kept and completed + 1 in journal:
            # The crash came after a step's record and before its trajectory line: the model never saw that step,
            # which runs again as the one cut off, from the record before it (the kernel keeps the chain before
            # the newest); the record ahead is dropped once that one is loaded.
            return Restore("checkpoint", completed, steps=journal, ahead=True)
        if not kept or kept[-1] != completed:
            raise ResumeInconsistent(
                f"run {run_id} records {completed} steps but its newest Monty checkpoint is "
                f"{'missing' if not kept else f'seq {kept[-1]}'} (one is written after each step, and only the "
                "last step's may be missing): the trajectory and the checkpoints disagree")
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
