"""Model providers: the seam (base), any OpenAI-compatible endpoint, and the scripted replay."""

from rlm.providers.base import Completion, PriceTable, Provider, ToolCall, Usage
from rlm.providers.openai_compat import OpenAIProvider
from rlm.providers.scripted import ScriptedProvider

__all__ = ["Completion", "OpenAIProvider", "PriceTable", "Provider", "ScriptedProvider", "ToolCall", "Usage"]
