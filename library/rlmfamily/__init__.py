"""The native RLM (Recursive Language Model) library: a model with one tool, ``python``,
investigates a corpus held as data in a persistent namespace.

It imports nothing of the hosted service and runs alone. See docs/RLM.md.
"""

from typing import Any

from rlmfamily.budget import Budget, BudgetLedger, BudgetLimits
from rlmfamily.context import Context
from rlmfamily.errors import RLMError
from rlmfamily.llm import LLMResult
from rlmfamily.providers import PriceTable, ScriptedProvider
from rlmfamily.session import RunResult, Session, run_question
from rlmfamily.settings import RLMSettings, load_settings
from rlmfamily.tools import Tool, tool

__all__ = [
    "Budget", "BudgetLedger", "BudgetLimits", "Context", "LLMResult", "OpenAIProvider", "PriceTable", "RLMError",
    "RLMSettings", "RunResult", "ScriptedProvider", "Session", "Tool", "load_settings", "run_question", "tool",
]


def __getattr__(name: str) -> Any:
    if name == "OpenAIProvider":  # imported on first use (see rlmfamily.providers)
        from rlmfamily.providers.openai_compat import OpenAIProvider

        return OpenAIProvider
    raise AttributeError(name)
