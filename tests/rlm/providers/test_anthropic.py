"""The native Anthropic provider, driven by the real ``anthropic`` client against a local Messages API server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlmfamily.errors import ProviderError, SettingsInvalid
from rlmfamily.family.spec import provider_spec, rebuild_provider
from rlmfamily.prompts import PYTHON_TOOL
from rlmfamily.providers import AnthropicProvider, OpenAIProvider, PriceTable
from rlmfamily.providers.select import build_provider
from rlmfamily.settings import load_settings

pytestmark = pytest.mark.timeout(30)

USER = [{"role": "user", "content": "hi"}]
KEY = {"TEST_ANTHROPIC_KEY": "sk-ant-test-123"}


def _provider(fake, **kw) -> AnthropicProvider:
    kw.setdefault("model", "claude-sonnet-4-5")
    return AnthropicProvider(base_url=fake.base_url, api_key_env="TEST_ANTHROPIC_KEY", environ=KEY,
                             backoff_s=0.01, prices=PriceTable.load({}, None), **kw)


def _key_sent(headers: dict[str, str]) -> str | None:
    """The API key as the client sent it: x-api-key, or a bearer token (anthropic 2.x sends the key so)."""
    bearer = headers.get("authorization", "")
    return headers.get("x-api-key") or (bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else None)


def test_a_tool_use_answer_becomes_python_code_with_usage_cache_fields_and_a_cost(fake_anthropic) -> None:
    fake_anthropic.push(text="let me look", code="print(context.size())", input_tokens=200, output_tokens=50,
                        cache_read_input_tokens=1000, cache_creation_input_tokens=300)
    completion = _provider(fake_anthropic).complete(USER, tools=[PYTHON_TOOL], model=None, timeout_s=5,
                                                    purpose="root")
    assert completion.text == "let me look"
    (call,) = completion.tool_calls
    assert (call.name, call.code) == ("python", "print(context.size())") and call.id.startswith("toolu_")
    usage = completion.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (1500, 50), "prompt tokens include the cached ones"
    assert (usage.cache_read_tokens, usage.cache_creation_tokens) == (1000, 300)
    # claude-sonnet-4-5 in the bundled table: 3.00 prompt, 0.30 cached, 3.75 cache write, 15.00 completion.
    assert usage.cost_usd == pytest.approx((200 * 3.0 + 1000 * 0.30 + 300 * 3.75 + 50 * 15.0) / 1e6)
    assert fake_anthropic.paths == ["/v1/messages"]
    assert _key_sent(fake_anthropic.headers[0]) == "sk-ant-test-123"
    assert fake_anthropic.requests[0]["tools"] == [{
        "name": "python", "description": PYTHON_TOOL["function"]["description"],
        "input_schema": PYTHON_TOOL["function"]["parameters"],
    }]


def test_the_conversation_is_sent_as_content_blocks_with_cache_marks_on_the_prefix(fake_anthropic) -> None:
    conversation = [
        {"role": "system", "content": "you investigate"},
        {"role": "user", "content": "Question: how many?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_7", "type": "function", "function": {"name": "python", "arguments": json.dumps({"code": "print(1)"})}}]},
        {"role": "tool", "tool_call_id": "toolu_7", "content": "1"},
        {"role": "user", "content": "Stop investigating: answer now."},
    ]
    _provider(fake_anthropic).complete(conversation, tools=[PYTHON_TOOL], model=None, timeout_s=5, purpose="root")
    request = fake_anthropic.requests[0]
    assert request["system"] == [{"type": "text", "text": "you investigate", "cache_control": {"type": "ephemeral"}}]
    assert [m["role"] for m in request["messages"]] == ["user", "assistant", "user"]
    assert request["messages"][1]["content"] == [
        {"type": "tool_use", "id": "toolu_7", "name": "python", "input": {"code": "print(1)"}}]
    last = request["messages"][2]["content"]
    assert last[0] == {"type": "tool_result", "tool_use_id": "toolu_7", "content": "1"}
    assert last[1] == {"type": "text", "text": "Stop investigating: answer now.", "cache_control": {"type": "ephemeral"}}
    marks = json.dumps(request).count("cache_control")
    assert marks == 2, "the system prompt and the end of the conversation, within the API's 4 breakpoints"


def test_overloaded_and_unavailable_answers_are_retried(fake_anthropic) -> None:
    fake_anthropic.push(status=529, message="Overloaded")
    fake_anthropic.push(status=503, message="unavailable")
    fake_anthropic.push(text="third time")
    provider = _provider(fake_anthropic, max_retries=3)
    assert provider.complete(USER, tools=None, model=None, timeout_s=10, purpose="subcall").text == "third time"
    assert provider.attempts == 3 and len(fake_anthropic.requests) == 3


def test_a_bad_request_is_not_retried_and_says_what_the_server_said(fake_anthropic) -> None:
    fake_anthropic.push(status=400, message="prompt is too long")
    with pytest.raises(ProviderError) as info:
        _provider(fake_anthropic).complete(USER, tools=None, model=None, timeout_s=5, purpose="subcall")
    assert "prompt is too long" in info.value.message and info.value.billed is False
    assert len(fake_anthropic.requests) == 1


def test_sampling_settings_reach_the_anthropic_endpoint(fake_anthropic, make_settings, monkeypatch) -> None:
    settings = make_settings(provider="anthropic", base_url=fake_anthropic.base_url, model="claude-haiku-4-5",
                             api_key_env="TEST_ANTHROPIC_KEY", temperature=0.2, max_completion_tokens=777)
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", KEY["TEST_ANTHROPIC_KEY"])
    provider = build_provider(settings)
    provider.complete(USER, tools=None, model=None, timeout_s=5, purpose="subcall")
    assert isinstance(provider, AnthropicProvider)
    request = fake_anthropic.requests[0]
    assert (request["temperature"], request["max_tokens"], request["model"]) == (0.2, 777, "claude-haiku-4-5")


def test_sampling_settings_reach_the_openai_endpoint_and_are_absent_when_unset(fake_openai, make_settings,
                                                                              monkeypatch) -> None:
    monkeypatch.setenv("TEST_RLM_KEY", "sk-test")
    tuned = build_provider(make_settings(base_url=fake_openai.base_url, model="m-1", api_key_env="TEST_RLM_KEY",
                                         temperature=1.5, max_completion_tokens=321))
    plain = build_provider(make_settings(base_url=fake_openai.base_url, model="m-1", api_key_env="TEST_RLM_KEY"))
    assert isinstance(tuned, OpenAIProvider)
    tuned.complete(USER, tools=None, model=None, timeout_s=5, purpose="subcall")
    plain.complete(USER, tools=None, model=None, timeout_s=5, purpose="subcall")
    first, second = fake_openai.requests
    assert (first["temperature"], first["max_completion_tokens"]) == (1.5, 321)
    assert "temperature" not in second and "max_completion_tokens" not in second


def test_sampling_and_provider_settings_are_validated_naming_the_setting() -> None:
    cases = [({"provider": "mistral"}, "RLM_PROVIDER"), ({"temperature": -0.1}, "RLM_TEMPERATURE"),
             ({"temperature": 2.5}, "RLM_TEMPERATURE"), ({"max_completion_tokens": 0}, "RLM_MAX_COMPLETION_TOKENS")]
    for overrides, named in cases:
        with pytest.raises(SettingsInvalid) as info:
            load_settings(**overrides)
        assert named in info.value.message, overrides
    with pytest.raises(SettingsInvalid) as info:
        load_settings(provider="anthropic", temperature=1.5)
    assert "temperature" in info.value.message and "anthropic" in info.value.message
    assert load_settings(provider="anthropic").key_env == "ANTHROPIC_API_KEY"
    assert load_settings().key_env == "OPENAI_API_KEY"


def test_a_child_process_rebuilds_the_provider_from_the_key_name_never_the_key(fake_anthropic, settings,
                                                                             monkeypatch) -> None:
    spec = provider_spec(_provider(fake_anthropic, temperature=0.5, max_completion_tokens=1000))
    assert "sk-ant-test-123" not in json.dumps(spec)
    assert spec["kwargs"]["api_key_env"] == "TEST_ANTHROPIC_KEY"
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", "sk-ant-child")
    child = rebuild_provider({"provider": spec}, settings, "a child's prompt")
    child.complete(USER, tools=None, model=None, timeout_s=5, purpose="subcall")
    assert _key_sent(fake_anthropic.headers[0]) == "sk-ant-child"
    assert (fake_anthropic.requests[0]["temperature"], fake_anthropic.requests[0]["max_tokens"]) == (0.5, 1000)


def test_without_the_extra_choosing_anthropic_names_the_install_command(tmp_path) -> None:
    # sys.modules[name] = None is how Python makes an import fail as if the package were absent.
    program = ("import sys; sys.modules['anthropic'] = None\n"
               "from rlmfamily.cli import main\n"
               "sys.exit(main(['run', '--provider', 'anthropic', '--model', 'claude-haiku-4-5', '--document', "
               f"{str(tmp_path / 'doc.txt')!r}, 'q']))")
    (tmp_path / "doc.txt").write_text("hello\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
    env.update({"RLM_DATA_DIR": str(tmp_path / "data"), "ANTHROPIC_API_KEY": "sk-x", "COLUMNS": "200"})
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "pip install 'rlmfamily[anthropic]'" in done.stderr and "settings_invalid" in done.stderr
