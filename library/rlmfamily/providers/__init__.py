"""Model providers: the seam (base), any OpenAI-compatible endpoint, Anthropic's Messages API, Gemini, the scripted replay.

``OpenAIProvider``, ``AnthropicProvider`` and ``GeminiProvider`` are imported on first
use: each client costs about half a second to import, which ``rlm show`` and scripted
runs need not pay, and ``anthropic`` and ``google-genai`` are optional extras
(``rlmfamily[anthropic]``, ``rlmfamily[gemini]``).
"""

from typing import Any

from rlmfamily.providers.base import Completion, PriceTable, Provider, ToolCall, Usage
from rlmfamily.providers.scripted import ScriptedProvider

__all__ = ["AnthropicProvider", "Completion", "GeminiProvider", "OpenAIProvider", "PriceTable", "Provider", "ScriptedProvider", "ToolCall", "Usage"]


def __getattr__(name: str) -> Any:
    if name == "OpenAIProvider":
        from rlmfamily.providers.openai_compat import OpenAIProvider

        return OpenAIProvider
    if name == "AnthropicProvider":
        from rlmfamily.providers.anthropic_native import AnthropicProvider

        return AnthropicProvider
    if name == "GeminiProvider":
        from rlmfamily.providers.gemini_native import GeminiProvider

        return GeminiProvider
    raise AttributeError(name)
