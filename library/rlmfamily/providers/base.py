"""The provider seam: what a model endpoint returns (Completion, ToolCall, Usage) and the price table.

A provider turns chat messages into a Completion. Usage a provider did not
report is ``None`` (unknown), never zero; cost comes from the price table (the
bundled, dated ``prices.toml`` under the user's file and inline prices) and is
unknown for a model without a price.
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
    prompt_tokens: int | None  # None = the provider did not say: unknown, never zero. Includes cached tokens.
    completion_tokens: int | None
    cost_usd: float | None
    cache_read_tokens: int | None = None  # of prompt_tokens, read from the provider's prompt cache
    cache_creation_tokens: int | None = None  # of prompt_tokens, written to the prompt cache

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
            "cache_read_tokens": self.cache_read_tokens,
            "cache_creation_tokens": self.cache_creation_tokens,
        }


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str  # "python", or another model tool of the run ("bash": rlmfamily/bash/extension.py)
    code: str  # the python tool's code; another tool's main argument (the bash tool's command)
    arguments: dict[str, Any] | None = None  # another tool's arguments, as the model sent them


MAIN_ARGUMENT = {"bash": "command"}  # the argument a tool other than python carries in ToolCall.code


def tool_call(call_id: str, name: str, arguments: Any) -> ToolCall:
    """A call of a tool other than ``python``, from its arguments (a JSON object or its text)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            arguments = {MAIN_ARGUMENT.get(name, "code"): arguments}
    if not isinstance(arguments, dict):
        arguments = {}
    main = arguments.get(MAIN_ARGUMENT.get(name, "code"))
    return ToolCall(id=call_id, name=name, code=main if isinstance(main, str) else "", arguments=arguments)


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


BUNDLED_PRICES = Path(__file__).resolve().parent.parent / "prices.toml"
PRICE_FIELDS = frozenset({"prompt", "completion", "cached", "cache_write"})  # USD per million tokens
REQUIRED_PRICE_FIELDS = frozenset({"prompt", "completion"})
# Where a price was read and when: `source` names an entry of the file's [sources] table (or is a URL),
# `checked` is the date it was last compared with that page, or "unchecked". Optional in a user's file;
# every entry of the bundled table has both (tests/rlm/providers/test_providers.py).
PROVENANCE_FIELDS = ("source", "checked")
UNCHECKED = "unchecked"
LONG_PROMPT = "long_prompt"  # optional tier: {above = prompt tokens, then the price fields}


class PriceTable:
    """USD per million tokens, by model id. A model not in the table has an unknown cost.

    A price has ``prompt`` and ``completion``, and may have ``cached`` (prompt tokens read from the
    provider's cache) and ``cache_write`` (prompt tokens written to it); without them those tokens
    cost the prompt price. It may also have a ``long_prompt`` tier, ``{above = N, prompt = ..., ...}``:
    a call whose prompt (cache reads and writes included) has more than N tokens is priced at the
    tier's rates, every token of it, output too — how providers price long prompts.
    """

    def __init__(self, prices: dict[str, dict[str, Any]] | None = None, *, as_of: str | None = None) -> None:
        self._prices = dict(prices or {})
        self.as_of = as_of  # the date of the bundled table, when it is loaded

    @classmethod
    def load(cls, inline: dict[str, dict[str, float]], path: Path | None, *, bundled: bool = True) -> PriceTable:
        """Inline prices (RLM_PRICES_USD_PER_MTOK) over a JSON or TOML file (RLM_PRICE_TABLE_FILE) over the bundled table."""
        prices: dict[str, dict[str, Any]] = {}
        as_of = None
        if bundled:
            as_of, prices = _read_prices(BUNDLED_PRICES, setting="price_table_file")
        if path is not None:
            prices.update(_read_prices(path, setting="price_table_file")[1])
        prices.update(inline)
        return cls(prices, as_of=as_of)

    def has(self, model: str) -> bool:
        return model in self._prices

    def cost(self, model: str, prompt_tokens: int | None, completion_tokens: int | None, *,
             cache_read_tokens: int | None = None, cache_creation_tokens: int | None = None) -> float | None:
        price = self._prices.get(model)
        if price is None or prompt_tokens is None or completion_tokens is None:
            return None
        tier = price.get(LONG_PROMPT)
        if tier is not None and prompt_tokens > tier["above"]:
            price = tier  # the provider bills the whole call at the long-prompt rates, not only the tokens past N
        read, written = cache_read_tokens or 0, cache_creation_tokens or 0
        uncached = max(0, prompt_tokens - read - written)
        usd_micro = (uncached * price["prompt"] + read * price.get("cached", price["prompt"])
                     + written * price.get("cache_write", price["prompt"]) + completion_tokens * price["completion"])
        return usd_micro / 1_000_000


def _read_prices(path: Path, *, setting: str) -> tuple[str | None, dict[str, dict[str, Any]]]:
    """A price file: optional ``as_of`` and ``[sources]``, then models at the top level or under ``[models]``."""
    as_of, entries, _ = _price_file(path, setting=setting)
    prices: dict[str, dict[str, Any]] = {}
    for model, price in entries.items():
        if isinstance(price, dict):
            price = {k: v for k, v in price.items() if k not in PROVENANCE_FIELDS}
        tier = price.pop(LONG_PROMPT, None) if isinstance(price, dict) else None
        if not _valid_rates(price):
            raise SettingsInvalid(
                f"price table {path}: {model!r} needs non-negative 'prompt' and 'completion' USD per million tokens "
                "(and may have 'cached', 'cache_write' and a 'long_prompt' tier)",
                setting=setting,
            )
        prices[model] = {k: float(v) for k, v in price.items()}
        if tier is not None:
            prices[model][LONG_PROMPT] = _read_tier(tier, path=path, model=model, setting=setting)
    return (str(as_of) if as_of is not None else None), prices


def _price_file(path: Path, *, setting: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(as_of, the model entries, the [sources] table) of a price file, read and parsed."""
    try:
        raw = path.read_text()
        data = dict(tomllib.loads(raw) if path.suffix == ".toml" else json.loads(raw))
    except (OSError, ValueError, TypeError) as exc:
        raise SettingsInvalid(f"price table {path} cannot be read: {exc} (setting RLM_PRICE_TABLE_FILE)",
                              setting=setting) from None
    as_of = data.pop("as_of", None)
    sources = data.pop("sources", {})
    models = data.pop("models", {})
    return as_of, {**(models if isinstance(models, dict) else {}), **data}, sources if isinstance(sources, dict) else {}


def price_provenance(path: Path = BUNDLED_PRICES) -> dict[str, dict[str, str | None]]:
    """Each model's ``source`` (its [sources] entry resolved to the page's address) and ``checked`` date."""
    _, entries, sources = _price_file(path, setting="price_table_file")
    provenance: dict[str, dict[str, str | None]] = {}
    for model, price in entries.items():
        price = price if isinstance(price, dict) else {}
        source = price.get("source")
        provenance[model] = {"source": sources.get(source, source) if isinstance(source, str) else None,
                             "checked": price.get("checked") if isinstance(price.get("checked"), str) else None}
    return provenance


def _valid_rates(price: Any) -> bool:
    return (isinstance(price, dict) and REQUIRED_PRICE_FIELDS <= set(price) <= PRICE_FIELDS
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in price.values()))


def _read_tier(tier: Any, *, path: Path, model: str, setting: str) -> dict[str, float]:
    above = tier.pop("above", None) if isinstance(tier, dict) else None
    if not isinstance(above, int) or isinstance(above, bool) or above < 1 or not _valid_rates(tier):
        raise SettingsInvalid(
            f"price table {path}: {model!r} has a bad 'long_prompt' tier; it needs 'above' (a prompt size in tokens, "
            "at least 1) and non-negative 'prompt' and 'completion' USD per million tokens (and may have 'cached' "
            "and 'cache_write')",
            setting=setting,
        )
    return {"above": above, **{k: float(v) for k, v in tier.items()}}


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
