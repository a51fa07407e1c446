"""The hosted profile around ``rlm.Session``: settings from the spec, a journaling provider, a resumable kernel.

``rlm.Session`` runs the investigation unchanged; the service plugs in through
the session's own seams:

- **settings** (``hosted_settings``): built from the spec only, never from the
  worker's environment (``HostedRLMSettings`` ignores ``RLM_*`` variables), with
  children and A2A off (depth 0, no extensions but ours);
- **provider** (``JournalProvider``): every model call is journaled before it is
  sent and resolved after; on a resume, answered root turns and the interrupted
  step's answered semantic calls are served from the journal, not paid again;
- **kernel** (``HostedKernel``): a ``MontyKernel`` with the PostgreSQL checkpoint
  store (signed records, a snapshot before every host call). Steps that completed
  before a resume are replayed from the journal; the first live step recovers
  the newest checkpoint (``MontyKernel.recover``), finishing an interrupted step
  from its pending host call;
- **extension** (``HostedExtension``): the spec's prompt appended to the system
  prompt, and the run's position (turn) for the journal;
- **events**: turns and semantic calls become progress reports (not for replayed turns).

Replaying the conversation through the same ``Session`` rebuilds its messages,
its turn count and its history ids exactly, so the run continues as if nothing
had happened.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.trace import SpanKind
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from core import telemetry
from core.specs import SpecialistSpec
from rlmfamily.errors import KernelError, ProviderError
from rlmfamily.extensions import RunInfo
from rlmfamily.kernels.base import StepResult
from rlmfamily.kernels.monty import MontyKernel, Recovery
from rlmfamily.namespace import render_answer
from rlmfamily.providers.base import Completion, Provider
from rlmfamily.settings import RLMSettings
from rlmfamily.sqlite_file import MEMORY
from workers.hosted_rlm.journal import Journal, ResumePlan, completion_from_json, step_from_json
from workers.hosted_rlm.routes import OpenAIRoute, ScriptedRoute
from workers.hosted_rlm.store import PAID_HOST_CALLS, PgCheckpointStore

# At most one progress report about semantic calls per this many seconds (turns are always reported).
SUBCALL_REPORT_INTERVAL_S = 1.0
SESSION_ID_DIGEST_CHARS = 40  # hex characters of the job id's SHA-256 in its Monty session id
SUBCALL_TITLE_CHARS = 80  # of a semantic call's prompt, as its history title (as rlmfamily/session.py titles it)
# Refusals the sandbox's code gets back as data, which the customer is told about.
COUNTED_REFUSALS = ("subcall_limit", "prompt_too_large", "batch_too_large")
RESULT_LOST = (
    "[the worker running this step stopped after the step ended and before its output was recorded; "
    "the namespace is as the step left it: print what you need again]"
)


class HostedRLMSettings(RLMSettings):
    """RLM settings that come from the spec alone: a worker's ``RLM_*`` environment cannot loosen them."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)

    # The run's budget and history live in memory: the service's journal (PostgreSQL) holds what a resume needs,
    # and the run's data folder is deleted when the attempt ends, so a file would buy nothing but its writes
    # (bench/specialist.py --profile: most of a run's own time, docs/BENCHMARKS.md).
    @property
    def budget_path(self) -> Path:
        return Path(MEMORY)

    @property
    def history_path(self) -> Path:
        return Path(MEMORY)


class RunStopped(ProviderError):
    """The worker asked the run to stop (cancel, deadline, lost claim): no further model call is made."""

    code = "run_stopped"


class ResumeDiverged(KernelError):
    """A resumed run reached a step the journal does not expect; it must not guess."""

    code = "resume_diverged"


def session_id_for(job_id: str) -> str:
    """The Monty session id of a job (job ids may hold characters session ids may not)."""
    return "job-" + hashlib.sha256(job_id.encode()).hexdigest()[:SESSION_ID_DIGEST_CHARS]


def hosted_settings(
    spec: SpecialistSpec,
    route: OpenAIRoute | ScriptedRoute,
    *,
    data_dir: Path,
    max_run_s: float,
    max_subcalls: int,
) -> RLMSettings:
    """The RLM settings of one hosted run: the spec's limits, depth 0, no A2A, no budget but the spec's caps."""
    limits = spec.limits
    monty = limits.monty
    rounds = math.ceil(max(1, limits.max_semantic_calls) / limits.max_subcall_concurrency)
    return HostedRLMSettings(
        data_dir=data_dir,
        kernel="monty",
        max_turns=limits.max_turns,
        max_run_s=max_run_s,
        # One character over the limit is let through so that an answer cut by the session is seen and refused.
        max_answer_chars=limits.max_output_bytes + 1,
        root_timeout_s=route.request_timeout_s,
        step_timeout_s=monty.step_timeout_s,
        max_output_bytes=monty.max_printed_bytes_per_step,
        # A batch is one host call: it must fit its rounds of semantic calls.
        host_call_timeout_s=limits.semantic_call_timeout_s * rounds + 5,
        max_memory_bytes=monty.max_memory_bytes,
        max_recursion_depth=monty.max_recursion_depth,
        max_suspensions_per_step=monty.max_suspensions_per_step,
        max_suspensions_per_checkout=monty.max_suspensions_per_step * 20,
        max_sleep_s_per_step=monty.max_sleep_s_per_step,
        max_total_bytes=limits.max_input_bytes * 2,
        max_file_bytes=limits.max_input_bytes * 2,
        max_subcalls=max(0, max_subcalls),
        max_batch_size=max(1, limits.max_semantic_calls, limits.max_subcall_concurrency),
        max_concurrency=limits.max_subcall_concurrency,
        max_prompt_chars=limits.max_prompt_chars,
        max_response_chars=limits.max_response_chars,
        subcall_timeout_s=limits.semantic_call_timeout_s,
        max_calls=None,
        max_tokens=None,
        max_usd=None,
        subcall_model=route.subcall_model if isinstance(route, OpenAIRoute) else None,
        max_child_depth=0,
        max_children=0,
        # Off: every semantic call must pass the journal (its count, its resume replay, the history it rebuilds),
        # and the memo would live in this attempt's scratch data dir, thrown away when the attempt ends.
        memoise_subcalls=False,
        a2a_enabled=False,
        a2a_paid_enabled=False,
    )


def request_sha256(purpose: str, model: str | None, messages: list[dict[str, Any]]) -> bytes:
    canonical = json.dumps({"purpose": purpose, "model": model, "messages": messages}, sort_keys=True,
                           separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).digest()


@dataclass
class HostedRun:
    """One run's shared state: the journal, the resume plan, the position, the counters."""

    journal: Journal
    store: PgCheckpointStore
    spec: SpecialistSpec
    checkpoint_key: bytes
    plan: ResumePlan | None
    cancelled: Callable[[], bool]
    report: Callable[[dict[str, Any]], None]
    pool: Any = None  # a pydantic_monty.Monty pool shared by the worker's runs, or None for the kernel's own
    info: RunInfo | None = None
    semantic_calls_used: int = 0
    replayed_calls: int = 0
    kernel_instance: HostedKernel | None = None
    # The run's span (``specialist.run``): the parent of model calls made on threads the session started, where
    # no span is current.
    trace_context: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _last_subcall_report: float = -math.inf

    def __post_init__(self) -> None:
        if self.plan is not None:
            self.semantic_calls_used = self.plan.baked_subcalls

    # --- position -----------------------------------------------------------------------

    def current_turn(self) -> int:
        return self.info.current_turn() if self.info is not None else 0

    def replaying(self, turn: int) -> bool:
        return self.plan is not None and turn <= self.plan.last_replayed_turn

    # --- the session's seams ------------------------------------------------------------

    def extension(self, info: RunInfo) -> HostedExtension:
        self.info = info
        return HostedExtension(self)

    def kernel(self, name: str, settings: RLMSettings, run_dir: Path, run_id: str) -> HostedKernel:
        monty = MontyKernel(
            limits=settings.kernel_limits(),
            store=self.store,
            session_id=self.store.session_id,
            # Only before a paid call: a cheap call (context.read...) is replayed from the record before it, so its
            # snapshot would be a worker round trip, a hash and an encode the store throws away.
            record_pending_calls=PAID_HOST_CALLS,
            prune_checkpoints=True,
            checkpoint_key=self.checkpoint_key,
            pool=self.pool,
        )
        self.kernel_instance = HostedKernel(monty, self)
        return self.kernel_instance

    def provider(self, inner: Provider) -> JournalProvider:
        return JournalProvider(inner, self)

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        limits = self.spec.limits
        if kind == "run_started" and self.plan is not None:
            self._report(
                f"Resumed after the worker running this task stopped: continuing from turn "
                f"{self.plan.last_replayed_turn}; answered semantic calls are not repeated.",
            )
        elif kind == "turn_started" and not self.replaying(int(event.get("turn", 0))):
            turn = int(event["turn"])
            what = "final answer" if event.get("final") else f"turn {turn} of {limits.max_turns}"
            self._report(
                f"Investigating: {what}; {self.semantic_calls_used} of {limits.max_semantic_calls} semantic calls used.",
                turn=turn,
            )
        elif kind == "subcall" and not self.replaying(int(event.get("turn", 0))):
            # Each report rewrites the customer's task (and wakes every stream): a batch of fast calls is
            # summarised at most once per SUBCALL_REPORT_INTERVAL_S; every turn is reported.
            now = time.monotonic()
            with self._lock:
                if now - self._last_subcall_report < SUBCALL_REPORT_INTERVAL_S:
                    return
                self._last_subcall_report = now
            self._report(
                f"Semantic call {self.semantic_calls_used} of {limits.max_semantic_calls} "
                f"{'answered' if event.get('ok') else 'failed'}.",
                turn=int(event.get("turn", 0)),
            )

    def _report(self, text: str, *, turn: int | None = None) -> None:
        self.report(
            {
                "text": text,
                "turn": turn if turn is not None else self.current_turn(),
                "max_turns": self.spec.limits.max_turns,
                "semantic_calls": self.semantic_calls_used,
                "max_semantic_calls": self.spec.limits.max_semantic_calls,
            }
        )


class HostedExtension:
    """The hosted specialist's part of the session: its prompt; no host functions (no children, no A2A)."""

    prelude = ""

    def __init__(self, run: HostedRun) -> None:
        self.run = run
        spec = run.spec
        self.notes = f"\n\nYou are {spec.name}, a hosted specialist. {spec.prompt or ''}"

    def functions(self) -> dict[str, Callable[..., Any]]:
        return {}

    def finish(self) -> None:
        return None

    def record(self) -> dict[str, Any]:
        return {"hosted": {"specialist": self.run.spec.id, "resumed": self.run.plan is not None}}

    def close(self) -> None:
        return None


class JournalProvider:
    """The route's provider behind the journal: replays what a resumed run already paid for."""

    def __init__(self, inner: Provider, run: HostedRun) -> None:
        self.inner = inner
        self.run = run
        self.name = getattr(inner, "name", "provider")
        self.default_model = getattr(inner, "default_model", None)
        self.prices = getattr(inner, "prices", None)

    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None,
        model: str | None,
        timeout_s: float,
        purpose: str,
    ) -> Completion:
        run, plan = self.run, self.run.plan
        turn = run.current_turn()
        sha = request_sha256(purpose, model, messages)
        supersedes: int | None = None
        step_index: int | None = None
        request_text: str | None = None
        if purpose == "root":
            replay = plan.root.pop(turn, None) if plan is not None else None
            if replay is not None:  # answered before the resume: no model call, no span of its own
                run.journal.replayed(replay.call_id)
                return completion_from_json(replay.response)
            supersedes = plan.root_in_flight.pop(turn, None) if plan is not None else None
        else:
            kernel = run.kernel_instance
            step_index = kernel.current_step if kernel is not None else None
            with run._lock:
                pool = plan.replay_pool.get(sha) if plan is not None else None
                replay = pool.popleft() if pool else None
                if replay is None:
                    in_flight = plan.subcalls_in_flight.get(sha) if plan is not None else None
                    supersedes = in_flight.popleft() if in_flight else None
                run.semantic_calls_used += 1
                if replay is not None:
                    run.replayed_calls += 1
            if replay is not None:
                run.journal.replayed(replay.call_id)
                return completion_from_json(replay.response)
            request_text = "\n\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "user")
        if run.cancelled():
            raise RunStopped("the run was asked to stop (cancel, deadline or a lost claim); no model call is made",
                             billed=False)
        model_name = model or self.default_model
        parent = None if telemetry.current_context() is not None else run.trace_context
        with telemetry.span("model.call", parent=parent, kind=SpanKind.CLIENT,
                            attributes={"gen_ai.request.model": model_name, "specialists.purpose": purpose,
                                        "specialists.turn": turn, "specialists.step": step_index}) as span:
            completion = self._call(messages, tools=tools, model=model, timeout_s=timeout_s, purpose=purpose,
                                    turn=turn, step_index=step_index, sha=sha, request_text=request_text,
                                    model_name=model_name, supersedes=supersedes)
            self._observe(span, completion)
        return completion

    def _observe(self, span: Any, completion: Completion) -> None:
        """The call's model, tokens and cost on its span and in the meters: counts, never the text."""
        usage = completion.usage
        attributes = {"specialist": self.run.spec.id, "model": completion.model}
        telemetry.annotate(span, **{
            "gen_ai.response.model": completion.model,
            "gen_ai.usage.input_tokens": usage.prompt_tokens if usage else None,
            "gen_ai.usage.output_tokens": usage.completion_tokens if usage else None,
            "specialists.cost_usd": usage.cost_usd if usage else None,
        })
        if usage is None:
            return
        if usage.prompt_tokens:
            telemetry.meters.model_tokens.add(usage.prompt_tokens, {**attributes, "kind": "input"})
        if usage.completion_tokens:
            telemetry.meters.model_tokens.add(usage.completion_tokens, {**attributes, "kind": "output"})
        if usage.cost_usd:
            telemetry.meters.model_cost.add(usage.cost_usd, attributes)

    def _call(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None, model: str | None,
              timeout_s: float, purpose: str, turn: int, step_index: int | None, sha: bytes, request_text: str | None,
              model_name: str | None, supersedes: int | None) -> Completion:
        run = self.run
        call_id = run.journal.start_call(
            purpose=purpose, turn=turn, step_index=step_index, after_seq=run.store.last_seq, request_sha256=sha,
            request_text=request_text, model=model_name, supersedes=supersedes,
        )
        try:
            completion = self.inner.complete(messages, tools=tools, model=model, timeout_s=timeout_s, purpose=purpose)
        except ProviderError as exc:
            run.journal.fail_call(call_id, billed=exc.billed, note=exc.message)
            raise
        except Exception as exc:  # a provider bug: nobody knows whether it billed
            run.journal.fail_call(call_id, billed=None, note=f"{type(exc).__name__}: {exc}")
            raise
        run.journal.complete_call(call_id, completion)
        return completion


class HostedKernel:
    """A ``MontyKernel`` whose steps are journaled, replayed on a resume, and recovered from checkpoints."""

    name = "monty"

    def __init__(self, monty: MontyKernel, run: HostedRun) -> None:
        self.monty = monty
        self.run = run
        self.current_step: int | None = None
        self._steps_in_turn: dict[int, int] = {}
        self._bridge: dict[str, Callable[..., Any]] = {}
        self._prelude = ""
        self._live = False
        self._recovery: Recovery | None = None  # what the kernel recovered from on a resume
        self._resumed = False  # the first step run live after a resume was reached
        self._answer: str | None = None
        self._refusals: dict[str, int] = {}
        self._bridge_lock = threading.Lock()

    # --- the bridge, watched ------------------------------------------------------------

    def _watch(self, bridge: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
        watched = dict(bridge)
        final_answer = bridge["_final_answer"]
        query, batched = bridge["_llm_query"], bridge["_llm_query_batched"]

        def _final_answer(value: Any) -> Any:
            answer = final_answer(value)
            self._answer = render_answer(value)
            return answer

        def _llm_query(*args: Any, **kwargs: Any) -> Any:
            result = query(*args, **kwargs)
            self._count([result])
            return result

        def _llm_query_batched(*args: Any, **kwargs: Any) -> Any:
            results = batched(*args, **kwargs)
            self._count(results if isinstance(results, list) else [])
            return results

        watched.update(_final_answer=_final_answer, _llm_query=_llm_query, _llm_query_batched=_llm_query_batched)
        return watched

    def _count(self, results: list[Any]) -> None:
        with self._bridge_lock:
            for result in results:
                code = result.get("error_code") if isinstance(result, dict) else None
                if code in COUNTED_REFUSALS:
                    self._refusals[code] = self._refusals.get(code, 0) + 1

    # --- the Kernel protocol ------------------------------------------------------------

    def start(self, bridge: dict[str, Callable[..., Any]], prelude: str) -> None:
        self._bridge = self._watch(dict(bridge))
        self._prelude = prelude
        if self.run.plan is None:
            self.monty.start(self._bridge, prelude)
            self._live = True
        # A resume defers the recovery to the first step that is not replayed: that step, or the pending
        # host call the previous worker was in, must see the session's position (turn, history) as it was.

    def execute(self, code: str) -> StepResult:
        run, plan = self.run, self.run.plan
        turn = run.current_turn()
        index = self._steps_in_turn.get(turn, 0)
        self._steps_in_turn[turn] = index + 1
        self.current_step = index
        self._answer, self._refusals = None, {}
        if run.cancelled():
            return _stopped_step()
        if plan is not None and (turn, index) in plan.steps:
            if (turn, index) in plan.rerun:
                return self._rerun(turn, index, code)
            return self._replay(turn, index)
        if plan is not None and not self._resumed:
            self._resumed = True
            resumed = self._go_live(turn, index)
            if resumed is not None:
                return resumed
        else:
            assert self.monty.last_checkpoint is not None
            run.journal.start_step(turn, index, self.monty.last_checkpoint.seq)
        with telemetry.span("specialist.step", attributes={"specialists.turn": turn, "specialists.step": index}) as span:
            result = self.monty.execute(code)
            telemetry.annotate(span, **{"specialists.ok": result.ok, "specialists.error_code": result.error_code,
                                        "specialists.output_bytes": result.stdout_bytes})
        run.journal.finish_step(turn, index, result, answer=self._answer, refusals=self._refusals)
        return result

    def close(self) -> None:
        self.monty.close()

    # --- resume -------------------------------------------------------------------------

    def _replay(self, turn: int, index: int) -> StepResult:
        assert self.run.plan is not None
        record = self.run.plan.steps[(turn, index)]
        self._history(turn, index)
        if record.answer is not None:
            self._bridge["_final_answer"](record.answer)
        assert record.result is not None
        return step_from_json(record.result)

    def _rerun(self, turn: int, index: int, code: str) -> StepResult:
        """A step that ended after the record the resume restored: its code runs again for the namespace it
        leaves (its calls are deterministic reads: a step that made a paid call always has the record after it
        written, store.CheckpointPolicy), and the model is shown what it was shown (the journal's result)."""
        assert self.run.plan is not None
        record = self.run.plan.steps[(turn, index)]
        self._recover()
        with telemetry.span("specialist.step", attributes={"specialists.turn": turn, "specialists.step": index,
                                                           "specialists.rerun": True}):
            self.monty.execute(code)
        assert record.result is not None
        return step_from_json(record.result)

    def _recover(self) -> Recovery:
        """Recover the newest checkpoint, once per resume; what it recovered."""
        if not self._live:
            self._recovery = self.monty.recover(self._bridge, self._prelude)
            self._live = True
        assert self._recovery is not None, "only a resumed run recovers (a fresh one is live from its start)"
        return self._recovery

    def _history(self, turn: int, index: int) -> None:
        """Give the session's history the semantic calls this step made before the resume, in their order."""
        assert self.run.plan is not None and self.run.info is not None
        history = self.run.info.history
        for prompt, answer in self.run.plan.step_subcalls.get((turn, index), ()):
            history.add("subcall", f"PROMPT:\n{prompt}\n\nANSWER:\n{answer}", turn=turn, title=prompt[:SUBCALL_TITLE_CHARS])

    def _go_live(self, turn: int, index: int) -> StepResult | None:
        """Recover the newest checkpoint; finish the interrupted step if this is it. None: run the code."""
        plan = self.run.plan
        assert plan is not None
        interrupted = plan.interrupted
        if interrupted is not None and (interrupted.turn, interrupted.index) != (turn, index):
            raise ResumeDiverged(
                f"the resumed run reached step {index} of turn {turn}, but the journal says step "
                f"{interrupted.index} of turn {interrupted.turn} was interrupted; the job cannot be resumed safely"
            )
        self._history(turn, index)
        recovery = self._recover()
        if interrupted is None:
            assert self.monty.last_checkpoint is not None
            self.run.journal.start_step(turn, index, self.monty.last_checkpoint.seq)
            return None
        if recovery.kind == "pending_call":
            assert recovery.step is not None
            result = recovery.step
        elif plan.latest_seq > interrupted.base_seq:
            result = StepResult(ok=True, stdout=RESULT_LOST, stdout_truncated=False, stdout_bytes=0, error_code=None,
                                error=None, duration_s=0.0, restored_from_checkpoint=False)
        else:
            return None  # the step never reached a host call: run its code again from where it started
        self.run.journal.finish_step(turn, index, result, answer=self._answer, refusals=self._refusals)
        return result


def _stopped_step() -> StepResult:
    return StepResult(ok=False, stdout="", stdout_truncated=False, stdout_bytes=0, error_code="exception",
                      error="the run was asked to stop (cancel, deadline or a lost claim); this step did not run",
                      duration_s=0.0, restored_from_checkpoint=False)

