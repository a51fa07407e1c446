"""Model providers: the scripted replay, and any OpenAI-compatible endpoint (against a local wire-format server)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rlmfamily.errors import MissingAPIKey, ProviderError, ProviderTimeout, ScriptExhausted, ScriptInvalid
from rlmfamily.providers import OpenAIProvider, PriceTable, ScriptedProvider
from rlmfamily.settings import load_settings

from ..holds import DEADLINE_SLACK_S

pytestmark = pytest.mark.timeout(30)

USER = [{"role": "user", "content": "hi"}]


# ---------- scripted ----------


def test_the_script_serves_root_turns_in_order_and_counts_calls(write_script) -> None:
    provider = ScriptedProvider.from_file(write_script(["print(1)", {"text": "done"}]))
    first = provider.complete(USER, tools=[], model=None, timeout_s=5, purpose="root")
    second = provider.complete(USER, tools=[], model=None, timeout_s=5, purpose="root")
    assert first.tool_calls[0].code == "print(1)" and first.tool_calls[0].name == "python"
    assert second.tool_calls == () and second.text == "done"
    with pytest.raises(ScriptExhausted):
        provider.complete(USER, tools=[], model=None, timeout_s=5, purpose="root")
    assert provider.calls["root"] == 3


def test_subcall_answers_are_matched_by_pattern_and_expand_groups(write_script) -> None:
    path = write_script([], [{"pattern": r"limit is (\d+)", "answer": r"found \1"}], default_answer="NONE")
    provider = ScriptedProvider.from_file(path)
    hit = provider.complete([{"role": "user", "content": "the limit is 42. What is it?"}], tools=None,
                            model=None, timeout_s=5, purpose="subcall")
    miss = provider.complete(USER, tools=None, model=None, timeout_s=5, purpose="subcall")
    assert hit.text == "found 42" and miss.text == "NONE"
    assert provider.calls["subcall"] == 2
    assert hit.usage is not None and hit.usage.total_tokens and hit.usage.cost_usd == 0.0


def test_a_script_can_declare_unknown_usage_and_failures(write_script) -> None:
    path = write_script([{"code": "x", "usage": "unknown"}], [{"pattern": "boom", "error": "overloaded"}])
    provider = ScriptedProvider.from_file(path)
    assert provider.complete(USER, tools=[], model=None, timeout_s=5, purpose="root").usage is None
    with pytest.raises(ProviderError) as info:
        provider.complete([{"role": "user", "content": "boom"}], tools=None, model=None, timeout_s=5, purpose="subcall")
    assert info.value.billed is False


def test_scripts_may_be_toml(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("[[root]]\ncode = '''final_answer(1)'''\n")
    provider = ScriptedProvider.from_file(path)
    assert provider.complete(USER, tools=[], model=None, timeout_s=5, purpose="root").tool_calls[0].code == "final_answer(1)"


def test_a_malformed_script_is_refused_with_where(tmp_path: Path, write_script) -> None:
    with pytest.raises(ScriptInvalid) as bad_rule:
        ScriptedProvider.from_file(write_script([], [{"pattern": "(", "answer": "x"}]))
    assert "subcall rule 1" in bad_rule.value.message
    broken = tmp_path / "broken.toml"
    broken.write_text("[[root]\n")
    with pytest.raises(ScriptInvalid):
        ScriptedProvider.from_file(broken)


# ---------- OpenAI-compatible ----------


def _provider(fake, **kw) -> OpenAIProvider:
    return OpenAIProvider(base_url=fake.base_url, model="m-1", api_key_env="TEST_RLM_KEY",
                          environ={"TEST_RLM_KEY": "sk-test-123"}, backoff_s=0.01, **kw)


def test_usage_and_cost_come_from_the_answer_and_the_price_table(fake_openai) -> None:
    fake_openai.push(text="hello", prompt_tokens=1000, completion_tokens=500)
    provider = _provider(fake_openai, prices=PriceTable({"m-1": {"prompt": 2.0, "completion": 8.0}}))
    completion = provider.complete(USER, tools=None, model=None, timeout_s=5, purpose="subcall")
    assert completion.text == "hello"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (1000, 500)
    assert completion.usage.cost_usd == pytest.approx((1000 * 2.0 + 500 * 8.0) / 1e6)
    assert fake_openai.headers[0]["authorization"] == "Bearer sk-test-123"
    assert fake_openai.requests[0]["model"] == "m-1"


def test_a_model_without_a_price_has_unknown_cost_and_missing_usage_is_unknown(fake_openai) -> None:
    fake_openai.push(text="a")
    fake_openai.push(text="b", usage=False)
    provider = _provider(fake_openai)
    assert provider.complete(USER, tools=None, model=None, timeout_s=5, purpose="subcall").usage.cost_usd is None
    assert provider.complete(USER, tools=None, model=None, timeout_s=5, purpose="subcall").usage is None


def test_tool_calls_are_parsed_into_python_code(fake_openai) -> None:
    fake_openai.push(code="print(context.size())")
    completion = _provider(fake_openai).complete(USER, tools=[{"type": "function"}], model=None, timeout_s=5,
                                                 purpose="root")
    assert completion.tool_calls[0].name == "python"
    assert completion.tool_calls[0].code == "print(context.size())"


def test_server_errors_are_retried_with_backoff(fake_openai) -> None:
    fake_openai.push(status=503, message="overloaded")
    fake_openai.push(status=429, message="slow down")
    fake_openai.push(text="third time")
    provider = _provider(fake_openai, max_retries=3)
    assert provider.complete(USER, tools=None, model=None, timeout_s=10, purpose="subcall").text == "third time"
    assert provider.attempts == 3 and len(fake_openai.requests) == 3


def test_a_bad_request_is_not_retried_and_says_what_the_server_said(fake_openai) -> None:
    fake_openai.push(status=400, message="context length exceeded")
    provider = _provider(fake_openai, max_retries=3)
    with pytest.raises(ProviderError) as info:
        provider.complete(USER, tools=None, model=None, timeout_s=5, purpose="subcall")
    assert "context length exceeded" in info.value.message and info.value.billed is False
    assert len(fake_openai.requests) == 1


def test_retries_give_up_after_the_named_limit(fake_openai) -> None:
    for _ in range(3):
        fake_openai.push(status=500)
    with pytest.raises(ProviderError) as info:
        _provider(fake_openai, max_retries=2).complete(USER, tools=None, model=None, timeout_s=10, purpose="subcall")
    assert "RLM_PROVIDER_MAX_RETRIES" in info.value.message and len(fake_openai.requests) == 3


def test_a_slow_endpoint_times_out_with_unknown_billing(fake_openai) -> None:
    fake_openai.push(text="late", hold=True)
    timeout_s = 0.5
    started = time.monotonic()
    with pytest.raises(ProviderTimeout) as info:
        _provider(fake_openai).complete(USER, tools=None, model=None, timeout_s=timeout_s, purpose="subcall")
    assert fake_openai.hold.let_go == 0, "the call's timeout_s must end it while the endpoint still holds the answer"
    assert time.monotonic() - started < timeout_s + DEADLINE_SLACK_S, "the call must end by its timeout_s"
    assert info.value.billed is None


def test_an_unreachable_endpoint_is_retried_then_reported(tmp_path: Path) -> None:
    provider = OpenAIProvider(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="K", environ={"K": "x"},
                              max_retries=1, backoff_s=0.01)
    with pytest.raises(ProviderError) as info:
        provider.complete(USER, tools=None, model=None, timeout_s=5, purpose="subcall")
    assert "cannot reach" in info.value.message and info.value.billed is False and provider.attempts == 2


def test_a_missing_key_variable_is_named_in_the_error() -> None:
    with pytest.raises(MissingAPIKey) as info:
        OpenAIProvider(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="MY_ROUTER_KEY", environ={})
    assert "MY_ROUTER_KEY" in info.value.message and info.value.setting == "api_key_env"


def test_the_key_itself_is_refused_as_a_variable_name() -> None:
    from rlmfamily.errors import SettingsInvalid

    with pytest.raises(SettingsInvalid) as info:
        load_settings(api_key_env="sk-live-abc123")
    assert "RLM_API_KEY_ENV" in info.value.message


def test_a_price_table_file_is_loaded(tmp_path: Path) -> None:
    table = tmp_path / "prices.json"
    table.write_text(json.dumps({"m-2": {"prompt": 1.0, "completion": 3.0}}))
    prices = PriceTable.load({}, table)
    assert prices.cost("m-2", 1_000_000, 0) == 1.0 and prices.cost("other", 1, 1) is None


def test_the_bundled_price_table_is_dated_and_prices_common_models_with_their_cache_prices() -> None:
    prices = PriceTable.load({}, None)
    assert prices.as_of and prices.as_of.startswith("20")
    for model in ("gpt-4o-mini", "gpt-6.2-sol", "claude-sonnet-5-5", "claude-haiku-4-5", "claude-haiku-4-5-20251001"):
        assert prices.has(model), model
    # 1M cached prompt tokens of gpt-4o-mini cost the cached price, not the prompt price.
    assert prices.cost("gpt-4o-mini", 1_000_000, 0, cache_read_tokens=1_000_000) == pytest.approx(0.075)
    # Claude Haiku 5.5 is priced by prompt length: a 150K-token prompt costs the long-prompt rates.
    assert prices.cost("claude-haiku-5-5", 100_000, 0) == pytest.approx(0.01)
    assert prices.cost("claude-haiku-5-5", 150_000, 0) == pytest.approx(0.075)
    assert not PriceTable.load({}, None, bundled=False).has("gpt-4o-mini")


def test_every_bundled_price_names_its_source_page_and_when_it_was_checked() -> None:
    from datetime import date

    from rlmfamily.providers.base import UNCHECKED, price_provenance

    provenance = price_provenance()
    assert provenance and PriceTable.load({}, None).has("gemini-2.5-flash")
    for model, marked in provenance.items():
        assert marked["source"] and marked["source"].startswith("https://"), model
        if marked["checked"] != UNCHECKED:
            assert date.fromisoformat(marked["checked"]) <= date.fromisoformat(PriceTable.load({}, None).as_of), model
    # What no official page confirmed says so (carried over, or read from third-party copies).
    assert provenance["gpt-4o"]["checked"] == UNCHECKED and provenance["gemini-2.5-pro"]["checked"] == UNCHECKED


def test_a_long_prompt_tier_prices_the_whole_call_once_the_prompt_passes_its_threshold(tmp_path: Path) -> None:
    # Priced like Claude Haiku 5.5 and OpenAI's >272K tier: past the threshold every token of the call costs more.
    table = tmp_path / "prices.toml"
    table.write_text(
        '"m" = { prompt = 1.0, cached = 0.1, cache_write = 1.25, completion = 5.0, '
        'long_prompt = { above = 100000, prompt = 5.0, cached = 0.5, cache_write = 6.25, completion = 25.0 } }\n'
        '"flat" = { prompt = 1.0, completion = 5.0 }\n')
    prices = PriceTable.load({}, table, bundled=False)
    assert prices.cost("m", 100_000, 1_000_000) == pytest.approx(0.1 + 5.0)  # at the threshold: the base rates
    assert prices.cost("m", 100_001, 1_000_000) == pytest.approx(100_001 * 5.0 / 1e6 + 25.0)
    # The threshold counts the whole prompt, cache reads and writes included, and the tier has its own cache rates.
    assert prices.cost("m", 200_000, 0, cache_read_tokens=150_000, cache_creation_tokens=40_000) == pytest.approx(
        (10_000 * 5.0 + 150_000 * 0.5 + 40_000 * 6.25) / 1e6)
    assert prices.cost("flat", 900_000, 0) == pytest.approx(0.9)


@pytest.mark.parametrize("tier", ["{ prompt = 5.0, completion = 25.0 }",  # no threshold
                                  "{ above = 0, prompt = 5.0, completion = 25.0 }",
                                  "{ above = 1000, prompt = 5.0 }",  # no completion price
                                  "{ above = 1000, prompt = 5.0, completion = 25.0, output = 1.0 }"])
def test_a_malformed_long_prompt_tier_names_the_setting(tmp_path: Path, tier: str) -> None:
    from rlmfamily.errors import SettingsInvalid

    table = tmp_path / "prices.toml"
    table.write_text(f'"m" = {{ prompt = 1.0, completion = 5.0, long_prompt = {tier} }}\n')
    with pytest.raises(SettingsInvalid) as info:
        PriceTable.load({}, table, bundled=False)
    assert info.value.setting == "price_table_file" and "'long_prompt'" in info.value.message


def test_a_malformed_price_file_names_the_setting(tmp_path: Path) -> None:
    from rlmfamily.errors import SettingsInvalid

    table = tmp_path / "prices.toml"
    table.write_text('"m" = { prompt = 1.0, output = 2.0 }\n')
    with pytest.raises(SettingsInvalid) as info:
        PriceTable.load({}, table)
    assert info.value.setting == "price_table_file" and "'completion'" in info.value.message
