"""The root session: a model with one tool, ``python``, over a persistent namespace (a Kernel).

One ``run(question)``: the model sees the question and the corpus's shape, runs
code step by step, sees bounded observations (head and tail, with a history id
for the rest), and ends the run by calling ``final_answer(value)`` from code.
When turns, budget or time run out, the model is asked once for a final answer
and the run records why it stopped (``stop_reason``). Every root turn and
sub-call draws on the run's one budget; every run writes a trajectory.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlm.budget import Budget, BudgetLedger, BudgetLimits, BudgetSnapshot
from rlm.context import Context
from rlm.errors import BudgetError, KernelUnavailable, ProviderError, RLMError, SettingsInvalid
from rlm.extensions import Extension, ExtensionFactory, RunInfo, default_extensions
from rlm.history import History
from rlm.llm import SubcallRecord, SubcallRunner
from rlm.namespace import PRELUDE, AnswerBox, Bridge, _guest_errors
from rlm.prompts import NUDGE, PYTHON_TOOL, final_request, first_message, system_prompt
from rlm.providers.base import Completion, Provider, estimate_tokens, message_chars
from rlm.settings import RLMSettings, load_settings
from rlm.trajectory import FILENAME, TrajectoryWriter

STOP_REASONS = ("answered", "max_turns", "budget_exhausted", "deadline", "error")
PREVIEW_CHARS = 500

Event = dict[str, Any]
KernelFactory = Callable[[str, RLMSettings, Path, str], Any]


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

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["trajectory_path"] = str(self.trajectory_path)
        data["budget"] = self.budget.to_dict()
        return data


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def default_kernel_factory(name: str, settings: RLMSettings, run_dir: Path, run_id: str) -> Any:
    """A real kernel: ``host`` (the user's Python in a child process) or ``monty`` (the sandbox)."""
    limits = settings.kernel_limits()
    try:
        if name == "host":
            from rlm.kernels.host import HostKernel

            from rlm.a2a.run import secret_env_names

            # The model's code never gets the model key nor an A2A peer's key: the child inherits the
            # environment without them.
            hidden = {settings.api_key_env} | secret_env_names(settings)
            env = {k: v for k, v in os.environ.items() if k not in hidden}
            return HostKernel(limits=limits, env=env)
        from rlm.kernels.checkpoints import FileCheckpointStore
        from rlm.kernels.monty import MontyKernel

        # Step checkpoints are kept; snapshots before every host call are for a replacement worker
        # resuming a step (the service), which a local run never does: they would cost ~2 ms per call.
        return MontyKernel(limits=limits, store=FileCheckpointStore(run_dir / "checkpoints"), session_id=run_id,
                           record_pending_calls=False)
    except ImportError as exc:
        raise KernelUnavailable(f"the {name} kernel cannot be loaded: {exc}") from None


def bounded(text: str, max_chars: int, tail_chars: int, history_id: int | None, read_cap: int) -> str:
    """Head and tail of ``text`` within ``max_chars``, naming the history entry that holds the middle."""
    if len(text) <= max_chars:
        return text
    marker_room = 160
    head_chars = max(0, max_chars - tail_chars - marker_room)
    omitted_start = head_chars
    omitted = len(text) - head_chars - tail_chars
    where = (
        f"history.read({history_id}, {omitted_start}, {min(omitted, read_cap)}) returns them"
        if history_id is not None else "they were not stored"
    )
    return f"{text[:head_chars]}\n[... {omitted:,} characters omitted; {where}]\n{text[len(text) - tail_chars:]}"


@dataclass
class _RunState:
    run_id: str
    turn: int = 0
    subcalls: int = 0
    root_chars_sent: int = 0
    root_chars_last: int = 0


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
    ) -> None:
        self.settings = settings or load_settings()
        self.context = context
        self.provider = provider
        self.kernel_name = kernel or self.settings.kernel
        if self.kernel_name not in ("host", "monty"):
            raise SettingsInvalid(f"unknown kernel {self.kernel_name!r}: use 'host' or 'monty' (RLM_KERNEL)",
                                  setting="kernel")
        self.kernel_factory = kernel_factory or default_kernel_factory
        self.model = model
        self.run_id = run_id or new_run_id()
        # A member of a family draws on its root's allowance (root_id) and keeps its own history (agent_id).
        self.root_id = root_id or self.run_id
        self.agent_id = agent_id or self.run_id
        self.extension_factories = list(default_extensions() if extensions is None else extensions)
        self.messages: list[dict[str, Any]] = []  # the conversation, kept for a follow-up
        self.on_event = on_event
        self._used = False
        prices = getattr(provider, "prices", None)
        model_id = model or getattr(provider, "default_model", None)
        if self.settings.max_usd is not None and prices is not None and model_id and not prices.has(model_id) \
                and getattr(provider, "name", "") != "scripted":
            # Without a price every call's cost is unknown, which would block a USD limit after one call.
            raise SettingsInvalid(
                f"max_usd is set but model {model_id!r} has no price; add it to RLM_PRICES_USD_PER_MTOK "
                "or RLM_PRICE_TABLE_FILE, or drop the USD limit",
                setting="prices_usd_per_mtok",
            )

    # ---------- the run ----------

    def run(self, question: str, *, prior_messages: Sequence[dict[str, Any]] | None = None) -> RunResult:
        """Answer ``question``; with ``prior_messages`` (a finished run's conversation) it is a follow-up."""
        if self._used:
            raise RLMError("a Session runs once; make a new Session for a new question")
        self._used = True
        settings = self.settings
        started = time.monotonic()
        run_dir = settings.runs_dir / self.run_id
        trajectory = TrajectoryWriter(run_dir / FILENAME)
        state = _RunState(self.run_id)
        ledger = BudgetLedger(settings.budget_path)
        # A family member never brings its own allowance: it draws on the root's, as the root set it.
        limits = (BudgetLimits(settings.max_calls, settings.max_tokens, settings.max_usd)
                  if self.root_id == self.run_id else ledger.limits(self.root_id))
        budget = Budget(ledger, self.root_id, limits)
        history = History(settings.history_path, self.agent_id, max_read_chars=settings.max_history_read_chars,
                          max_hits=settings.max_history_hits)
        answer = AnswerBox()
        stats = self.context.stats()

        subcall_lock = threading.Lock()

        def on_subcall(record: SubcallRecord) -> None:
            hid = history.add("subcall", f"PROMPT:\n{record.prompt}\n\nANSWER:\n{record.response}",
                              turn=record.turn, title=record.prompt[:80])
            with subcall_lock:  # batches record from several threads; keep the count and the events in step
                state.subcalls += 1
                trajectory.write(
                    "subcall", seq=record.seq, turn=record.turn, prompt=record.prompt[:PREVIEW_CHARS],
                    prompt_chars=len(record.prompt), context_chars=record.context_chars, ok=record.ok,
                    error_code=record.error_code, response=record.response[:PREVIEW_CHARS],
                    response_chars=len(record.response), truncated=record.truncated, usage=record.usage,
                model=record.model, duration_s=record.duration_s, budget_entry=record.budget_entry, history_id=hid,
                )
                self._emit({"event": "subcall", "turn": record.turn, "subcalls": state.subcalls, "ok": record.ok,
                            "budget": budget.snapshot().to_dict()})

        subcalls = SubcallRunner(
            provider=self.provider, budget=budget, settings=settings, on_record=on_subcall,
            model=settings.subcall_model, resolve_context=lambda value: bridge.resolve_context(value),
        )
        bridge = Bridge(context=self.context, subcalls=subcalls, history=history, answer=answer,
                        max_answer_chars=settings.max_answer_chars, current_turn=lambda: state.turn)
        limits_shown = {
            "turns": settings.max_turns, "sub-calls": settings.max_subcalls,
            "observation chars": settings.max_observation_chars, "seconds per step": settings.step_timeout_s,
            "sub-call prompt chars": settings.max_prompt_chars,
        }
        if prior_messages:
            messages: list[dict[str, Any]] = [dict(m) for m in prior_messages]
            messages.append({"role": "user", "content": f"Follow-up: {question}\n\n"
                             "Continue with the python tool, then call final_answer(value)."})
        else:
            messages = [
                {"role": "system", "content": system_prompt(self.kernel_name, limits_shown)},
                {"role": "user", "content": first_message(question, stats)},
            ]
        self.messages = messages
        trajectory.write(
            "run_started", run_id=self.run_id, question=question, kernel=self.kernel_name,
            provider=getattr(self.provider, "name", type(self.provider).__name__),
            model=self.model or getattr(self.provider, "default_model", None), corpus=stats,
            limits={"max_turns": settings.max_turns, "max_calls": settings.max_calls,
                    "max_tokens": settings.max_tokens, "max_usd": settings.max_usd,
                    "max_subcalls": settings.max_subcalls, "max_observation_chars": settings.max_observation_chars},
            first_message=messages[-1]["content"],
        )
        self._emit({"event": "run_started", "run_id": self.run_id, "max_turns": settings.max_turns,
                    "budget": budget.snapshot().to_dict()})

        stop_reason: str | None = None
        error: str | None = None
        why = ""
        kernel = None
        deadline = started + settings.max_run_s
        extensions: list[Extension] = []
        info = RunInfo(
            run_id=self.run_id, root_id=self.root_id, agent_id=self.agent_id, settings=settings,
            context=self.context, provider=self.provider, kernel=self.kernel_name, model=self.model, budget=budget,
            history=history, trajectory=trajectory, deadline=deadline, emit=self._emit, current_turn=lambda: state.turn,
        )
        try:
            functions = bridge.functions()
            for factory in self.extension_factories:
                extension = factory(info)
                extensions.append(extension)
                functions.update({name: _guest_errors(fn) for name, fn in extension.functions().items()})
            if not prior_messages:
                messages[0]["content"] += "".join(e.notes for e in extensions)
            kernel = self.kernel_factory(self.kernel_name, settings, run_dir, self.run_id)
            kernel.start(functions, PRELUDE + "".join(e.prelude for e in extensions))
            while True:
                if state.turn >= settings.max_turns:
                    stop_reason, why = "max_turns", f"all {settings.max_turns} turns are used (RLM_MAX_TURNS)"
                    break
                if time.monotonic() >= deadline:
                    stop_reason, why = "deadline", f"the run reached its {settings.max_run_s:g} s limit (RLM_MAX_RUN_S)"
                    break
                try:
                    entry = budget.admit("root", tokens_estimate=estimate_tokens(message_chars(messages)), keep_calls=1)
                except BudgetError as exc:
                    stop_reason, why = "budget_exhausted", exc.message
                    trajectory.write("budget_refused", turn=state.turn + 1, code=exc.code, message=exc.message)
                    break
                state.turn += 1
                subcalls.current_turn = state.turn
                self._emit({"event": "turn_started", "turn": state.turn, "max_turns": settings.max_turns,
                            "subcalls": state.subcalls, "budget": budget.snapshot().to_dict()})
                completion = self._root_call(messages, budget, entry, state)
                self._after_completion(completion, messages, kernel, history, answer, trajectory, state)
                if answer.value is not None:
                    stop_reason = "answered"
                    break
            if stop_reason != "answered":
                self._ask_for_final(why, messages, kernel, history, answer, budget, trajectory, state)
        except ProviderError as exc:
            stop_reason, error = "error", f"{exc.code}: {exc.message}"
        except RLMError as exc:
            stop_reason, error = "error", f"{exc.code}: {exc.message}"
        finally:
            if kernel is not None:
                try:
                    kernel.close()
                except Exception as exc:  # noqa: BLE001 - closing must not hide the run's outcome
                    error = error or f"kernel close failed: {exc}"
        # The run is complete only once what it started is resolved (children, required remote work).
        extra: dict[str, Any] = {}
        for extension in extensions:
            try:
                extension.finish()
            except RLMError as exc:
                error = error or f"{exc.code}: {exc.message}"
            try:
                extra.update(extension.record())
            finally:
                extension.close()
        snapshot = budget.snapshot()
        duration = round(time.monotonic() - started, 3)
        trajectory.write(
            "run_finished", stop_reason=stop_reason, answer=answer.value, error=error, turns=state.turn,
            subcalls=state.subcalls, budget=snapshot.to_dict(), root_chars_sent=state.root_chars_sent,
            root_chars_last=state.root_chars_last, corpus_bytes=stats["bytes"], duration_s=duration, **extra,
        )
        trajectory.close()
        result = RunResult(
            run_id=self.run_id, answer=answer.value, stop_reason=stop_reason or "error", turns=state.turn,
            subcalls=state.subcalls, error=error, trajectory_path=trajectory.path, budget=snapshot,
            corpus_bytes=stats["bytes"], root_chars_sent=state.root_chars_sent,
            root_chars_last=state.root_chars_last, duration_s=duration, extra=extra,
        )
        self._emit({"event": "run_finished", "stop_reason": result.stop_reason, "turns": state.turn,
                    "subcalls": state.subcalls, "budget": snapshot.to_dict()})
        return result

    # ---------- pieces ----------

    def _emit(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)

    def _root_call(self, messages: list[dict[str, Any]], budget: Budget, entry: int, state: _RunState,
                   tools: bool = True) -> Completion:
        chars = message_chars(messages)
        state.root_chars_sent += chars
        state.root_chars_last = max(state.root_chars_last, chars)
        try:
            completion = self.provider.complete(
                messages, tools=[PYTHON_TOOL] if tools else None, model=self.model,
                timeout_s=self.settings.root_timeout_s, purpose="root",
            )
        except ProviderError as exc:
            if exc.billed is False:
                budget.fail(entry, exc.message)
            else:
                budget.mark_unknown(entry, exc.message)
            raise
        budget.settle(entry, completion.usage)
        return completion

    def _after_completion(self, completion: Completion, messages: list[dict[str, Any]], kernel: Any,
                          history: History, answer: AnswerBox, trajectory: TrajectoryWriter, state: _RunState,
                          *, max_steps: int | None = None) -> None:
        calls = completion.tool_calls
        assistant: dict[str, Any] = {"role": "assistant", "content": completion.text or None}
        if calls:
            assistant["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps({"code": c.code})}}
                for c in calls
            ]
        messages.append(assistant)
        trajectory.write(
            "turn", turn=state.turn, text=completion.text, code=[c.code for c in calls],
            usage=completion.usage.to_dict() if completion.usage else None, model=completion.model,
        )
        if not calls:
            messages.append({"role": "user", "content": NUDGE})
            return
        for index, call in enumerate(calls):
            if answer.value is not None or (max_steps is not None and index >= max_steps):
                observation = "[not run: the run is ending]"
            elif call.name != "python":
                observation = f"[error: there is no tool {call.name!r}; the only tool is python]"
            else:
                observation = self._step(call.code, kernel, history, answer, trajectory, state)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": observation})

    def _step(self, code: str, kernel: Any, history: History, answer: AnswerBox,
              trajectory: TrajectoryWriter, state: _RunState) -> str:
        settings = self.settings
        if not code.strip():
            return "[error: empty code; send Python source in the code argument]"
        self._emit({"event": "step_started", "turn": state.turn})
        result = kernel.execute(code)
        full = result.stdout
        if result.stdout_truncated:
            full += (f"\n[printed {result.stdout_bytes:,} bytes; the first {settings.max_output_bytes:,} were kept "
                     "(RLM_MAX_OUTPUT_BYTES)]")
        if result.error:
            full += ("\n" if full else "") + result.error
        hid = history.add("observation", full, turn=state.turn, title=code.strip().splitlines()[0][:80]) if full else None
        if result.ok:
            header = f"[ok in {result.duration_s:.2f} s]"
        else:
            header = f"[error: {result.error_code} after {result.duration_s:.2f} s]"
        if result.restored_from_checkpoint:
            header += " [the namespace was restored to its state after the last successful step]"
            lost = getattr(result, "lost_names", ())
            if lost:
                header += f" [not restored: {', '.join(lost)}]"
        body = bounded(full, settings.max_observation_chars, settings.observation_tail_chars, hid,
                       settings.max_history_read_chars) if full else "(no output; print() what you want to see)"
        observation = header + "\n" + body
        if answer.value is not None and answer.turn == state.turn:
            observation += "\n[final answer recorded]"
        trajectory.write(
            "step", turn=state.turn, code=code, ok=result.ok, error_code=result.error_code, error=result.error,
            stdout_bytes=result.stdout_bytes, stdout_truncated=result.stdout_truncated,
            duration_s=round(result.duration_s, 4), restored=result.restored_from_checkpoint,
            observation=observation, observation_chars=len(observation), full_chars=len(full), history_id=hid,
        )
        self._emit({"event": "step_finished", "turn": state.turn, "ok": result.ok})
        return observation

    def _ask_for_final(self, why: str, messages: list[dict[str, Any]], kernel: Any, history: History,
                       answer: AnswerBox, budget: Budget, trajectory: TrajectoryWriter, state: _RunState) -> None:
        """One last root call that asks for the answer now; at most one python step is run."""
        trajectory.write("final_request", turn=state.turn + 1, why=why)
        try:
            entry = budget.admit("root_final", tokens_estimate=estimate_tokens(message_chars(messages)))
        except BudgetError as exc:
            trajectory.write("budget_refused", turn=state.turn + 1, code=exc.code, message=exc.message)
            return
        state.turn += 1
        self._emit({"event": "turn_started", "turn": state.turn, "max_turns": self.settings.max_turns,
                    "final": True, "subcalls": state.subcalls, "budget": budget.snapshot().to_dict()})
        messages.append({"role": "user", "content": final_request(why)})
        completion = self._root_call(messages, budget, entry, state)
        self._after_completion(completion, messages, kernel, history, answer, trajectory, state, max_steps=1)
        if answer.value is None and completion.text.strip():
            answer.set(completion.text.strip()[: self.settings.max_answer_chars], state.turn)


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

