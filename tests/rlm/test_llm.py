"""Sub-calls: named caps, failures returned as data with advice, batches in input order."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rlmfamily.budget import Budget, BudgetLimits
from rlmfamily.context import Context
from rlmfamily.llm import LLMResult, SubcallRunner
from rlmfamily.namespace import AnswerBox, Bridge
from rlmfamily.providers import ScriptedProvider
from rlmfamily.providers.base import Completion

from .holds import DEADLINE_SLACK_S, HOLD_LIMIT_S, Hold, wait_until

pytestmark = pytest.mark.timeout(30)

ECHO = [{"pattern": r"item (\d+)", "answer": r"answer \1"}, {"pattern": "explode", "error": "model overloaded"}]


def _runner(tmp_path: Path, make_settings, provider: Any, *, limits: BudgetLimits | None = None,
            **settings: Any) -> SubcallRunner:
    s = make_settings(**settings)
    budget = Budget(tmp_path / "budget.sqlite3", "root", limits or BudgetLimits(max_calls=100))
    return SubcallRunner(provider=provider, budget=budget, settings=s)


def _scripted(write_script, rules=ECHO, **top: Any) -> ScriptedProvider:
    return ScriptedProvider.from_file(write_script([], rules, **top))


def test_a_sub_call_returns_a_compact_handle(tmp_path: Path, make_settings, write_script) -> None:
    runner = _runner(tmp_path, make_settings, _scripted(write_script))
    result = runner.query("What is item 7?", context="some text")
    assert result.ok and result.text == "answer 7" and result.usage["total_tokens"] > 0
    assert repr(result) == "LLMResult('answer 7', 8 chars)"
    assert str(result) == "answer 7"
    long = LLMResult(text="x" * 500, ok=True)
    assert len(repr(long)) < 100


def test_an_oversized_prompt_comes_back_as_data_naming_the_setting(tmp_path: Path, make_settings, write_script) -> None:
    provider = _scripted(write_script)
    runner = _runner(tmp_path, make_settings, provider, max_prompt_chars=1000)
    result = runner.query("item 1", context="y" * 2000)
    assert not result.ok and result.error_code == "prompt_too_large"
    assert "RLM_MAX_PROMPT_CHARS" in result.error and "chunk" in result.advice
    assert provider.calls["subcall"] == 0, "an oversized prompt must never reach the model"


def test_the_number_of_sub_calls_is_capped(tmp_path: Path, make_settings, write_script) -> None:
    runner = _runner(tmp_path, make_settings, _scripted(write_script), max_subcalls=2)
    assert runner.query("item 1").ok and runner.query("item 2").ok
    third = runner.query("item 3")
    assert third.error_code == "subcall_limit" and "RLM_MAX_SUBCALLS" in third.error


def test_a_provider_error_comes_back_as_data(tmp_path: Path, make_settings, write_script) -> None:
    runner = _runner(tmp_path, make_settings, _scripted(write_script))
    result = runner.query("explode please")
    assert not result.ok and result.error_code == "provider_error" and "overloaded" in result.error
    assert runner.budget.snapshot().calls == 1 and runner.budget.snapshot().unknown_tokens == 0


class _HeldProvider:
    """Holds the calls whose prompt matches ``held`` until the test releases them; records every prompt sent."""

    name = "held"

    def __init__(self, inner: ScriptedProvider, hold: Hold, held: str) -> None:
        self.inner = inner
        self.default_model = inner.default_model
        self.hold = hold
        self.held = re.compile(held)
        self.sent: list[str] = []

    def complete(self, messages: list[dict[str, Any]], **kw: Any) -> Completion:
        prompt = messages[-1]["content"]
        self.sent.append(prompt)
        if self.held.search(prompt):
            self.hold()
        return self.inner.complete(messages, **kw)


def test_a_timeout_comes_back_as_data_and_the_late_answer_still_settles(tmp_path: Path, make_settings,
                                                                       write_script) -> None:
    hold = Hold()
    provider = _HeldProvider(_scripted(write_script, [{"pattern": "slow", "answer": "finally"}]), hold, "slow")
    runner = _runner(tmp_path, make_settings, provider, subcall_timeout_s=0.3, final_reserve_tokens=1_000,
                     limits=BudgetLimits(max_tokens=10_000))
    result = runner.query("slow question")
    assert hold.let_go == 0, "RLM_SUBCALL_TIMEOUT_S must end the call while the provider still holds its answer"
    assert result.duration_s < runner.settings.subcall_timeout_s + DEADLINE_SLACK_S, "RLM_SUBCALL_TIMEOUT_S"
    assert result.error_code == "timeout" and "RLM_SUBCALL_TIMEOUT_S" in result.error
    assert runner.budget.snapshot().unknown_tokens == 1
    hold.release()
    wait_until(lambda: runner.budget.snapshot().unknown_tokens == 0, "the late answer settles its usage")
    assert runner.budget.snapshot().tokens > 0


def test_a_spent_budget_comes_back_as_data(tmp_path: Path, make_settings, write_script) -> None:
    runner = _runner(tmp_path, make_settings, _scripted(write_script), limits=BudgetLimits(max_calls=2))
    assert runner.query("item 1").ok  # one call is always kept back for the final answer
    spent = runner.query("item 2")
    assert spent.error_code == "budget_exhausted" and "final_answer" in spent.advice


def test_a_long_answer_is_truncated_and_says_so(tmp_path: Path, make_settings, write_script) -> None:
    provider = _scripted(write_script, [{"pattern": "essay", "answer": "w" * 500}])
    result = _runner(tmp_path, make_settings, provider, max_response_chars=100).query("write an essay")
    assert result.ok and result.truncated and len(result.text) == 100
    assert "RLM_MAX_RESPONSE_CHARS" in result.advice


def test_a_batch_answers_in_input_order_and_one_failure_does_not_fail_it(tmp_path: Path, make_settings,
                                                                         write_script) -> None:
    runner = _runner(tmp_path, make_settings, _scripted(write_script))
    prompts = [f"item {i}" for i in range(6)] + ["explode"] + [f"item {i}" for i in range(6, 9)]
    results = runner.query_batched(prompts)
    assert [r.text for r in results if r.ok] == [f"answer {i}" for i in range(9)]
    assert [r.ok for r in results].index(False) == 6
    assert results[6].error_code == "provider_error"


def test_a_batch_over_the_cap_is_refused_as_data(tmp_path: Path, make_settings, write_script) -> None:
    provider = _scripted(write_script)
    results = _runner(tmp_path, make_settings, provider, max_batch_size=4, max_concurrency=2).query_batched(
        [f"item {i}" for i in range(5)])
    assert len(results) == 5 and all(r.error_code == "batch_too_large" for r in results)
    assert "RLM_MAX_BATCH_SIZE" in results[0].error and provider.calls["subcall"] == 0


class _CountingProvider:
    """Wraps the scripted provider to record how many calls overlap.

    Every call waits until ``expected`` calls are in at once (or HOLD_LIMIT_S passes), so the
    overlap does not depend on how promptly the pool's threads are scheduled.
    """

    name = "counting"

    def __init__(self, inner: ScriptedProvider, expected: int) -> None:
        self.inner = inner
        self.default_model = inner.default_model
        self.expected = expected
        self.all_in = threading.Event()
        self.active = 0
        self.peak = 0
        self.lock = threading.Lock()

    def complete(self, messages: list[dict[str, Any]], **kw: Any) -> Completion:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            if self.active >= self.expected:
                self.all_in.set()
        try:
            self.all_in.wait(HOLD_LIMIT_S)
            return self.inner.complete(messages, **kw)
        finally:
            with self.lock:
                self.active -= 1


def test_a_batch_runs_concurrently_within_the_named_bound(tmp_path: Path, make_settings, write_script) -> None:
    provider = _CountingProvider(_scripted(write_script), expected=3)
    runner = _runner(tmp_path, make_settings, provider, max_concurrency=3)
    results = runner.query_batched([f"item {i}" for i in range(12)])
    assert all(r.ok for r in results)
    assert provider.peak == 3, "RLM_MAX_CONCURRENCY=3 calls must run at once, and never more"


def test_chunks_and_search_hits_are_sent_as_their_labelled_text(tmp_path: Path, make_settings, write_script,
                                                               fixture_repo: Path) -> None:
    s = make_settings()
    ctx = Context.from_repository(fixture_repo, s)
    provider = _scripted(write_script, [{"pattern": r"=== (src/limits.py) \[(\d+):(\d+)\] ===\n.*MAX_CRATES = (\d+)",
                                         "answer": r"\1 says \4"}])
    budget = Budget(tmp_path / "b.sqlite3", "root", BudgetLimits(max_calls=10))
    bridge_box: dict[str, Bridge] = {}
    runner = SubcallRunner(provider=provider, budget=budget, settings=s,
                           resolve_context=lambda v: bridge_box["b"].resolve_context(v))
    bridge_box["b"] = Bridge(context=ctx, subcalls=runner, history=None, answer=AnswerBox(),  # type: ignore[arg-type]
                             max_answer_chars=1000, current_turn=lambda: 1)
    chunk = ctx.select("src/limits.py").chunk(1000)[0]
    assert runner.query("what is the limit?", context=chunk.ref()).text == "src/limits.py says 40"
    assert runner.query("what is the limit?", context=[chunk.ref()]).text == "src/limits.py says 40"


def test_a_prompt_that_is_not_a_string_is_refused_as_data(tmp_path: Path, make_settings, write_script) -> None:
    result = _runner(tmp_path, make_settings, _scripted(write_script)).query(42)  # type: ignore[arg-type]
    assert result.error_code == "invalid_argument"


def test_a_slow_batch_returns_what_arrived_before_its_host_call_deadline(tmp_path: Path, make_settings,
                                                                         write_script) -> None:
    hold = Hold()
    provider = _HeldProvider(_scripted(write_script), hold, r"item [23]")
    # One call at a time: items 0 and 1 answer at once, item 2 is held past the batch's deadline
    # (a share of RLM_HOST_CALL_TIMEOUT_S, shorter than RLM_SUBCALL_TIMEOUT_S), item 3 is never sent.
    # The deadline leaves items 0 and 1 ample time on a loaded machine.
    runner = _runner(tmp_path, make_settings, provider, host_call_timeout_s=2.0, subcall_timeout_s=2.0,
                     max_concurrency=1, max_batch_size=4)
    started = time.monotonic()
    try:
        results = runner.query_batched([f"item {i}" for i in range(4)])
        assert hold.let_go == 0, "the batch must end at its own deadline while item 2's answer is still held"
    finally:
        hold.release()
    assert time.monotonic() - started < runner.settings.host_call_timeout_s + DEADLINE_SLACK_S, \
        "the batch must end by its host call's deadline (RLM_HOST_CALL_TIMEOUT_S)"
    assert [r.text for r in results[:2]] == ["answer 0", "answer 1"]
    assert [r.error_code for r in results[2:]] == ["timeout", "timeout"]
    assert "RLM_HOST_CALL_TIMEOUT_S" in results[3].error
    assert provider.sent == ["item 0", "item 1", "item 2"], "a prompt with no time left is never sent"


def test_a_batch_under_a_usd_cap_sends_only_what_the_cap_can_pay_for(tmp_path: Path, make_settings,
                                                                      fake_openai) -> None:
    # bench/rlm_vs_rlms.py measured four sub-calls admitted together spend twice a $0.05 cap: calls in flight
    # now count at their list-price estimates (prompt / 4 + max_response_chars / 4 tokens).
    from rlmfamily.providers import OpenAIProvider, PriceTable

    for _ in range(4):  # each answer costs about what it was estimated at, whenever it settles
        fake_openai.push(text="NONE", hold=True, prompt_tokens=6_000, completion_tokens=5)
    provider = OpenAIProvider(base_url=fake_openai.base_url, model="m-1", api_key_env="K", environ={"K": "sk-x"},
                              prices=PriceTable({"m-1": {"prompt": 1.0, "completion": 4.0}}), max_retries=0)
    runner = _runner(tmp_path, make_settings, provider, limits=BudgetLimits(max_usd=0.01), max_concurrency=4,
                     max_response_chars=4_000)  # each call: ~2,600 + 1,000 tokens, about $0.0066
    results: list[LLMResult] = []
    batch = threading.Thread(target=lambda: results.extend(runner.query_batched(["what is it?"] * 4,
                                                                                 ["x" * 10_000] * 4)))
    batch.start()
    wait_until(lambda: len(fake_openai.requests) >= 2, "two sub-calls at the server")
    fake_openai.hold.release()
    batch.join(timeout=HOLD_LIMIT_S)
    assert len(fake_openai.requests) == 2, "the third call would have taken the family past its USD cap"
    assert [r.ok for r in results].count(True) == 2
    assert {r.error_code for r in results if not r.ok} == {"budget_exhausted"}
