"""The end of a run through `rlm run`, the real OpenAI client and a local chat-completions server.

A call whose usage nobody knows must not end the run without an answer: it is
counted at its estimate for admission and stays unknown in the books, and the
call kept for the final answer is always made. A reply to the final request
that calls python is not a plain-text answer, whatever text came with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import FakeOpenAI
from .test_cli import rlm

pytestmark = pytest.mark.timeout(120)

HARBOR = "library/rlmfamily/examples/harbor"


def _run(fake: FakeOpenAI, data: Path, *args: str, env: dict[str, str] | None = None):
    return rlm("run", "--repo", HARBOR, "--base-url", fake.base_url, "--model", "m-1", "--api-key-env",
               "TEST_RLM_KEY", *args, "how many files?", data_dir=data, env={"TEST_RLM_KEY": "sk-local", **(env or {})})


def _unresolved(data: Path) -> list[dict]:
    return json.loads(rlm("usage", "--json", data_dir=data).stdout)["unresolved"]


def _step_output(data: Path) -> str:
    shown = json.loads(rlm("show", "last", "--json", data_dir=data).stdout)
    return "\n".join(str(event.get("observation", "")) for event in shown if event.get("event") == "step")


def test_a_sub_call_answered_without_usage_does_not_end_the_run(tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    fake_openai.push(code='r = llm_query("How many files?", context="ten files")\nprint(r.ok, r.text)')
    fake_openai.push(text="10", usage=False)  # the sub-call: an endpoint that omits usage
    fake_openai.push(code='final_answer("files: " + str(len(context.files())))')
    run = _run(fake_openai, tmp_path / "data")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "files: 10"
    assert "1 calls with unknown usage" in run.stderr
    (entry,) = _unresolved(tmp_path / "data")
    assert entry["purpose"] == "subcall" and entry["state"] == "unknown" and entry["tokens"] is None


def test_a_sub_call_timeout_does_not_end_the_run(tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    fake_openai.push(code='r = llm_query("How many files?", context="ten files")\nprint(r.ok, r.error_code, r.error)')
    fake_openai.push(text="10", hold=True)  # the sub-call: held until the test ends
    fake_openai.push(code='final_answer("after the timeout")')
    run = _run(fake_openai, tmp_path / "data", env={"RLM_SUBCALL_TIMEOUT_S": "0.5"})
    assert fake_openai.hold.let_go == 0, "the sub-call must have timed out while the server still held it"
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "after the timeout"
    (entry,) = _unresolved(tmp_path / "data")
    # The sub-call's own deadline ends it, not the client's: the client is given RLM_SUBCALL_TIMEOUT_S
    # plus a grace, so what the model and the books say names the setting to change.
    assert entry["purpose"] == "subcall" and entry["note"] == "no answer within 0.5 s", entry["note"]
    assert "no answer within 0.5 s (RLM_SUBCALL_TIMEOUT_S)" in _step_output(tmp_path / "data")


def test_the_final_answer_request_is_made_after_a_turn_spent_the_token_allowance(tmp_path: Path,
                                                                                fake_openai: FakeOpenAI) -> None:
    fake_openai.push(code="x = 40", prompt_tokens=12_000)  # more than the estimate, and more than the allowance
    fake_openai.push(code='final_answer("the limit is " + str(x))')
    run = _run(fake_openai, tmp_path / "data", "--max-tokens", "10000", env={"RLM_FINAL_RESERVE_TOKENS": "2000"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "the limit is 40"
    assert "budget_exhausted after 2 turns" in run.stderr
    assert "Answer now" in fake_openai.requests[-1]["messages"][-1]["content"]


def test_text_with_a_failing_tool_call_in_the_final_reply_is_not_the_answer(tmp_path: Path,
                                                                           fake_openai: FakeOpenAI) -> None:
    fake_openai.push(code="x = 1")
    fake_openai.push(text="Let me compute the answer first.", code="1 / 0")
    run = _run(fake_openai, tmp_path / "data", "--max-turns", "1")
    assert run.returncode == 1, run.stdout
    assert run.stdout.strip() == ""
    assert "Let me compute" not in run.stdout
    assert "max_turns after 2 turns" in run.stderr
    assert "no answer" in run.stderr and "called python" in run.stderr
