"""The provider recipes of docs/RLM.md ("Provider recipes"), each run as written against a fake of its server.

A recipe is the variables a user exports; the test exports the same ones (the base URL
pointing at the fake), builds the provider the settings name, and checks what the user
relies on: the request reaches the server's path with the key from the named variable,
and the usage and cost come out right despite the server's quirk. Every `export` line
of a recipe must appear in docs/RLM.md, so the docs show what is tested.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmfamily.providers.select import build_provider
from rlmfamily.settings import load_settings

pytestmark = pytest.mark.timeout(30)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "RLM.md"
USER = [{"role": "user", "content": "where is the needle?"}]

# flavour -> (the recipe's variables, the base URL's path on the server, the key's variable and a value)
RECIPES: dict[str, tuple[dict[str, str], str, tuple[str, str]]] = {
    "azure": ({"RLM_MODEL": "my-gpt-5-mini", "RLM_API_KEY_ENV": "AZURE_OPENAI_API_KEY",
               "RLM_PRICES_USD_PER_MTOK": '{"my-gpt-5-mini": {"prompt": 0.25, "cached": 0.025, "completion": 2.0}}'},
              "/openai/v1", ("AZURE_OPENAI_API_KEY", "az-key")),
    "vllm": ({"RLM_MODEL": "Qwen/Qwen3-8B", "RLM_API_KEY_ENV": "VLLM_API_KEY",
              "RLM_PRICES_USD_PER_MTOK": '{"Qwen/Qwen3-8B": {"prompt": 0, "completion": 0}}'},
             "/v1", ("VLLM_API_KEY", "token-abc123")),
    "ollama": ({"RLM_MODEL": "qwen3:8b", "RLM_API_KEY_ENV": "OLLAMA_API_KEY",
                "RLM_PRICES_USD_PER_MTOK": '{"qwen3:8b": {"prompt": 0, "completion": 0}}'},
               "/v1", ("OLLAMA_API_KEY", "ollama")),
    "llamacpp": ({"RLM_MODEL": "local", "RLM_API_KEY_ENV": "LLAMA_API_KEY", "RLM_PROTOCOL": "auto",
                  "RLM_PRICES_USD_PER_MTOK": '{"local": {"prompt": 0, "completion": 0}}'},
                 "/v1", ("LLAMA_API_KEY", "none")),
    "openrouter": ({"RLM_MODEL": "qwen/qwen3-coder", "RLM_API_KEY_ENV": "OPENROUTER_API_KEY"},
                   "/api/v1", ("OPENROUTER_API_KEY", "sk-or-test")),
}


def _provider(server, flavour: str, monkeypatch: pytest.MonkeyPatch):
    variables, path, (key_env, key) = RECIPES[flavour]
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    host = server.base_url.rsplit("/v1", 1)[0]
    monkeypatch.setenv("RLM_BASE_URL", host + path)
    monkeypatch.setenv(key_env, key)
    return build_provider(load_settings())


def _ask(provider):
    return provider.complete(USER, tools=None, model=None, timeout_s=10, purpose="subcall")


@pytest.mark.parametrize("local_server", ["vllm", "ollama"], indirect=True)
def test_vllm_and_ollama_report_usage_without_cache_details_and_a_zero_price_makes_it_free(local_server,
                                                                                          monkeypatch) -> None:
    local_server.push(text="line 42", prompt_tokens=900, completion_tokens=30)
    completion = _ask(_provider(local_server, local_server.flavour, monkeypatch))
    assert completion.text == "line 42"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (900, 30)
    assert completion.usage.cache_read_tokens is None and completion.usage.cost_usd == 0.0
    key_env, key = RECIPES[local_server.flavour][2]
    assert local_server.paths == ["/v1/chat/completions"]
    assert local_server.headers[0]["authorization"] == f"Bearer {key}"


@pytest.mark.parametrize("local_server", ["llamacpp"], indirect=True)
def test_llama_cpp_reports_its_reused_prompt_tokens_in_timings(local_server, monkeypatch) -> None:
    local_server.push(text="found", prompt_tokens=1200, completion_tokens=10, cached_tokens=1000)
    completion = _ask(_provider(local_server, "llamacpp", monkeypatch))
    assert (completion.usage.prompt_tokens, completion.usage.cache_read_tokens) == (1200, 1000)
    assert completion.usage.cost_usd == 0.0


@pytest.mark.parametrize("local_server", ["openrouter"], indirect=True)
def test_openrouter_reports_its_own_charge_for_a_model_without_a_price(local_server, monkeypatch) -> None:
    local_server.push(text="found", prompt_tokens=2000, completion_tokens=50, cached_tokens=1500, cost=0.00123)
    provider = _provider(local_server, "openrouter", monkeypatch)
    completion = _ask(provider)
    assert completion.usage.cost_usd == pytest.approx(0.00123)
    assert completion.usage.cache_read_tokens == 1500
    assert local_server.paths == ["/api/v1/chat/completions"]
    # Its charge arrives with the answer, so no price is known beforehand: --max-usd needs a price.
    assert not provider.reports_cost("qwen/qwen3-coder")


@pytest.mark.parametrize("local_server", ["azure"], indirect=True)
def test_azure_is_priced_by_the_deployment_name_and_its_filter_results_are_ignored(local_server,
                                                                                     monkeypatch) -> None:
    local_server.push(text="found", prompt_tokens=10_000, completion_tokens=100, cached_tokens=8_000)
    completion = _ask(_provider(local_server, "azure", monkeypatch))
    assert local_server.paths == ["/openai/v1/chat/completions"]
    assert local_server.requests[0]["model"] == "my-gpt-5-mini"  # the deployment, as the request names it
    assert local_server.headers[0]["authorization"] == "Bearer az-key"
    assert completion.usage.cost_usd == pytest.approx((2_000 * 0.25 + 8_000 * 0.025 + 100 * 2.0) / 1e6)


@pytest.mark.parametrize("local_server", ["nousage"], indirect=True)
def test_a_server_that_reports_no_usage_leaves_it_unknown_never_zero(local_server, monkeypatch) -> None:
    local_server.push(text="found")
    assert _ask(_provider(local_server, "vllm", monkeypatch)).usage is None


def test_every_recipe_is_in_the_docs_as_tested() -> None:
    docs = DOCS.read_text()
    for flavour, (variables, path, (key_env, _)) in RECIPES.items():
        for name, value in variables.items():
            line = f"export {name}='{value}'" if value.startswith("{") else f"export {name}={value}"
            assert line in docs, f"{flavour}: docs/RLM.md lacks {line!r}"
        assert f"{path}" in docs and key_env in docs
