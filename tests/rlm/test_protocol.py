"""The plain-text code-block protocol (RLM_PROTOCOL=text) and its automatic fallback (auto), through the real
clients against local servers that speak the OpenAI chat-completions and the Anthropic Messages wire formats.

With ``text`` no tools are sent: the model writes fenced ```python blocks in plain text, the first block of a
reply is run, and its output goes back as a user message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlmfamily import Context, Session
from rlmfamily.errors import SettingsInvalid
from rlmfamily.protocol import python_blocks
from rlmfamily.providers import OpenAIProvider
from rlmfamily.settings import load_settings

from .conftest import FakeAnthropic, FakeOpenAI
from .test_cli import rlm

pytestmark = pytest.mark.timeout(120)

HARBOR = "library/rlmfamily/examples/harbor"
FILES_THEN_ANSWER = [
    "I will count the files first.\n\n```python\nn = len(context.files())\nprint('files', n)\n```\n",
    "The count is known.\n```python\nfinal_answer(f'files: {n}')\n```",
]


def _events(trajectory: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(trajectory).read_text().splitlines()]


def _session(fake: FakeOpenAI, make_settings, repo: Path, **settings) -> Session:
    settings = make_settings(**{"protocol": "text", "max_turns": 4, **settings})
    provider = OpenAIProvider(base_url=fake.base_url, model="m-1", api_key_env="K", environ={"K": "sk-x"},
                              backoff_s=0.01, max_retries=0)
    return Session(context=Context.from_repository(repo, settings), provider=provider, settings=settings)


# ---------- reading fenced blocks ----------


def test_python_blocks_are_read_as_commonmark_fences_and_other_languages_are_not_code() -> None:
    reply = ("Output looks like:\n```\nfiles 10\n```\n"
             "1. Then run:\n   ```python\n   if True:\n       print(1)\n   ```\n"
             "~~~py\nprint(2)\n~~~\n"
             "````python\ns = '```'\nprint(s)\n````\n"
             "```text\nnot code\n```\n"
             "```Python3 title\nprint(3)\n")  # left open: runs to the end, as CommonMark reads it
    assert python_blocks(reply) == ["if True:\n    print(1)", "print(2)", "s = '```'\nprint(s)", "print(3)"]
    assert python_blocks("no code here, only `inline` code") == []


# ---------- through `rlm run` ----------


def test_rlm_run_protocol_text_against_an_openai_compatible_server_without_tool_calls(tmp_path: Path,
                                                                                      fake_openai: FakeOpenAI) -> None:
    for reply in FILES_THEN_ANSWER:
        fake_openai.push(text=reply)
    run = rlm("run", "--repo", HARBOR, "--protocol", "text", "--base-url", fake_openai.base_url, "--model", "local-7b",
              "--api-key-env", "LOCAL_KEY", "--json", "how many files?", data_dir=tmp_path / "data",
              env={"LOCAL_KEY": "unused"})
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert (result["answer"], result["stop_reason"], result["turns"]) == ("files: 10", "answered", 2)
    first, second = fake_openai.requests
    assert "tools" not in first and "tools" not in second, "a server without tool calling is sent no tools"
    assert "```python" in first["messages"][0]["content"] and "exactly one" in first["messages"][0]["content"]
    assert second["messages"][-2] == {"role": "assistant", "content": FILES_THEN_ANSWER[0]}
    observation = second["messages"][-1]
    assert observation["role"] == "user" and observation["content"].startswith("Output of your python block:\n[ok")
    assert "files 10" in observation["content"]
    steps = [e for e in _events(result["trajectory_path"]) if e["event"] == "step"]
    assert [s["code"] for s in steps] == ["n = len(context.files())\nprint('files', n)", "final_answer(f'files: {n}')"]


def test_rlm_run_protocol_text_against_the_anthropic_messages_api_keeps_the_prompt_cache_marks(
        tmp_path: Path, fake_anthropic: FakeAnthropic) -> None:
    for reply in FILES_THEN_ANSWER:
        fake_anthropic.push(text=reply)
    run = rlm("run", "--repo", HARBOR, "--protocol", "text", "--provider", "anthropic", "--base-url",
              fake_anthropic.base_url, "--model", "claude-haiku-4-5", "--api-key-env", "TEST_ANTHROPIC_KEY", "--json",
              "how many files?", data_dir=tmp_path / "data", env={"TEST_ANTHROPIC_KEY": "sk-ant-local"})
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["answer"] == "files: 10"
    first, second = fake_anthropic.requests
    assert "tools" not in first and "tools" not in second
    assert second["system"][0]["cache_control"] == {"type": "ephemeral"} and "```python" in second["system"][0]["text"]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"] == [{"type": "text", "text": FILES_THEN_ANSWER[0]}]
    (observation,) = second["messages"][2]["content"]
    assert observation["type"] == "text" and "files 10" in observation["text"]
    assert observation["cache_control"] == {"type": "ephemeral"}, "the conversation's end is cached for the next turn"


def test_rlm_run_protocol_auto_falls_back_to_text_when_the_server_refuses_tools(tmp_path: Path,
                                                                                fake_openai: FakeOpenAI) -> None:
    # Ollama's answer to a request with tools for a model whose template has none.
    fake_openai.push(status=400, message="registry.ollama.ai/library/gemma3:4b does not support tools")
    for reply in FILES_THEN_ANSWER:
        fake_openai.push(text=reply)
    run = rlm("run", "--repo", HARBOR, "--protocol", "auto", "--base-url", fake_openai.base_url, "--model",
              "gemma3:4b", "--api-key-env", "LOCAL_KEY", "--json", "how many files?", data_dir=tmp_path / "data",
              env={"LOCAL_KEY": "unused"})
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["answer"] == "files: 10"
    assert "does not support tools" in run.stderr and "RLM_PROTOCOL=text" in run.stderr, "the person is told"
    refused, first_text, _ = fake_openai.requests
    assert refused["tools"][0]["function"]["name"] == "python"
    assert "tools" not in first_text and "```python" in first_text["messages"][0]["content"]
    assert len(first_text["messages"]) == 2, "the conversation starts again, in the text protocol's words"
    assert "python tool" not in json.dumps(first_text["messages"]) and "Investigate with one ```python block" in (
        first_text["messages"][1]["content"])
    (fallback,) = [e for e in _events(result["trajectory_path"]) if e["event"] == "protocol_fallback"]
    assert fallback["protocol"] == "text" and "does not support tools" in fallback["reason"]
    shown = rlm("show", "last", data_dir=tmp_path / "data").stdout
    assert "refused the python tool (" in shown and "does not support tools" in shown
    # Every admitted call counts against max_calls; the refused one billed nothing (the fake reports 120 tokens a call).
    assert (result["budget"]["calls"], result["budget"]["tokens"]) == (3, 2 * 120)


def test_protocol_auto_keeps_any_other_refusal_an_error(tmp_path: Path, fake_openai: FakeOpenAI,
                                                        make_settings, fixture_repo: Path) -> None:
    fake_openai.push(status=400, message="This model's maximum context length is 8192 tokens")
    result = _session(fake_openai, make_settings, fixture_repo, protocol="auto").run("how many files?")
    assert result.stop_reason == "error" and "maximum context length" in (result.error or "")
    assert len(fake_openai.requests) == 1


def test_the_offline_demo_gives_the_same_answer_in_text(tmp_path: Path) -> None:
    # The scripted provider writes each turn's code as a fenced block when no tools are sent.
    demo = rlm("demo", "--json", data_dir=tmp_path / "tools")
    text = rlm("run", "--repo", HARBOR, "--script", "library/rlmfamily/examples/harbor_demo.toml", "--protocol", "text",
               "--json", "q", data_dir=tmp_path / "text")
    assert demo.returncode == 0 and text.returncode == 0, text.stderr
    tools_result, text_result = json.loads(demo.stdout), json.loads(text.stdout)
    assert text_result["answer"] == tools_result["answer"] and text_result["turns"] == tools_result["turns"]
    started = _events(text_result["trajectory_path"])[0]
    assert started["protocol"] == "text"


# ---------- the turn rules in text ----------


def test_only_the_first_block_of_a_reply_runs_and_the_model_is_told(fake_openai: FakeOpenAI, make_settings,
                                                                      fixture_repo: Path) -> None:
    fake_openai.push(text="```python\nx = 1\nprint('first', x)\n```\nthen\n```python\nx = 2\n```\n"
                          "```py\nfinal_answer(x)\n```")
    fake_openai.push(text="```python\nfinal_answer(x)\n```")
    result = _session(fake_openai, make_settings, fixture_repo).run("q")
    assert result.answer == "1", "the later blocks, written before the first one's output was seen, did not run"
    observation = fake_openai.requests[1]["messages"][-1]["content"]
    assert "first 1" in observation and "the other 2 were not" in observation


def test_a_reply_without_a_python_block_is_nudged_and_the_final_request_takes_plain_text(
        fake_openai: FakeOpenAI, make_settings, fixture_repo: Path) -> None:
    fake_openai.push(text="I think the answer is in the README.")
    fake_openai.push(text="```\nprint('an unmarked block is not run')\n```")
    fake_openai.push(text="Ferry moves crates between docks.")  # the reply to the final request
    result = _session(fake_openai, make_settings, fixture_repo, max_turns=2).run("what is ferry?")
    assert (result.stop_reason, result.answer) == ("max_turns", "Ferry moves crates between docks.")
    nudge = fake_openai.requests[1]["messages"][-1]
    assert nudge["role"] == "user" and "```python" in nudge["content"]
    final = fake_openai.requests[2]["messages"][-1]["content"]
    assert "Answer now" in final and "one last ```python block" in final
    assert not [e for e in _events(result.trajectory_path) if e["event"] == "step"]


def test_a_final_reply_with_a_block_that_does_not_answer_is_not_taken_as_the_answer(
        fake_openai: FakeOpenAI, make_settings, fixture_repo: Path) -> None:
    fake_openai.push(text="```python\nprint(1)\n```")
    fake_openai.push(text="The answer is 1.\n```python\nprint('checking')\n```")
    result = _session(fake_openai, make_settings, fixture_repo, max_turns=1).run("q")
    assert result.answer is None and "did not call final_answer" in (result.error or "")


def test_an_unknown_protocol_names_the_setting() -> None:
    with pytest.raises(SettingsInvalid) as info:
        load_settings(protocol="markdown")
    assert "RLM_PROTOCOL" in info.value.message
