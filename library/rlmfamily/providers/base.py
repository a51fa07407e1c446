"""The provider seam: what a model endpoint returns (Completion, ToolCall, Usage) and the price table.

A provider turns chat messages into a Completion. Usage a provider did not
report is ``None`` (unknown), never zero; cost comes from a configurable price
table and is unknown for a model without a price.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rlmfamily.errors import SettingsInvalid


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int | None  # None = the provider did not say: unknown, never zero
    completion_tokens: int | None
    cost_usd: float | None

    @property
    def total_tokens(self) -> int | None:
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "cost_usd": self.cost_usd,
        }


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str  # always "python" for root turns
    code: str


@dataclass(frozen=True)
class Completion:
    text: str  # assistant text (may be "")
    tool_calls: tuple[ToolCall, ...]
    usage: Usage | None  # None = unknown
    model: str


class Provider(Protocol):
    """Anything that answers chat messages. ``purpose`` is "root" for root turns, "subcall" for llm_query.

    ``reports_cost(model)`` says whether every call of ``model`` gets a USD cost; a
    session refuses a USD limit (``max_usd``) for a model whose cost would be unknown.
    A provider without the method is judged by its ``prices`` table, if it has one
    (see ``usd_cost_known``).
    """

    name: str
    default_model: str

    def reports_cost(self, model: str) -> bool: ...

    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None,
        model: str | None,
        timeout_s: float,
        purpose: str,
    ) -> Completion: ...


class PriceTable:
    """USD per million tokens, by model id. A model not in the table has an unknown cost."""

    def __init__(self, prices: dict[str, dict[str, float]] | None = None) -> None:
        self._prices = dict(prices or {})

    @classmethod
    def load(cls, inline: dict[str, dict[str, float]], path: Path | None) -> PriceTable:
        """Inline prices (RLM_PRICES_USD_PER_MTOK) over a JSON or TOML file (RLM_PRICE_TABLE_FILE)."""
        prices: dict[str, dict[str, float]] = {}
        if path is not None:
            try:
                raw = path.read_text()
                data = tomllib.loads(raw) if path.suffix == ".toml" else json.loads(raw)
            except (OSError, ValueError) as exc:
                raise SettingsInvalid(
                    f"price table {path} cannot be read: {exc} (setting RLM_PRICE_TABLE_FILE)",
                    setting="price_table_file",
                ) from None
            for model, price in dict(data).items():
                if not isinstance(price, dict) or set(price) != {"prompt", "completion"}:
                    raise SettingsInvalid(
                        f"price table {path}: {model!r} needs 'prompt' and 'completion' USD per million tokens",
                        setting="price_table_file",
                    )
                prices[model] = {"prompt": float(price["prompt"]), "completion": float(price["completion"])}
        prices.update(inline)
        return cls(prices)

    def has(self, model: str) -> bool:
        return model in self._prices

    def cost(self, model: str, prompt_tokens: int | None, completion_tokens: int | None) -> float | None:
        price = self._prices.get(model)
        if price is None or prompt_tokens is None or completion_tokens is None:
            return None
        return (prompt_tokens * price["prompt"] + completion_tokens * price["completion"]) / 1_000_000


def usd_cost_known(provider: Any, model: str) -> bool:
    """Whether ``provider``'s calls of ``model`` get a USD cost: its own answer, else its price table's."""
    reports_cost = getattr(provider, "reports_cost", None)
    if callable(reports_cost):
        return bool(reports_cost(model))
    prices = getattr(provider, "prices", None)
    return prices is None or prices.has(model)


def estimate_tokens(chars: int) -> int:
    """A rough token count (4 characters a token) for admission estimates and the scripted provider."""
    return math.ceil(chars / 4)


def message_chars(messages: list[dict[str, Any]]) -> int:
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        for call in message.get("tool_calls") or ():
            total += len(json.dumps(call))
    return total
