"""Model providers: the seam (base), any OpenAI-compatible endpoint, and the scripted replay.

``OpenAIProvider`` is imported on first use: the ``openai`` client costs about half
a second to import, which ``rlm show`` and scripted runs need not pay.
"""

from typing import Any

from rlmfamily.providers.base import Completion, PriceTable, Provider, ToolCall, Usage
from rlmfamily.providers.scripted import ScriptedProvider

__all__ = ["Completion", "OpenAIProvider", "PriceTable", "Provider", "ScriptedProvider", "ToolCall", "Usage"]


def __getattr__(name: str) -> Any:
    if name == "OpenAIProvider":
        from rlmfamily.providers.openai_compat import OpenAIProvider

        return OpenAIProvider
    raise AttributeError(name)
