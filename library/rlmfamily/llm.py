"""Sub-calls: ``llm_query`` and ``llm_query_batched``, with named caps, failures returned as data.

A sub-call asks one focused question over text the caller holds (a string, a
chunk, or a list of them). Every limit is a setting: calls per run, batch size,
concurrency, prompt and response characters, per-call timeout. An oversized
prompt, a timeout, a provider error or a spent budget comes back as an
``LLMResult`` with ``ok=False``, an ``error_code`` and ``advice`` - never as an
exception into the model's code. Each call is admitted by the run's budget and
settles its usage there, also when it answers after its timeout. A call its
family already asked (same model, messages and context) is answered from the
memo (rlmfamily/memo.py) instead: no budget call, no tokens, recorded as cached.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from rlmfamily.budget import Budget
from rlmfamily.errors import BudgetError, ProviderError, RLMError
from rlmfamily.memo import MemoHit, MemoKey, SubcallMemo
from rlmfamily.providers.base import Completion, Provider, Usage, estimate_tokens
from rlmfamily.settings import RLMSettings

SUBCALL_SYSTEM = (
    "You answer one focused question about the text you are given. Use only that text. "
    "Be brief and exact; quote file paths, names and numbers as they appear. "
    "If the text does not contain the answer, say NONE."
)
PREVIEW_CHARS = 60
BATCH_DEADLINE_SHARE = 0.95  # of host_call_timeout_s: a batch returns what it has before its host call is cut
MIN_CALL_S = 0.05  # less time than this left: do not send the call at all
# The client's own timeout is the sub-call's plus this: the sub-call's deadline always ends it first (its note
# names RLM_SUBCALL_TIMEOUT_S), and an answer that arrives within the grace still settles its usage.
CLIENT_GRACE_S = 1.0
PROMPT_TOO_LARGE_ADVICE = ("Split the text with context.chunk(size=...) or select() fewer files, "
                           "then ask about each piece with llm_query_batched.")


@dataclass(frozen=True)
class LLMResult:
    """The handle a sub-call returns. ``repr`` is a short preview; ``str`` is the text."""

    text: str
    ok: bool
    error: str | None = None
    error_code: str | None = None
    advice: str | None = None
    truncated: bool = False
    usage: dict[str, Any] | None = None
    model: str | None = None
    duration_s: float = 0.0

    def __repr__(self) -> str:
        if not self.ok:
            return f"LLMResult(error={self.error_code}: {(self.error or '')[:PREVIEW_CHARS]!r})"
        preview = self.text[:PREVIEW_CHARS] + ("…" if len(self.text) > PREVIEW_CHARS else "")
        more = ", truncated" if self.truncated else ""
        return f"LLMResult({preview!r}, {len(self.text)} chars{more})"

    def __str__(self) -> str:
        return self.text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SubcallRecord:
    """What the trajectory and history keep of one sub-call."""

    seq: int
    turn: int
    prompt: str
    context_chars: int
    ok: bool
    error_code: str | None
    response: str
    truncated: bool
    usage: dict[str, Any] | None
    model: str | None
    duration_s: float
    budget_entry: int | None
    cached: bool = False  # answered from the family's memo: no budget entry, no tokens
    cached_from: dict[str, Any] | None = None  # the run and budget entry that paid for the answer
    sources: tuple[str, ...] = ()  # which chunks the context was: "path:first-last" lines, or a handle's type


def _failure(code: str, error: str, advice: str) -> LLMResult:
    return LLMResult(text="", ok=False, error=error, error_code=code, advice=advice)


ContextResolver = Callable[[Any], str]
RecordSink = Callable[[SubcallRecord], None]


class _InOrder:
    """Hands a batch's records on in input order as they come: a record waits only for the prompts before it."""

    def __init__(self, on_record: RecordSink | None, count: int) -> None:
        self._on_record = on_record
        self._lock = threading.Lock()
        self._records: list[SubcallRecord | None] = [None] * count
        self._done = [False] * count
        self._next = 0

    def put(self, index: int, record: SubcallRecord) -> None:
        with self._lock:
            self._records[index] = record

    def done(self, index: int) -> None:
        """Prompt ``index`` is over (a prompt refused before it was sent leaves no record)."""
        with self._lock:
            self._done[index] = True
            while self._next < len(self._done) and self._done[self._next]:
                record, self._next = self._records[self._next], self._next + 1
                if record is not None and self._on_record is not None:
                    self._on_record(record)


class SubcallRunner:
    """Runs the sub-calls of one session against its provider and budget."""

    def __init__(
        self,
        *,
        provider: Provider,
        budget: Budget,
        settings: RLMSettings,
        resolve_context: ContextResolver | None = None,
        describe_context: Callable[[Any], tuple[str, ...]] | None = None,
        on_record: Callable[[SubcallRecord], None] | None = None,
        model: str | None = None,
        memo: SubcallMemo | None = None,
    ) -> None:
        self.provider = provider
        self.memo = memo
        self.budget = budget
        self.settings = settings
        self.resolve_context = resolve_context or _plain_text
        self.describe_context = describe_context or (lambda context: ())
        self.on_record = on_record
        self.model = model
        self.current_turn = 0
        self._lock = threading.Lock()
        self._admitted = 0
        self._seq = 0
        self._cached = 0

    @property
    def admitted(self) -> int:
        return self._admitted

    @property
    def cached(self) -> int:
        """Sub-calls of this run answered from the memo."""
        return self._cached

    def continue_from(self, *, admitted: int, seq: int) -> None:
        """A resumed run counts on from the sub-calls its earlier processes made (max_subcalls, numbering)."""
        with self._lock:
            self._admitted, self._seq = admitted, seq

    # ---------- public ----------

    def query(self, prompt: Any, context: Any = "", model: str | None = None,
              deadline: float | None = None) -> LLMResult:
        return self._guarded(prompt, context, model, deadline)

    def _guarded(self, prompt: Any, context: Any, model: str | None, deadline: float | None,
                 seq: int | None = None, record: RecordSink | None = None) -> LLMResult:
        try:
            return self._one(prompt, context, model, deadline, seq, record)
        except Exception as exc:  # noqa: BLE001 - the model's code must get data, never our crash
            return _failure("internal_error", f"{type(exc).__name__}: {exc}", "Retry once; if it repeats, continue without it.")

    def query_batched(
        self, prompts: Any, contexts: Any = None, model: str | None = None
    ) -> list[LLMResult]:
        """Results, sequence numbers and recorded sub-calls in input order; one failure does not fail the batch."""
        if not isinstance(prompts, (list, tuple)):
            return [_failure("invalid_argument", "llm_query_batched takes a list of prompts",
                             "Pass a list: llm_query_batched([p1, p2], [c1, c2]).")]
        count = len(prompts)
        if contexts is None:
            contexts = [""] * count
        if not isinstance(contexts, (list, tuple)) or len(contexts) != count:
            return [_failure("invalid_argument", f"{count} prompts but contexts is not a list of {count}",
                             "Give one context per prompt, or none.") for _ in range(count)]
        cap = self.settings.max_batch_size
        if count > cap:
            return [_failure("batch_too_large", f"a batch of {count} prompts; at most {cap} are accepted (RLM_MAX_BATCH_SIZE)",
                             f"Send the prompts in slices of at most {cap}.") for _ in range(count)]
        if count == 0:
            return []
        workers = min(self.settings.max_concurrency, count)
        # The whole batch is one host call with its own deadline: finish inside it, so the answers
        # that did arrive reach the code instead of being lost to a TimeoutError.
        deadline = time.monotonic() + self.settings.host_call_timeout_s * BATCH_DEADLINE_SHARE
        with self._lock:
            first_seq = self._seq + 1
            self._seq += count
        in_order = _InOrder(self.on_record, count)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlm-subcall") as pool:
            futures = [pool.submit(self._batch_item, in_order, i, first_seq + i, p, c, model, deadline)
                       for i, (p, c) in enumerate(zip(prompts, contexts))]
            return [f.result() for f in futures]

    def _batch_item(self, in_order: _InOrder, index: int, seq: int, prompt: Any, context: Any, model: str | None,
                    deadline: float) -> LLMResult:
        try:
            return self._guarded(prompt, context, model, deadline, seq, lambda record: in_order.put(index, record))
        finally:
            in_order.done(index)

    # ---------- one call ----------

    def _one(self, prompt: Any, context: Any, model: str | None, deadline: float | None = None,
             seq: int | None = None, record: RecordSink | None = None) -> LLMResult:
        timeout_s = self.settings.subcall_timeout_s
        if deadline is not None:
            timeout_s = min(timeout_s, deadline - time.monotonic())
            if timeout_s < MIN_CALL_S:
                return _failure(
                    "timeout",
                    "the batch ran out of time before this prompt was sent "
                    f"(one batch must finish within RLM_HOST_CALL_TIMEOUT_S={self.settings.host_call_timeout_s:g})",
                    "Send fewer prompts per batch, or retry the ones that timed out.",
                )
        if not isinstance(prompt, str):
            return _failure("invalid_argument", f"the prompt must be a string, not {type(prompt).__name__}",
                            "Pass the question as a string and the text as context=.")
        try:
            context_text = self.resolve_context(context)
        except RLMError as exc:
            if exc.setting == "max_prompt_chars":  # the resolver stopped at the cap rather than read it all
                return _failure("prompt_too_large", exc.message, PROMPT_TOO_LARGE_ADVICE)
            return _failure("invalid_context", exc.message, "Pass a string, a chunk, or a list of them as context.")
        sources = self.describe_context(context)
        total = len(prompt) + len(context_text)
        cap = self.settings.max_prompt_chars
        if total > cap:
            return _failure(
                "prompt_too_large",
                f"prompt and context are {total:,} characters; a sub-call takes at most {cap:,} (RLM_MAX_PROMPT_CHARS)",
                PROMPT_TOO_LARGE_ADVICE,
            )
        with self._lock:
            if self._admitted >= self.settings.max_subcalls:
                return _failure(
                    "subcall_limit",
                    f"this run has used all {self.settings.max_subcalls} sub-calls (RLM_MAX_SUBCALLS)",
                    "Combine the answers you have and call final_answer().",
                )
            self._admitted += 1
            if seq is None:  # a batch numbered its prompts in input order
                self._seq += 1
                seq = self._seq
        model_id = model or self.model
        content = f"{context_text}\n\n{prompt}" if context_text else prompt
        messages = [{"role": "system", "content": SUBCALL_SYSTEM}, {"role": "user", "content": content}]
        memo_key = None
        if self.memo is not None:
            memo_key = MemoKey.of(model_id or getattr(self.provider, "default_model", None), messages, context_text)
            hit = self.memo.lookup(memo_key)
            if hit is not None:  # before admission: a repeat is free even when the budget is spent
                return self._from_memo(seq, prompt, context_text, hit, record, sources)
        prompt_estimate = estimate_tokens(total + len(SUBCALL_SYSTEM))
        completion_estimate = estimate_tokens(self.settings.max_response_chars)
        prices = getattr(self.provider, "prices", None)
        usd_estimate = (prices.cost(model_id or getattr(self.provider, "default_model", ""), prompt_estimate,
                                    completion_estimate) if prices is not None else None)
        try:
            entry = self.budget.admit("subcall", tokens_estimate=prompt_estimate + completion_estimate, keep_calls=1,
                                      keep_tokens=self.settings.final_reserve_tokens, usd_estimate=usd_estimate)
        except BudgetError as exc:
            result = _failure(exc.code, exc.message, "The inference budget is spent: answer now with final_answer().")
            self._record(seq, prompt, context_text, result, None, record, sources=sources)
            return result
        result = self._call(messages, model_id, entry, timeout_s)
        if memo_key is not None and result.ok and not result.truncated:  # only complete answers are kept
            self.memo.store(memo_key, response=result.text, model=result.model, usage=result.usage,
                            budget_entry=entry)
        self._record(seq, prompt, context_text, result, entry, record, sources=sources)
        return result

    def _from_memo(self, seq: int, prompt: str, context_text: str, hit: MemoHit,
                   record: RecordSink | None, sources: tuple[str, ...]) -> LLMResult:
        """The model gets the answer as it first came, its usage marked cached at zero cost (the first call's
        usage stays with the first call); the record says it was cached and which entry paid for it."""
        with self._lock:
            self._cached += 1
        usage = {**Usage(0, 0, 0.0).to_dict(), "cached": True}
        result = LLMResult(text=hit.response, ok=True, usage=usage, model=hit.model)
        self._record(seq, prompt, context_text, result, None, record,
                     cached_from={"run_id": hit.paid_by_run, "budget_entry": hit.budget_entry}, sources=sources)
        return result

    def _call(self, messages: list[dict[str, Any]], model: str | None, entry: int, timeout_s: float) -> LLMResult:
        started = time.monotonic()
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                completion = self.provider.complete(messages, tools=None, model=model,
                                                    timeout_s=timeout_s + CLIENT_GRACE_S, purpose="subcall")
                self.budget.settle(entry, completion.usage)  # also settles a call that answered too late
                outcome["completion"] = completion
            except ProviderError as exc:
                if exc.billed is False:
                    self.budget.fail(entry, exc.message)
                else:
                    self.budget.mark_unknown(entry, exc.message)
                outcome["error"] = exc
            except Exception as exc:  # noqa: BLE001 - a provider bug is still the caller's data
                self.budget.mark_unknown(entry, f"{type(exc).__name__}: {exc}")
                outcome["error"] = exc
            finally:
                done.set()

        # A daemon thread: a provider that ignores its timeout cannot hold the step past ours.
        threading.Thread(target=run, name="rlm-provider-call", daemon=True).start()
        if not done.wait(timeout_s):
            self.budget.mark_unknown(entry, f"no answer within {timeout_s:g} s")
            return LLMResult(
                text="", ok=False, error=f"no answer within {timeout_s:.3g} s (RLM_SUBCALL_TIMEOUT_S)",
                error_code="timeout", advice="Ask about a smaller piece of text, or retry once.",
                duration_s=round(time.monotonic() - started, 3),
            )
        duration = round(time.monotonic() - started, 3)
        error = outcome.get("error")
        if error is not None:
            code = error.code if isinstance(error, RLMError) else "provider_error"
            message = error.message if isinstance(error, RLMError) else f"{type(error).__name__}: {error}"
            if code == "provider_timeout":
                code = "timeout"
            return LLMResult(text="", ok=False, error=message, error_code=code,
                             advice="Retry once, or continue without this answer.", duration_s=duration)
        completion: Completion = outcome["completion"]
        text = completion.text
        cap = self.settings.max_response_chars
        truncated = len(text) > cap
        return LLMResult(
            text=text[:cap],
            ok=True,
            truncated=truncated,
            usage=completion.usage.to_dict() if completion.usage else None,
            model=completion.model,
            duration_s=duration,
            advice=f"The answer was cut at {cap:,} characters (RLM_MAX_RESPONSE_CHARS)." if truncated else None,
        )

    def _record(self, seq: int, prompt: str, context_text: str, result: LLMResult, entry: int | None,
                record: RecordSink | None, cached_from: dict[str, Any] | None = None,
                sources: tuple[str, ...] = ()) -> None:
        deliver = record or self.on_record
        if deliver is None:
            return
        deliver(
            SubcallRecord(
                seq=seq, turn=self.current_turn, prompt=prompt, context_chars=len(context_text), ok=result.ok,
                error_code=result.error_code, response=result.text if result.ok else (result.error or ""),
                truncated=result.truncated, usage=None if cached_from else result.usage, model=result.model,
                duration_s=result.duration_s, budget_entry=entry, cached=cached_from is not None,
                cached_from=cached_from, sources=sources,
            )
        )


def _plain_text(context: Any) -> str:
    if context is None:
        return ""
    if isinstance(context, str):
        return context
    if isinstance(context, Sequence):
        return "\n\n".join(_plain_text(c) for c in context)
    if hasattr(context, "labelled"):
        return str(context.labelled())
    return str(context)
