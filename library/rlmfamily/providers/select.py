"""The provider a run's settings name (RLM_PROVIDER): one place that maps the setting to a class.

Each provider module is imported only here, when chosen: the clients take about
a second to import, and ``anthropic`` and ``google-genai`` are optional extras.
"""

from __future__ import annotations

from rlmfamily.errors import SettingsInvalid
from rlmfamily.providers.base import PriceTable, Provider
from rlmfamily.settings import RLMSettings


def build_provider(settings: RLMSettings, prices: PriceTable | None = None) -> Provider:
    """The model provider of ``settings`` (provider, endpoint, model, key variable, sampling, retries)."""
    if not settings.model:
        raise SettingsInvalid("no model: give --model (or RLM_MODEL), or --script FILE for an offline replay",
                              setting="model")
    prices = prices or PriceTable.load(settings.prices_usd_per_mtok, settings.price_table_file)
    common = {"model": settings.model, "api_key_env": settings.key_env, "prices": prices,
              "temperature": settings.temperature, "max_completion_tokens": settings.max_completion_tokens,
              "max_retries": settings.provider_max_retries, "backoff_s": settings.provider_backoff_s}
    if settings.provider == "anthropic":
        from rlmfamily.providers.anthropic_native import AnthropicProvider

        return AnthropicProvider(base_url=settings.endpoint, **common)
    if settings.provider == "gemini":
        from rlmfamily.providers.gemini_native import GeminiProvider

        return GeminiProvider(base_url=settings.endpoint, **common)
    from rlmfamily.providers.openai_compat import OpenAIProvider

    endpoint = settings.endpoint
    assert endpoint is not None, "the openai provider has a default base URL"
    return OpenAIProvider(base_url=endpoint, **common)
