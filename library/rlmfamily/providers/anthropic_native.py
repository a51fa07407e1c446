"""Anthropic's Messages API via the official ``anthropic`` client (the optional extra ``rlmfamily[anthropic]``).

The session speaks chat messages in the OpenAI shape (system, user, assistant
with ``tool_calls``, tool results); this module translates them to the Messages
API (a ``system`` parameter, content blocks, ``tool_use`` / ``tool_result``) and
the answer back. Prompt caching: the system prompt (which, with the tool, is the
prefix of every request) and the last block of the conversation carry
``cache_control``, so each turn reads the prefix the previous turn wrote.
Retries are the OpenAI provider's (rlmfamily/providers/retry.py), plus 529
"overloaded". The key is read from the variable *named* in ``api_key_env``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from threading import Lock
from typing import Any

from rlmfamily.errors import MissingAPIKey, ProviderError, ProviderTimeout, SettingsInvalid
from rlmfamily.providers.base import Completion, PriceTable, ToolCall, Usage
from rlmfamily.providers.retry import HTTP_ERRORS, RETRYABLE_STATUS, Retryable, never_sent, with_retries
from rlmfamily.settings import RLMSettings

ANTHROPIC_DEFAULT_MAX_TOKENS = 8192  # the API requires max_tokens; RLM_MAX_COMPLETION_TOKENS overrides it
MAX_STATUS_DETAIL_CHARS = 300  # of an error body quoted in a ProviderError
CACHE = {"type": "ephemeral"}
INSTALL_HINT = "pip install 'rlmfamily[anthropic]'"


def _import_anthropic() -> Any:
    try:
        import anthropic
    except ImportError:
        raise SettingsInvalid(
            f"provider anthropic needs the anthropic client, which is not installed: {INSTALL_HINT} "
            "(or choose another provider with --provider / RLM_PROVIDER)",
            setting="provider",
        ) from None
    return anthropic


class AnthropicProvider:
    name = "anthropic"

    def __init__(
        self,
        *,
        model: str,
        api_key_env: str = "ANTHROPIC_API_KEY",
        base_url: str | None = None,
        prices: PriceTable | None = None,
        temperature: float | None = None,
        max_completion_tokens: int | None = None,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        anthropic = _import_anthropic()
        env = os.environ if environ is None else environ
        key = env.get(api_key_env)
        if not key:
            raise MissingAPIKey(
                f"the environment variable {api_key_env} is not set; put the Anthropic API key in it, "
                "or name another variable with --api-key-env / RLM_API_KEY_ENV",
                setting="api_key_env",
                variable=api_key_env,
            )
        self.api_key_env = api_key_env  # the NAME only: a child process reads the key again (rlmfamily/family/spec.py)
        self.default_model = model
        self.prices = prices or PriceTable()
        self.temperature = temperature
        self.max_completion_tokens = max_completion_tokens or ANTHROPIC_DEFAULT_MAX_TOKENS
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        # base_url None: the client's own default (https://api.anthropic.com, or ANTHROPIC_BASE_URL).
        # Our retry loop decides what is safe to retry; the client's would retry timeouts.
        self._client = anthropic.Anthropic(api_key=key, base_url=base_url, max_retries=0)
        self.base_url = str(self._client.base_url).rstrip("/")
        self._lock = Lock()
        self.calls: Counter[str] = Counter()
        self.attempts = 0

    def reports_cost(self, model: str) -> bool:
        return self.prices.has(model)

    def child_spec(self) -> dict[str, Any]:
        """How a child process rebuilds this provider (rlmfamily/family/spec.py): the key's variable NAME, never the key."""
        return {"factory": f"{__name__}:child_provider", "kwargs": {
            "base_url": self.base_url, "model": self.default_model, "api_key_env": self.api_key_env,
            "temperature": self.temperature, "max_completion_tokens": self.max_completion_tokens,
            "max_retries": self.max_retries, "backoff_s": self.backoff_s,
        }}

    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None,
        model: str | None,
        timeout_s: float,
        purpose: str,
    ) -> Completion:
        model_id = model or self.default_model
        with self._lock:
            self.calls[purpose] += 1
        request = self._request(messages, tools, model_id)
        return with_retries(
            lambda remaining_s: self._completion(self._send(request, model_id, remaining_s, timeout_s), model_id),
            model_id=model_id, timeout_s=timeout_s, max_retries=self.max_retries, backoff_s=self.backoff_s,
            on_attempt=self._count_attempt,
        )

    def _count_attempt(self) -> None:
        with self._lock:
            self.attempts += 1

    def _request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 model_id: str) -> dict[str, Any]:
        system, turns = to_messages(messages)
        request: dict[str, Any] = {"model": model_id, "max_tokens": self.max_completion_tokens, "messages": turns}
        if system:
            request["system"] = [{"type": "text", "text": system, "cache_control": CACHE}]
        if tools:
            request["tools"] = [to_tool(t) for t in tools]
        if self.temperature is not None:
            # anthropic 2.x's create() has no temperature argument; the Messages API still reads it from the body.
            request["extra_body"] = {"temperature": self.temperature}
        return request

    def _send(self, request: dict[str, Any], model_id: str, remaining_s: float, timeout_s: float) -> Any:
        """One request. The one place where the client's exceptions become ProviderErrors."""
        anthropic = _import_anthropic()  # imported by __init__ already: a dictionary lookup
        try:
            return self._client.messages.create(**request, timeout=remaining_s)
        except anthropic.APITimeoutError:
            raise ProviderTimeout(
                f"{model_id} at {self.base_url} did not answer within {timeout_s:g} s "
                "(per-call timeout: RLM_SUBCALL_TIMEOUT_S for sub-calls, RLM_ROOT_TIMEOUT_S for root turns)",
                billed=None,
            ) from None
        except anthropic.APIConnectionError as exc:
            if not never_sent(exc):
                raise ProviderError(f"the connection to {self.base_url} broke during the call: {exc}",
                                    billed=None) from None
            raise Retryable(f"cannot reach {self.base_url}: {exc}", billed=False) from None
        except anthropic.APIStatusError as exc:
            error = Retryable if exc.status_code in RETRYABLE_STATUS else ProviderError
            raise error(f"{self.base_url} answered HTTP {exc.status_code} for model {model_id}: {_status_detail(exc)}",
                        billed=False, status=exc.status_code) from None
        except (anthropic.AnthropicError, *HTTP_ERRORS) as exc:  # e.g. an answer the client cannot parse
            raise ProviderError(f"{self.base_url} failed for model {model_id}: {type(exc).__name__}: {exc}",
                                billed=None) from None

    def _completion(self, response: Any, model_id: str) -> Completion:
        texts, calls = [], []
        for block in getattr(response, "content", None) or ():
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                code = block.input.get("code") if isinstance(block.input, dict) else None
                calls.append(ToolCall(id=block.id, name=block.name, code=code if isinstance(code, str) else ""))
        return Completion(text="".join(texts), tool_calls=tuple(calls), usage=self._usage(response, model_id),
                          model=getattr(response, "model", None) or model_id)

    def _usage(self, response: Any, model_id: str) -> Usage | None:
        usage = getattr(response, "usage", None)
        if usage is None or usage.input_tokens is None:
            return None
        # input_tokens counts only the uncached part; Usage.prompt_tokens is every prompt token.
        read = int(getattr(usage, "cache_read_input_tokens", None) or 0)
        written = int(getattr(usage, "cache_creation_input_tokens", None) or 0)
        prompt = int(usage.input_tokens) + read + written
        completion = int(usage.output_tokens or 0)
        cost = self.prices.cost(model_id, prompt, completion, cache_read_tokens=read, cache_creation_tokens=written)
        return Usage(prompt, completion, cost, cache_read_tokens=read, cache_creation_tokens=written)


def to_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped function tool as a Messages API tool."""
    function = tool.get("function", tool)
    return {"name": function["name"], "description": function.get("description", ""),
            "input_schema": function.get("parameters", {"type": "object"})}


def to_messages(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The system text and the Messages API turns of OpenAI-shaped chat messages.

    Consecutive messages of one role become one turn (tool results and the user text after them
    share the user turn the API requires); the last block carries ``cache_control``.
    """
    system: list[str] = []
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for message in messages:
        role, content = message.get("role"), message.get("content")
        if role == "system":
            system.append(content or "")
        elif role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": content or ""}])
        elif role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
            for call in message.get("tool_calls") or ():
                function = call["function"]
                blocks.append({"type": "tool_use", "id": call["id"], "name": function["name"],
                               "input": _arguments(function.get("arguments"))})
            add("assistant", blocks or [{"type": "text", "text": "(no reply)"}])
        else:
            add("user", [{"type": "text", "text": content or ""}])
    if turns:
        last = turns[-1]["content"][-1]
        turns[-1]["content"][-1] = {**last, "cache_control": CACHE}
    return "\n\n".join(system), turns


def _arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return {"code": arguments}
    return parsed if isinstance(parsed, dict) else {"code": arguments}


def child_provider(*, settings: RLMSettings, prompt: str, base_url: str | None, model: str, api_key_env: str,
                   temperature: float | None, max_completion_tokens: int | None, max_retries: int,
                   backoff_s: float) -> AnthropicProvider:
    """A child process's provider (``child_spec``'s factory); the key is read again from its environment."""
    prices = PriceTable.load(settings.prices_usd_per_mtok, settings.price_table_file)
    return AnthropicProvider(base_url=base_url, model=model, api_key_env=api_key_env, prices=prices,
                             temperature=temperature, max_completion_tokens=max_completion_tokens,
                             max_retries=max_retries, backoff_s=backoff_s)


def _status_detail(exc: Any) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:MAX_STATUS_DETAIL_CHARS]
    return str(exc.message)[:MAX_STATUS_DETAIL_CHARS]
