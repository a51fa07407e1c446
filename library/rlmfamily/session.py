"""The root session: a model with one tool, ``python``, over a persistent namespace (a Kernel).

The model sends its code as calls of the tool, or as fenced blocks in plain text
(``RLM_PROTOCOL``, rlmfamily/protocol.py).

One ``run(question)``: the model sees the question and the corpus's shape, runs
code step by step, sees bounded observations (head and tail, with a history id
for the rest), and ends the run by calling ``final_answer(value)`` from code.
When turns, budget or time run out, the model is asked once for a final answer
and the run records why it stopped (``stop_reason``). A root run with completion
gates (rlmfamily/gates) runs them when the model answers: the answer stands only
when every gate passes, and the run ends with a ``verdict`` (``accepted``,
``gates_failed``, ``not_verified``). Every root turn and
sub-call draws on the run's one budget; every run writes a trajectory, and a
root run a journal of its host calls (rlmfamily/journal.py) from which
``rlm resume`` continues it after a crash (rlmfamily/resume.py, ``Session.resume``).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rlmfamily.budget import FINAL_PURPOSE, Budget, BudgetLedger, BudgetLimits, BudgetSnapshot
from rlmfamily.context import Context
from rlmfamily.composition import KERNEL_NAMES, KernelFactory, default_extensions, default_kernel_factory, open_environment
from rlmfamily.errors import BudgetError, ProviderError, RLMError, SettingsInvalid
from rlmfamily.extensions import Environment, Extension, ExtensionFactory, RunInfo
from rlmfamily.family import procs
from rlmfamily.gates.runner import GateKeeper, gate_workspace
from rlmfamily.gates.verdict import verdict_of
from rlmfamily.history import History
from rlmfamily.journal import FILENAME as JOURNAL_FILENAME
from rlmfamily.journal import JournaledKernel
from rlmfamily.kernels.base import Kernel, StepResult
from rlmfamily.llm import SubcallRecord, SubcallRunner
from rlmfamily.memo import open_memo
from rlmfamily.namespace import PRELUDE, AnswerBox, Bridge, _guest_errors
from rlmfamily.prompts import NO_OUTPUT_HINT, final_request, first_message, follow_up, in_text_words, system_prompt
from rlmfamily.protocol import TEXT, TOOLS, Protocol, protocol_named, refused_tools
from rlmfamily.providers.base import Completion, Provider, ToolCall, estimate_tokens, message_chars, usd_cost_known
from rlmfamily.settings import RLMSettings, load_settings
from rlmfamily.resumption import ResumePoint
from rlmfamily.run_records import EMPTY_CODE, NOT_RUN, follow_up_point, no_such_tool
from rlmfamily.tools import Tool, ToolsExtension, check_tools, once_only_functions, repeat_safe_functions
from rlmfamily.trajectory import FILENAME, PREVIEW_CHARS, TrajectoryWriter, read_trajectory

STOP_REASONS = ("answered", "max_turns", "budget_exhausted", "deadline", "error")
ENTRY_TITLE_CHARS = 80  # of a history entry's title: the first line of the code, or the sub-call's prompt
MARKER_ROOM_CHARS = 160  # kept free in a bounded observation for the "[... omitted ...]" line


def receipt_of(text: str, preview_chars: int, history_id: int | None) -> str:
    """RLM_OBSERVATION_STRATEGY=receipts: how much a step printed, its first characters, and where the rest is."""
    if len(text) <= preview_chars:
        return text
    where = (f"history.read({history_id}, {preview_chars}, size) returns the rest" if history_id is not None
             else "the rest was not stored")
    return f"{text[:preview_chars]}\n[receipt: {len(text):,} characters in all, {preview_chars:,} shown; {where}]"

Event = dict[str, Any]


@dataclass(frozen=True)
class RunResult:
    run_id: str
    answer: str | None
    stop_reason: str  # one of STOP_REASONS
    turns: int
    subcalls: int
    error: str | None
    trajectory_path: Path
    budget: BudgetSnapshot
    corpus_bytes: int
    root_chars_sent: int  # characters sent to the root model, summed over every root call
    root_chars_last: int  # characters of the largest single root request
    duration_s: float
    extra: dict[str, Any] = field(default_factory=dict)  # what extensions add (e.g. "children")
    subcalls_cached: int = 0  # of ``subcalls``, answered from the family's memo (no call, no tokens)
    # accepted (every completion gate passed), gates_failed, or not_verified (no gates, blocked, could not run);
    # why: extra["verdict_reason"], the gate runs: extra["gates"], what blocked acceptance: extra["blocked_by"].
    verdict: str = "not_verified"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["trajectory_path"] = str(self.trajectory_path)
        data["budget"] = self.budget.to_dict()
        return data


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def bounded(text: str, max_chars: int, tail_chars: int, history_id: int | None, read_cap: int) -> str:
    """Head and tail of ``text`` within ``max_chars``, naming the history entry that holds the middle."""
    if len(text) <= max_chars:
        return text
    head_chars = max(0, max_chars - tail_chars - MARKER_ROOM_CHARS)
    omitted_start = head_chars
    omitted = len(text) - head_chars - tail_chars
    where = (
        f"history.read({history_id}, {omitted_start}, {min(omitted, read_cap)}) returns them"
        if history_id is not None else "they were not stored"
    )
    return f"{text[:head_chars]}\n[... {omitted:,} characters omitted; {where}]\n{text[len(text) - tail_chars:]}"


class Session:
    """A root session over one corpus. ``run(question)`` may be called once per Session."""

    def __init__(
        self,
        *,
        context: Context,
        provider: Provider,
        settings: RLMSettings | None = None,
        kernel: str | None = None,
        kernel_factory: KernelFactory | None = None,
        model: str | None = None,
        run_id: str | None = None,
        on_event: Callable[[Event], None] | None = None,
        root_id: str | None = None,
        agent_id: str | None = None,
        extensions: Sequence[ExtensionFactory] | None = None,
        tools: Sequence[Tool] = (),
        keep_kernel: bool = False,
    ) -> None:
        self.settings = settings or load_settings()
        self.context = context
        self.provider = provider
        self.kernel_name = kernel or self.settings.kernel
        if self.kernel_name not in KERNEL_NAMES:
            raise SettingsInvalid(f"unknown kernel {self.kernel_name!r}: use 'host', 'monty' or 'container' (RLM_KERNEL)",
                                  setting="kernel")
        self.kernel_factory: KernelFactory = kernel_factory or default_kernel_factory
        self.model = model
        self.run_id = run_id or new_run_id()
        # A member of a family draws on its root's allowance (root_id) and keeps its own history (agent_id).
        self.root_id = root_id or self.run_id
        self.agent_id = agent_id or self.run_id
        self.extension_factories = list(default_extensions() if extensions is None else extensions)
        # Custom tools (rlmfamily/tools.py): host functions shown to the model, refused here before anything runs.
        self.tools = check_tools(tools, self.settings.host_call_timeout_s)
        if self.tools:
            self.extension_factories.append(ToolsExtension.factory(self.tools))
        self.messages: list[dict[str, Any]] = []  # the conversation, kept for a follow-up
        # keep_kernel: a root's kernel (and container) outlives each question, so follow_up() continues its live
        # namespace instead of restoring it from the records; close() (or the with block) releases it.
        self.keep_kernel = keep_kernel and self.root_id == self.run_id
        self._kept: _KeptKernel | None = None
        self.on_event = on_event
        self._used = False
        if self.settings.gates and self.root_id == self.run_id:
            gate_workspace(self.settings, context)  # a gated run without a workspace is refused before it starts
        model_id = model or getattr(provider, "default_model", None)
        if self.settings.max_usd is not None and model_id and not usd_cost_known(provider, model_id):
            # Without a price every call's cost is unknown, which would block a USD limit after one call.
            raise SettingsInvalid(
                f"max_usd is set but model {model_id!r} has no price; add it to RLM_PRICES_USD_PER_MTOK "
                "or RLM_PRICE_TABLE_FILE, or drop the USD limit",
                setting="prices_usd_per_mtok",
            )

    def run(self, question: str, *, prior_messages: Sequence[dict[str, Any]] | None = None) -> RunResult:
        """Answer ``question``; with ``prior_messages`` (a finished run's conversation) it is a follow-up."""
        if self._used:
            raise RLMError("a Session runs once; make a new Session for a new question")
        self._used = True
        run = _Run.open(self, question, prior_messages)

        def play() -> None:
            run.start(follow_up=bool(prior_messages))
            run.play_turns()

        return self._drive(run, play)

    def resume(self, point: ResumePoint) -> RunResult:
        """Continue an interrupted root run from ``point``, which rlmfamily/resume.py builds from its records.

        The namespace is restored first; if that is refused (or the kernel cannot start) nothing is appended
        to the run's records and the error is raised, so the run can still be resumed later. Then the
        interrupted turn's calls that have no observation run (the one cut off by the crash runs again,
        its recorded host calls answered from the journal), and the run goes on as ``run`` would.
        """
        if self._used:
            raise RLMError("a Session runs once; make a new Session to resume a run")
        self._used = True
        run = _Run.open(self, point.question, point.messages, resumed=point)
        try:
            run.start(follow_up=True)
        except RLMError:
            run.abandon()
            raise
        run.answer.withdraw()  # a host kernel's replay set earlier questions' answers again: the records say which
        if point.answer is not None:
            run.answer.set(*point.answer)
        run.write_resumed()

        def play() -> None:
            if point.completion is not None:  # the last turn's calls, from the first without a result
                run.run_calls(point.completion, point.calls, done=point.observations,
                              max_steps=1 if point.final is not None else None)
            if point.final is not None and point.completion is not None:  # it was answering its final request
                run.stop_reason, run.why = point.final.stop_reason, point.final.why
                run.judge_final(point.completion)
                if run.answer.value is not None:
                    run.answer_stands(final=True)
                return
            if run.answer.value is not None and run.answer_stands():
                run.stop_reason = "answered"
            else:
                run.play_turns()

        return self._drive(run, play)

    def follow_up(self, question: str) -> RunResult:
        """Ask the finished root run ``run_id`` (this session's, or a past one's: ``Session(run_id=...)``) a further
        question, as the next turns of the same conversation over the same namespace.

        The conversation and namespace come from the run's records (rlmfamily/run_records.py): the namespace from
        the Monty checkpoint after its last step, or (host, container) by replaying its journal. Past
        ``follow_up_compact_chars`` the conversation is compacted into a summary naming the history entries and the
        trajectory that keep all of it. The question runs under the family's one budget, with ``max_turns`` turns of
        its own, and ends with its own ``run_finished``; the earlier ones stay as they are. May be called again.
        """
        if self.root_id != self.run_id:
            raise RLMError("a child's follow-up is rlm.follow_up(child, prompt) from its parent, or `rlm follow-up`")
        if not isinstance(question, str) or not question.strip():
            raise SettingsInvalid("a follow-up needs a question: session.follow_up('what next?')")
        path = self.settings.runs_dir / self.run_id / FILENAME
        point = follow_up_point(self.settings, path, read_trajectory(path), self.context, question,
                                kept_namespace=self._kept is not None)
        if point.kernel != self.kernel_name:  # its namespace lives in that kernel's checkpoints or journal
            raise SettingsInvalid(f"run {self.run_id} ran on the {point.kernel} kernel; ask its follow-up on the same "
                                  f"kernel: Session(kernel={point.kernel!r}) (RLM_KERNEL)", setting="kernel")
        run = _Run.open(self, question, point.messages, resumed=point)
        try:
            run.start(follow_up=True)
        except RLMError:
            run.abandon()
            raise
        run.answer.withdraw()  # a host kernel's replay set the earlier question's answer again
        run.trajectory.write("follow_up", turn=run.turn, pid=os.getpid(), pid_start=procs.start_time(os.getpid()),
                             **point.record)
        run.emit({"event": "follow_up", "run_id": self.run_id, "turn": run.turn, "number": point.record["number"],
                  "max_turns": run.last_turn, "budget": run.budget.snapshot().to_dict()})
        self._used = True
        return self._drive(run, run.play_turns)

    def _drive(self, run: _Run, play: Callable[[], None]) -> RunResult:
        try:
            try:
                play()
            except RLMError as exc:  # provider, budget, kernel: the run ends with its error recorded
                run.stop_reason, run.error = "error", f"{exc.code}: {exc.message}"
                self._kept = None  # not kept after a failure (the run closes it): a follow-up restores from the records
            finally:
                run.close_kernel()
            return run.close()
        finally:
            run.close_environment()  # after the extensions: their last commands (gates, jobs) run in it

    def close(self) -> None:
        """Release the kernel and container kept for follow-ups (``keep_kernel``); nothing to do without one."""
        kept, self._kept = self._kept, None
        if kept is not None:
            try:
                kept.kernel.close()
            finally:
                if kept.environment is not None:
                    kept.environment.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _emit(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)


def endpoint_of(provider: Provider) -> dict[str, Any] | None:
    """Whom a run talks to, as ``run_started`` records it for ``rlm resume``: the provider's kind, base URL and the
    NAME of its key's variable, never the key. None for a provider with no endpoint (the scripted one)."""
    base_url = getattr(provider, "base_url", None)
    if base_url is None:
        return None
    return {"provider": getattr(provider, "name", type(provider).__name__), "base_url": str(base_url),
            "api_key_env": getattr(provider, "api_key_env", None)}


@dataclass
class _KeptKernel:
    """A root's kernel kept between its questions (``Session(keep_kernel=True)``), with its container. The kernel was
    started with trampolines into ``functions``, which each question fills with its own host functions."""

    kernel: Kernel
    environment: Environment | None
    functions: dict[str, Callable[..., Any]]


def _trampoline(functions: dict[str, Callable[..., Any]], name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return functions[name](*args, **kwargs)

    call.__name__ = name
    return call


@dataclass
class _Run:
    """One run of a Session: its budget, history, trajectory, conversation and counters, and its moves."""

    session: Session
    question: str
    started: float  # time.monotonic()
    trajectory: TrajectoryWriter
    budget: Budget
    history: History
    stats: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)
    answer: AnswerBox = field(default_factory=AnswerBox)
    turn: int = 0
    turns_before: int = 0  # turns of the run's earlier questions: this one's max_turns counts from here
    subcall_count: int = 0
    root_chars_sent: int = 0
    root_chars_last: int = 0
    stop_reason: str | None = None
    why: str = ""  # why the loop stopped, for the final request
    error: str | None = None
    kernel: Kernel | None = None
    environment: Environment | None = None  # the run's container (RLM_KERNEL=container), None on the host
    extensions: list[Extension] = field(default_factory=list)
    protocol: Protocol = TOOLS  # how code and observations travel (RLM_PROTOCOL, rlmfamily/protocol.py)
    model_tools: dict[str, Any] = field(default_factory=dict)  # tools beside python, by name (extensions')
    chars_shown: int = 0  # characters of those outputs given to the model (kept_chars: no headers or markers)
    chars_produced: int = 0  # characters those steps and tool calls produced (the history keeps them all)
    resumed: ResumePoint | None = None  # a resumed run: where its records left it
    gates: GateKeeper | None = None  # a root run's completion gates (RLM_GATES), None without
    blocked_by: list[str] = field(default_factory=list)  # what keeps the run from being accepted, by the extensions
    subcalls: SubcallRunner = field(init=False)
    bridge: Bridge = field(init=False)
    _subcall_lock: threading.Lock = field(default_factory=threading.Lock)

    # ---------- open ----------

    @classmethod
    def open(cls, session: Session, question: str, prior_messages: Sequence[dict[str, Any]] | None, *,
             resumed: ResumePoint | None = None) -> _Run:
        """The run's stores, bridge and first messages (a resumed run's: its conversation and counters)."""
        settings = session.settings
        ledger = BudgetLedger(settings.budget_path)
        # A family member never brings its own allowance: it draws on the root's, as the root set it.
        limits = (BudgetLimits(settings.max_calls, settings.max_tokens, settings.max_usd)
                  if session.root_id == session.run_id else ledger.limits(session.root_id))
        run = cls(
            session=session, question=question, started=time.monotonic() - (resumed.elapsed_s if resumed else 0.0),
            trajectory=TrajectoryWriter(settings.runs_dir / session.run_id / FILENAME),
            budget=Budget(ledger, session.root_id, limits, member=session.run_id,
                          final_reserve_tokens=settings.final_reserve_tokens),
            history=History(settings.history_path, session.agent_id, max_read_chars=settings.max_history_read_chars,
                            max_hits=settings.max_history_hits, max_query_words=settings.max_history_query_words),
            stats=session.context.stats(), protocol=protocol_named(settings.protocol),
        )
        run.subcalls = SubcallRunner(
            provider=session.provider, budget=run.budget, settings=settings, on_record=run.record_subcall,
            model=settings.subcall_model, resolve_context=lambda value: run.bridge.resolve_context(value),
            describe_context=lambda value: run.bridge.sources_of(value),
            memo=open_memo(settings, root_id=session.root_id, run_id=session.run_id),
        )
        run.bridge = Bridge(context=session.context, subcalls=run.subcalls, history=run.history, answer=run.answer,
                            max_answer_chars=settings.max_answer_chars, current_turn=lambda: run.turn)
        if resumed is None:
            run.messages = run.first_messages(prior_messages)
        else:
            run.continue_from(resumed)
        session.messages = run.messages
        return run

    def continue_from(self, point: ResumePoint) -> None:
        """The conversation and counters of the run's earlier processes, as its records left them."""
        self.resumed = point
        self.messages = [dict(m) for m in point.messages]
        self.turn = point.turns
        self.turns_before = point.turns_before
        self.subcall_count = point.subcalls
        self.subcalls.continue_from(admitted=point.subcalls, seq=point.subcall_seq)
        self.subcalls.current_turn = point.turns
        self.budget.entry_ids.extend(point.budget_entries)
        self.protocol = point.protocol
        if point.answer is not None:
            self.answer.set(*point.answer)

    @property
    def settings(self) -> RLMSettings:
        return self.session.settings

    @property
    def last_turn(self) -> int:
        """The last turn this question may play (turns are numbered across a run's questions): what progress shows."""
        return self.turns_before + self.settings.max_turns

    @property
    def deadline(self) -> float:
        return self.started + self.settings.max_run_s

    def first_messages(self, prior_messages: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
        if prior_messages:
            messages = [dict(m) for m in prior_messages]
            messages.append({"role": "user", "content": follow_up(self.question, self.protocol.name)})
            return messages
        settings = self.settings
        limits_shown = {
            "turns": settings.max_turns, "sub-calls": settings.max_subcalls,
            "observation chars": settings.max_observation_chars, "seconds per step": settings.step_timeout_s,
            "sub-call prompt chars": settings.max_prompt_chars,
        }
        return [
            {"role": "system", "content": system_prompt(self.session.kernel_name, limits_shown, self.protocol.name)},
            {"role": "user", "content": first_message(self.question, self.stats, self.protocol.name)},
        ]

    def write_started(self) -> None:
        session, settings = self.session, self.settings
        self.trajectory.write(
            "run_started", run_id=session.run_id, question=self.question, kernel=session.kernel_name,
            provider=getattr(session.provider, "name", type(session.provider).__name__),
            endpoint=endpoint_of(session.provider),
            model=session.model or getattr(session.provider, "default_model", None), corpus=self.stats,
            protocol=settings.protocol, profile=settings.profile, observation_strategy=settings.observation_strategy,
            tools=["python", *self.model_tools],
            limits={"max_turns": settings.max_turns, "max_calls": settings.max_calls,
                    "max_tokens": settings.max_tokens, "max_usd": settings.max_usd,
                    "max_subcalls": settings.max_subcalls, "max_observation_chars": settings.max_observation_chars},
            first_message=self.messages[-1]["content"], system_prompt=self.messages[0]["content"],
            pid=os.getpid(), pid_start=procs.start_time(os.getpid()),
            **({"gates": [g.model_dump() for g in self.gates.gates]} if self.gates else {}),
            **({"custom_tools": [t.name for t in session.tools]} if session.tools else {}),
        )
        self.emit({"event": "run_started", "run_id": session.run_id, "max_turns": settings.max_turns,
                   "budget": self.budget.snapshot().to_dict()})

    def write_resumed(self) -> None:
        assert self.resumed is not None
        self.trajectory.write("run_resumed", turn=self.turn, **self.resumed.record, pid=os.getpid(),
                              pid_start=procs.start_time(os.getpid()))
        self.emit({"event": "run_resumed", "run_id": self.session.run_id, "turn": self.turn,
                   "max_turns": self.last_turn, "budget": self.budget.snapshot().to_dict()})

    def start(self, *, follow_up: bool) -> None:
        """Build the extensions, then the kernel with every host function and prelude."""
        session = self.session
        run_dir = self.settings.runs_dir / session.run_id
        kept = session._kept  # noqa: SLF001 - the run is the session's own
        # The run's container (RLM_KERNEL=container) exists before anything that runs code or commands in it.
        self.environment = kept.environment if kept is not None else open_environment(
            session.kernel_name, self.settings, run_id=session.run_id, context=session.context, run_dir=run_dir)
        info = RunInfo(
            run_id=session.run_id, root_id=session.root_id, agent_id=session.agent_id, settings=self.settings,
            context=session.context, provider=session.provider, kernel=session.kernel_name, model=session.model,
            budget=self.budget, history=self.history, trajectory=self.trajectory, deadline=self.deadline,
            emit=self.emit, current_turn=lambda: self.turn, environment=self.environment,
        )
        functions = self.bridge.functions()
        for factory in session.extension_factories:
            extension = factory(info)
            self.extensions.append(extension)
            functions.update({name: _guest_errors(fn) for name, fn in extension.functions().items()})
        for extension in self.extensions:
            self.model_tools.update(getattr(extension, "model_tools", None) or {})
        if self.settings.gates and session.root_id == session.run_id:  # a child's work is judged by its root's gates
            self.gates = GateKeeper(info, self.settings.gates, earlier=self.resumed.gate_runs if self.resumed else ())
            functions.update({name: _guest_errors(fn) for name, fn in self.gates.functions().items()})
        if self.model_tools and self.protocol.tools is not None:
            self.protocol = replace(self.protocol, tools=[*self.protocol.tools,
                                                          *(t.schema for t in self.model_tools.values())])
        if not follow_up:
            self.messages[0]["content"] += "".join(e.notes for e in self.extensions) + (self.gates.notes
                                                                                         if self.gates else "")
        if self.resumed is None:
            self.write_started()  # after the notes: it records the system prompt as the model sees it
        if kept is not None:  # the live namespace of the last question: its host functions become this run's
            kept.functions.clear()
            kept.functions.update(functions)
            self.kernel = kept.kernel
            return
        in_environment = {"environment": self.environment} if self.environment is not None else {}
        kernel = session.kernel_factory(session.kernel_name, self.settings, run_dir, session.run_id, **in_environment)
        if session.root_id == session.run_id:  # a root can be resumed: its host calls are journaled
            kernel = JournaledKernel(kernel, run_dir / JOURNAL_FILENAME,
                                     host_call_timeout_s=self.settings.host_call_timeout_s,
                                     restore=self.resumed.restore if self.resumed else None,
                                     live_on_replay=repeat_safe_functions(session.tools),
                                     once_only=once_only_functions(session.tools))
        self.kernel = kernel
        if session.keep_kernel:
            table = dict(functions)
            functions = {name: _trampoline(table, name) for name in table}
            session._kept = _KeptKernel(kernel, self.environment, table)  # noqa: SLF001
        self.kernel.start(functions, PRELUDE + "".join(e.prelude for e in self.extensions)
                          + (self.gates.prelude if self.gates else ""))

    def play_turns(self) -> None:
        """Root turns until the answer, or a limit; then the final request."""
        while (entry := self.admit_turn()) is not None:
            self.play_turn(entry)
            if self.answer.value is not None and self.answer_stands():
                self.stop_reason = "answered"
                break
        if self.stop_reason != "answered":
            self.ask_for_final()
            if self.answer.value is not None:
                self.answer_stands(final=True)

    def answer_stands(self, *, final: bool = False) -> bool:
        """Check the answer just given against the completion gates; False: it was withdrawn and the run goes on.

        Without gates it stands. With them, what must be resolved first is (the extensions' ``finish``: children,
        required remote work); if something still blocks acceptance the answer stands, not verified. Otherwise every
        gate runs: all pass, it stands; one fails, the model is told and the answer withdrawn, unless this is the
        answer to the final request (the run is ending: it stands, its gates failed). Gates that could not run leave
        it standing, not verified.
        """
        if self.gates is None:
            return True
        self.blocked_by = self.finish_extensions()
        if self.blocked_by:
            self.trajectory.write("acceptance_blocked", turn=self.turn, blocked_by=self.blocked_by)
            return True
        attempt = self.gates.check(self.turn)
        if attempt.error is not None or attempt.passed or final:
            return True
        turns_left = max(0, self.settings.max_turns - (self.turn - self.turns_before))
        message = self.gates.feedback(attempt, turns_left=turns_left)
        self.answer.withdraw()
        self.messages.append({"role": "user", "content": message})
        self.trajectory.write("answer_withdrawn", turn=self.turn, attempt=attempt.number,
                              failed=[r.name for r in attempt.failed], message=message)
        self.emit({"event": "answer_withdrawn", "turn": self.turn, "attempt": attempt.number})
        return False

    def finish_extensions(self) -> list[str]:
        """Let every extension finish (wait for what the run must wait for) and say what still blocks acceptance."""
        blocked: list[str] = []
        for extension in self.extensions:
            try:
                extension.finish()
            except RLMError as exc:
                self.error = self.error or f"{exc.code}: {exc.message}"
            blockers = getattr(extension, "blockers", None)  # optional: rlmfamily/extensions.py
            if blockers is not None:
                try:
                    blocked.extend(blockers())
                except RLMError as exc:
                    blocked.append(f"{type(extension).__name__} could not say: [{exc.code}] {exc.message}")
        return blocked

    # ---------- step ----------

    def admit_turn(self) -> int | None:
        """The budget entry of the next root turn, or None (and why) when the run must stop."""
        settings = self.settings
        if self.turn - self.turns_before >= settings.max_turns:
            self.stop_reason, self.why = "max_turns", f"all {settings.max_turns} turns are used (RLM_MAX_TURNS)"
            return None
        if time.monotonic() >= self.deadline:
            self.stop_reason, self.why = "deadline", f"the run reached its {settings.max_run_s:g} s limit (RLM_MAX_RUN_S)"
            return None
        try:
            estimate = estimate_tokens(message_chars(self.messages))
            return self.budget.admit("root", tokens_estimate=estimate, keep_calls=1,
                                     keep_tokens=settings.final_reserve_tokens)
        except BudgetError as exc:
            self.stop_reason, self.why = "budget_exhausted", exc.message
            self.trajectory.write("budget_refused", turn=self.turn + 1, code=exc.code, message=exc.message)
            return None

    def play_turn(self, entry: int) -> None:
        self.turn += 1
        self.subcalls.current_turn = self.turn
        self.emit({"event": "turn_started", "turn": self.turn, "max_turns": self.last_turn,
                   "subcalls": self.subcall_count, "budget": self.budget.snapshot().to_dict()})
        self.after_completion(self.root_call(entry))

    def root_call(self, entry: int) -> Completion:
        chars = message_chars(self.messages)
        self.root_chars_sent += chars
        self.root_chars_last = max(self.root_chars_last, chars)
        try:
            completion = self.session.provider.complete(
                self.messages, tools=self.protocol.tools, model=self.session.model,
                timeout_s=self.settings.root_timeout_s, purpose="root",
            )
        except ProviderError as exc:
            if exc.billed is False:
                self.budget.fail(entry, exc.message)
            else:
                self.budget.mark_unknown(entry, exc.message)
            if self.turn == 1 and refused_tools(self.protocol, exc):
                return self.root_call(self.fall_back_to_text(exc))
            raise
        self.budget.settle(entry, completion.usage)
        return completion

    def fall_back_to_text(self, refusal: ProviderError) -> int:
        """RLM_PROTOCOL=auto, the first call refused for its tools: go on with code blocks, say so, admit again."""
        self.protocol = TEXT
        for message in (self.messages[0], self.messages[-1]):  # the system prompt, the question (or follow-up)
            message["content"] = in_text_words(message["content"])
        self.trajectory.write("protocol_fallback", turn=self.turn, protocol=TEXT.name, reason=refusal.message)
        self.emit({"event": "protocol_fallback", "turn": self.turn, "protocol": TEXT.name, "reason": refusal.message})
        return self.budget.admit("root", tokens_estimate=estimate_tokens(message_chars(self.messages)), keep_calls=1,
                                 keep_tokens=self.settings.final_reserve_tokens)

    def after_completion(self, completion: Completion, *, max_steps: int | None = None) -> None:
        """Record the assistant's message and run its python calls (at most ``max_steps``)."""
        calls = self.protocol.calls(completion)
        self.messages.append(self.protocol.assistant_message(completion, calls))
        self.trajectory.write(
            "turn", turn=self.turn, text=completion.text, code=[c.code for c in calls],
            calls=[{"id": c.id, "name": c.name, **({"arguments": c.arguments} if c.arguments is not None else {})}
                   for c in calls],
            usage=completion.usage.to_dict() if completion.usage else None, model=completion.model,
        )
        if not calls:
            self.messages.append({"role": "user", "content": self.protocol.nudge})
            return
        self.run_calls(completion, calls, max_steps=max_steps)

    def run_calls(self, completion: Completion, calls: Sequence[ToolCall], *, done: Sequence[str] = (),
                  max_steps: int | None = None) -> None:
        """Run ``calls`` (a python call runs a step, at most ``max_steps`` calls run), then give the model their
        observations. ``done``: the observations of the first calls, which a resumed run has from its records."""
        observations = list(done)
        for index in range(len(observations), len(calls)):
            call = calls[index]
            if self.answer.value is not None or (max_steps is not None and index >= max_steps):
                observation = NOT_RUN
            elif call.name in self.model_tools:
                observation = self.tool_step(call, self.model_tools[call.name])
            elif call.name != "python":
                observation = no_such_tool(call.name, ["python", *self.model_tools])
            else:
                observation = self.step(call.code)
            observations.append(observation)
        self.messages.extend(self.protocol.result_messages(completion, calls, observations))

    def step(self, code: str) -> str:
        """Run one python call in the kernel; the model sees a bounded observation, the history keeps it all."""
        if not code.strip():
            return EMPTY_CODE
        assert self.kernel is not None, "start() builds the kernel before the first step"
        settings = self.settings
        self.emit({"event": "step_started", "turn": self.turn})
        result = self.kernel.execute(code)
        full = result.stdout
        if result.stdout_truncated:
            full += (f"\n[printed {result.stdout_bytes:,} bytes; the first {settings.max_output_bytes:,} were kept "
                     "(RLM_MAX_OUTPUT_BYTES)]")
        if result.error:
            full += ("\n" if full else "") + result.error
        title = code.strip().splitlines()[0][:ENTRY_TITLE_CHARS]
        hid = self.history.add("observation", full, turn=self.turn, title=title) if full else None
        body = self.shown(full, hid) if full else NO_OUTPUT_HINT
        observation = _step_header(result) + "\n" + body
        answered = self.answer.value is not None and self.answer.turn == self.turn
        if answered:
            observation += "\n[final answer recorded]"
        # Not waited for: a kernel that takes the step's record in the background (MontyKernel's
        # checkpoint_in_background) stores it while the run goes on to its next model call. The next execute, and
        # the run's end, wait for it; a crash before it is stored leaves the newest record one step behind the
        # trajectory, and a resume runs this step again from the record before it (rlmfamily/journal.py).
        self.trajectory.write(
            "step", turn=self.turn, code=code, ok=result.ok, error_code=result.error_code, error=result.error,
            stdout_bytes=result.stdout_bytes, stdout_truncated=result.stdout_truncated,
            duration_s=round(result.duration_s, 4), restored=result.restored_from_checkpoint,
            observation=observation, observation_chars=len(observation), full_chars=len(full), history_id=hid,
            **({"answer": self.answer.value} if answered else {}),
        )
        self.chars_shown += self.kept_chars(full) if full else 0
        self.chars_produced += len(full)
        self.emit({"event": "step_finished", "turn": self.turn, "ok": result.ok})
        return observation

    def shown(self, full: str, history_id: int | None, *, receipt: str | None = None) -> str:
        """What the model sees of an output: head and tail (``transcript``), or a compact receipt (``receipts``)."""
        settings = self.settings
        if settings.observation_strategy == "receipts":
            return receipt if receipt is not None else receipt_of(full, settings.receipt_preview_chars, history_id)
        return bounded(full, settings.max_observation_chars, settings.observation_tail_chars, history_id,
                       settings.max_history_read_chars)

    def kept_chars(self, full: str, *, receipt: str | None = None) -> int:
        """How many of an output's characters ``shown`` gives the model: all, its head and tail, or its preview.
        Step headers, hints and markers are not output, so the count never exceeds the characters produced."""
        settings = self.settings
        if settings.observation_strategy == "receipts":
            kept = len(receipt) if receipt is not None else settings.receipt_preview_chars
        elif len(full) <= settings.max_observation_chars:
            kept = len(full)
        else:  # bounded()'s head and tail
            kept = max(0, settings.max_observation_chars - settings.observation_tail_chars - MARKER_ROOM_CHARS)
            kept += settings.observation_tail_chars
        return min(len(full), kept)

    def tool_step(self, call: ToolCall, tool: Any) -> str:
        """A call of a model tool beside python (the bash tool): its output recorded, the model shown a bounded part."""
        self.emit({"event": "step_started", "turn": self.turn})
        result = tool.run(call, self.turn)
        title = f"{call.name}: " + (call.code.strip().splitlines() or [""])[0][:ENTRY_TITLE_CHARS]
        hid = self.history.add("observation", result.full, turn=self.turn, title=title) if result.full else None
        observation = self.shown(result.full, hid, receipt=result.receipt)
        self.trajectory.write("tool_step", turn=self.turn, call_id=call.id, name=call.name, ok=result.ok,
                              observation=observation, observation_chars=len(observation),
                              full_chars=len(result.full), history_id=hid, **result.record)
        self.chars_shown += self.kept_chars(result.full, receipt=result.receipt)
        self.chars_produced += len(result.full)
        self.emit({"event": "step_finished", "turn": self.turn, "ok": result.ok})
        return observation

    def record_subcall(self, record: SubcallRecord) -> None:
        hid = self.history.add("subcall", f"PROMPT:\n{record.prompt}\n\nANSWER:\n{record.response}",
                               turn=record.turn, title=record.prompt[:ENTRY_TITLE_CHARS])
        with self._subcall_lock:  # batches record from several threads; keep the count and the events in step
            self.subcall_count += 1
            self.trajectory.write(
                "subcall", seq=record.seq, turn=record.turn, prompt=record.prompt[:PREVIEW_CHARS],
                prompt_chars=len(record.prompt), context_chars=record.context_chars, ok=record.ok,
                error_code=record.error_code, response=record.response[:PREVIEW_CHARS],
                response_chars=len(record.response), truncated=record.truncated, usage=record.usage,
                model=record.model, duration_s=record.duration_s, budget_entry=record.budget_entry, history_id=hid,
                cached=record.cached, cached_from=record.cached_from,
                **({"sources": list(record.sources)} if record.sources else {}),
            )
            self.emit({"event": "subcall", "turn": record.turn, "subcalls": self.subcall_count, "ok": record.ok,
                       "budget": self.budget.snapshot().to_dict()})

    # ---------- ask for the answer ----------

    def ask_for_final(self) -> None:
        """One last root call that asks for the answer now; at most one python step is run."""
        self.trajectory.write("final_request", turn=self.turn + 1, why=self.why, stop_reason=self.stop_reason)
        try:
            entry = self.budget.admit(FINAL_PURPOSE, tokens_estimate=estimate_tokens(message_chars(self.messages)),
                                      final=True)
        except BudgetError as exc:
            self.trajectory.write("budget_refused", turn=self.turn + 1, code=exc.code, message=exc.message)
            return
        self.turn += 1
        self.emit({"event": "turn_started", "turn": self.turn, "max_turns": self.last_turn,
                   "final": True, "subcalls": self.subcall_count, "budget": self.budget.snapshot().to_dict()})
        self.messages.append({"role": "user", "content": final_request(self.why, self.protocol.name)})
        completion = self.root_call(entry)
        self.after_completion(completion, max_steps=1)
        self.judge_final(completion)

    def judge_final(self, completion: Completion) -> None:
        """The answer to the final request: set by its step, or its plain text; text beside a python call is not."""
        if self.answer.value is not None:
            return
        if self.protocol.calls(completion):
            # Text next to a python call is what the model says before its step (a preamble), not an answer.
            self.error = ("the reply to the final request called python and did not call final_answer(); "
                          "the text beside the call is not taken as the answer")
            self.trajectory.write("final_reply_rejected", turn=self.turn, reason=self.error, text=completion.text)
        elif completion.text.strip():
            self.answer.set(completion.text.strip()[: self.settings.max_answer_chars], self.turn)

    # ---------- close ----------

    def abandon(self) -> None:
        """A resume refused before it changed anything: release what was opened, append nothing."""
        self.close_kernel()
        for extension in self.extensions:
            extension.close()
        self.close_environment()
        self.trajectory.close()

    def close_environment(self) -> None:
        environment, self.environment = self.environment, None
        kept = self.session._kept  # noqa: SLF001
        if environment is not None and (kept is None or kept.environment is not environment):
            environment.close()

    def close_kernel(self) -> None:
        """Close the kernel (which stores a pending record first); a kernel kept for follow-ups is only waited for:
        a finished question's records are complete."""
        kept = self.session._kept  # noqa: SLF001
        if self.kernel is None:
            return
        try:
            if kept is not None and kept.kernel is self.kernel:
                flush = getattr(self.kernel, "flush", None)  # optional: rlmfamily/kernels/base.py
                if flush is not None:
                    flush()
            else:
                self.kernel.close()
        except Exception as exc:  # noqa: BLE001 - closing must not hide the run's outcome
            self.error = self.error or f"kernel close failed: {exc}"

    def close(self) -> RunResult:
        """Wait for what the run started (children, required remote work), then record and return the result."""
        extra: dict[str, Any] = {}
        try:
            try:
                self.blocked_by = self.finish_extensions()
            finally:
                for extension in self.extensions:
                    try:
                        extra.update(extension.record())
                    finally:
                        extension.close()
        finally:
            self.budget.release()  # the call it kept for its final answer goes back to the family
        verdict, extra["verdict_reason"] = self.verdict()
        extra["blocked_by"] = self.blocked_by
        if self.gates is not None:
            extra["gates"] = self.gates.record()
        snapshot = self.budget.snapshot()
        duration = round(time.monotonic() - self.started, 3)
        extra["observations"] = {"strategy": self.settings.observation_strategy, "chars_shown": self.chars_shown,
                                 "chars_produced": self.chars_produced}
        self.trajectory.write(
            "run_finished", stop_reason=self.stop_reason, answer=self.answer.value, verdict=verdict,
            error=self.error, turns=self.turn,
            subcalls=self.subcall_count, subcalls_cached=self.subcalls.cached, usage=self.budget.own_usage(), budget=snapshot.to_dict(), root_chars_sent=self.root_chars_sent,
            root_chars_last=self.root_chars_last, corpus_bytes=self.stats["bytes"], duration_s=duration, **extra,
        )
        self.trajectory.close()
        result = RunResult(
            run_id=self.session.run_id, answer=self.answer.value, stop_reason=self.stop_reason or "error",
            turns=self.turn, subcalls=self.subcall_count, error=self.error, trajectory_path=self.trajectory.path,
            budget=snapshot, corpus_bytes=self.stats["bytes"], root_chars_sent=self.root_chars_sent,
            root_chars_last=self.root_chars_last, duration_s=duration, extra=extra,
            subcalls_cached=self.subcalls.cached, verdict=verdict,
        )
        self.emit({"event": "run_finished", "stop_reason": result.stop_reason, "turns": self.turn,
                   "subcalls": self.subcall_count, "budget": snapshot.to_dict(), "verdict": verdict})
        return result

    def verdict(self) -> tuple[str, str]:
        """accepted, gates_failed or not_verified, and why (rlmfamily/gates/verdict.py)."""
        if self.gates is not None:
            not_gated = None
        elif not self.settings.gates:
            not_gated = "no completion gates are configured (RLM_GATES, rlm run --gate)"
        elif self.session.root_id != self.session.run_id:
            not_gated = "a child's answer is not gated: its root's gates judge the family's work"
        else:
            not_gated = f"the gates could not be set up: {self.error or 'the run ended before they were'}"
        return verdict_of(not_gated=not_gated, blocked_by=self.blocked_by,
                          last=self.gates.last if self.gates else None, answered=self.answer.value is not None)

    def emit(self, event: Event) -> None:
        self.session._emit(event)  # noqa: SLF001 - the run is the session's own


def _step_header(result: StepResult) -> str:
    header = (f"[ok in {result.duration_s:.2f} s]" if result.ok
              else f"[error: {result.error_code} after {result.duration_s:.2f} s]")
    if result.restored_from_checkpoint:
        header += " [the namespace was restored to its state after the last successful step]"
        if result.lost_names:
            header += f" [not restored: {', '.join(result.lost_names)}]"
    return header


def run_question(
    question: str,
    *,
    context: Context,
    provider: Provider,
    settings: RLMSettings | None = None,
    kernel: str | None = None,
    on_event: Callable[[Event], None] | None = None,
) -> RunResult:
    """One question, one run: the shortest way to use the library from Python."""
    return Session(context=context, provider=provider, settings=settings, kernel=kernel, on_event=on_event).run(question)

