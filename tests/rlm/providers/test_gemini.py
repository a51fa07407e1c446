"""The native Gemini provider (google-genai) against a fake server speaking generateContent's REST protocol."""

from __future__ import annotations

import json

import pytest

from rlmfamily.errors import ProviderError
from rlmfamily.providers import GeminiProvider, PriceTable
from rlmfamily.providers.gemini_native import NO_SIGNATURE, signature_text
from rlmfamily.providers.select import build_provider

pytestmark = pytest.mark.timeout(30)

TOOLS = [{"type": "function", "function": {"name": "python", "description": "run Python",
                                           "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                                          "required": ["code"]}}}]
PRICES = PriceTable({"gemini-t": {"prompt": 1.0, "cached": 0.1, "completion": 4.0}})


def _provider(fake, **kw) -> GeminiProvider:
    return GeminiProvider(base_url=fake.base_url, model="gemini-t", api_key_env="TEST_GEMINI_KEY",
                          environ={"TEST_GEMINI_KEY": "g-key-1"}, backoff_s=0.01, prices=PRICES, **kw)


def _ask(provider: GeminiProvider, messages=None, tools=TOOLS):
    messages = messages or [{"role": "system", "content": "be brief"}, {"role": "user", "content": "find it"}]
    return provider.complete(messages, tools=tools, model=None, timeout_s=10, purpose="root")


def test_a_function_call_becomes_python_code_with_cached_and_thinking_tokens_priced(fake_gemini) -> None:
    fake_gemini.push(code="print(context.size())", call_id="fc-1", thought="let me look",
                     prompt=10_000, cached=8_000, candidates=200, thoughts=300)
    completion = _ask(_provider(fake_gemini))
    assert [(c.name, c.code, c.id) for c in completion.tool_calls] == [("python", "print(context.size())", "fc-1")]
    assert completion.text == ""  # a thought summary is not the answer
    usage = completion.usage
    assert (usage.prompt_tokens, usage.cache_read_tokens, usage.completion_tokens) == (10_000, 8_000, 500)
    # 2,000 uncached at $1, 8,000 cached at $0.10, 500 of output (thinking included) at $4, per million.
    assert usage.cost_usd == pytest.approx((2_000 * 1.0 + 8_000 * 0.1 + 500 * 4.0) / 1e6)
    assert fake_gemini.paths == ["/v1beta/models/gemini-t:generateContent"]
    assert fake_gemini.headers[0]["x-goog-api-key"] == "g-key-1"
    sent = fake_gemini.requests[0]
    assert sent["systemInstruction"]["parts"] == [{"text": "be brief"}]
    assert sent["tools"][0]["functionDeclarations"][0]["name"] == "python"


def test_the_conversation_goes_back_with_the_calls_thought_signatures(fake_gemini) -> None:
    signature = signature_text(b"opaque-thought-1")
    fake_gemini.push(code="x = 1", call_id="fc-7", signature=signature)
    fake_gemini.push(text="the answer is 1")
    provider = _provider(fake_gemini)
    first = _ask(provider)
    call = first.tool_calls[0]
    history = [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "find it"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": "python", "arguments": json.dumps({"code": call.code})}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "ok"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "from-elsewhere", "type": "function",
                                                             "function": {"name": "python", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "from-elsewhere", "content": "ok"},
    ]
    assert _ask(provider, history).text == "the answer is 1"
    contents = fake_gemini.requests[1]["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user", "model", "user"]
    model_part = contents[1]["parts"][0]
    assert model_part["functionCall"] == {"id": "fc-7", "name": "python", "args": {"code": "x = 1"}}
    assert model_part["thoughtSignature"] == signature
    assert contents[2]["parts"][0]["functionResponse"] == {"id": "fc-7", "name": "python",
                                                          "response": {"output": "ok"}}
    # A call this process never received (a resume elsewhere) carries Google's documented placeholder.
    assert contents[3]["parts"][0]["thoughtSignature"] == signature_text(NO_SIGNATURE)


def test_an_answer_without_usage_metadata_has_unknown_usage(fake_gemini) -> None:
    fake_gemini.push(text="hello", usage=False)
    assert _ask(_provider(fake_gemini), tools=None).usage is None


def test_overload_is_retried_and_a_bad_request_is_not_and_says_what_the_server_said(fake_gemini) -> None:
    fake_gemini.push(status=503, message="The model is overloaded")
    fake_gemini.push(status=429, message="quota")
    fake_gemini.push(text="third time")
    provider = _provider(fake_gemini, max_retries=3)
    assert _ask(provider).text == "third time" and provider.attempts == 3
    fake_gemini.push(status=400, message="Function call is missing a thought_signature")
    with pytest.raises(ProviderError) as refused:
        _ask(provider)
    assert "HTTP 400" in refused.value.message and "thought_signature" in refused.value.message
    assert refused.value.billed is False and provider.attempts == 4


def test_the_setting_selects_gemini_with_its_key_variable_and_sampling(fake_gemini, make_settings,
                                                                        monkeypatch) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "g-env-key")
    settings = make_settings(provider="gemini", model="gemini-t", base_url=fake_gemini.base_url,
                             temperature=0.3, max_completion_tokens=777)
    provider = build_provider(settings, PRICES)
    assert isinstance(provider, GeminiProvider) and provider.child_spec()["kwargs"]["api_key_env"] == "GEMINI_API_KEY"
    fake_gemini.push(text="ok")
    _ask(provider, tools=None)
    assert fake_gemini.headers[0]["x-goog-api-key"] == "g-env-key"
    assert fake_gemini.requests[0]["generationConfig"] == {"temperature": 0.3, "maxOutputTokens": 777}
    # A child process rebuilds it from the spec: the key's variable name, never the key.
    spec = provider.child_spec()
    assert "g-env-key" not in json.dumps(spec) and spec["factory"].startswith("rlmfamily.providers.gemini_native:")
    child = GeminiProvider.for_child(settings=settings, prompt="", **spec["kwargs"])
    assert (child.base_url, child.default_model, child.temperature) == (fake_gemini.base_url, "gemini-t", 0.3)


def test_a_run_on_gemini_counts_files_over_two_turns_and_books_the_cached_tokens(fake_gemini, make_settings,
                                                                                 fixture_repo) -> None:
    from rlmfamily import Context, Session

    fake_gemini.push(code="n = len(context.files())\nprint('files', n)", call_id="fc-a",
                     signature=signature_text(b"sig-a"), prompt=3_000, candidates=40)
    fake_gemini.push(code="final_answer(f'files: {n}')", call_id="fc-b", prompt=3_200, cached=2_900, candidates=30)
    settings = make_settings(max_turns=4)
    result = Session(context=Context.from_repository(fixture_repo, settings), provider=_provider(fake_gemini),
                     settings=settings).run("how many files?")
    assert result.stop_reason == "answered" and result.answer.startswith("files: ")
    second = fake_gemini.requests[1]["contents"]
    assert second[1]["parts"][-1]["thoughtSignature"] == signature_text(b"sig-a")
    assert "files" in json.dumps(second[2]["parts"][0]["functionResponse"]["response"])
    # 3,040 + 3,230 tokens; the second call's 2,900 cached prompt tokens at $0.10 instead of $1.
    assert result.budget.tokens == 6_270
    assert result.budget.usd == pytest.approx((3_000 * 1.0 + 40 * 4.0 + 300 * 1.0 + 2_900 * 0.1 + 30 * 4.0) / 1e6)


def test_without_the_extra_choosing_gemini_names_the_install_command(make_settings, monkeypatch) -> None:
    import sys

    import google

    from rlmfamily.errors import SettingsInvalid

    # sys.modules[name] = None is how Python makes an import fail as if the package were absent.
    monkeypatch.setitem(sys.modules, "google.genai", None)
    monkeypatch.delattr(google, "genai", raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", "g-key")
    with pytest.raises(SettingsInvalid) as refused:
        build_provider(make_settings(provider="gemini", model="gemini-2.5-flash"))
    assert "pip install 'rlmfamily[gemini]'" in refused.value.message and refused.value.setting == "provider"
