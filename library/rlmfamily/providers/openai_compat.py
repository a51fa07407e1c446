"""Any OpenAI-compatible chat-completions endpoint (OpenAI, OpenRouter, vLLM, Ollama...) via the official client.

Configured by base URL, model id and the NAME of the environment variable that
holds the key; the key is read here, on the host, and never stored or shown.
Retries with exponential backoff cover connections that could not be opened
and 429/5xx answers (nothing was billed). A timeout or a connection broken
mid-call is not retried: the attempt may have been billed, so its usage is
unknown and a retry could bill twice.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from threading import Lock
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import openai

from rlmfamily.errors import MissingAPIKey, ProviderError, ProviderTimeout
from rlmfamily.providers.base import Completion, PriceTable, ToolCall, Usage
from rlmfamily.providers.retry import HTTP_ERRORS, RETRYABLE_STATUS, Retryable, never_sent, with_retries
from rlmfamily.settings import RLMSettings

MAX_STATUS_DETAIL_CHARS = 300  # of an error body quoted in a ProviderError


class OpenAIProvider:
    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key_env: str,
        prices: PriceTable | None = None,
        temperature: float | None = None,
        max_completion_tokens: int | None = None,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        key = env.get(api_key_env)
        if not key:
            raise MissingAPIKey(
                f"the environment variable {api_key_env} is not set; put the API key for {base_url} in it, "
                "or name another variable with --api-key-env / RLM_API_KEY_ENV",
                setting="api_key_env",
                variable=api_key_env,
            )
        self.base_url = base_url
        self.api_key_env = api_key_env  # the NAME only: a child process reads the key again (rlmfamily/family/spec.py)
        self.default_model = model
        self.prices = prices or PriceTable()
        self.temperature = temperature  # None: the endpoint's default
        self.max_completion_tokens = max_completion_tokens  # None: the endpoint's default
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        # Imported on first use: the client and its types take about a second to import, which every process
        # that only might call a model (a worker starting, a job's process) would otherwise pay.
        import openai

        # Our own retry loop (below) decides what is safe to retry; the client's would retry timeouts.
        self._client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
        self._lock = Lock()
        self.calls: Counter[str] = Counter()
        self.attempts = 0

    def reports_cost(self, model: str) -> bool:
        return self.prices.has(model)

    def child_spec(self) -> dict[str, Any]:
        """How a child process rebuilds this provider (rlmfamily/family/spec.py): the key's variable NAME, never the key."""
        return {"factory": f"{__name__}:child_provider", "kwargs": {
            "base_url": self.base_url, "model": self.default_model, "api_key_env": self.api_key_env,
            "max_retries": self.max_retries, "backoff_s": self.backoff_s,
            "temperature": self.temperature, "max_completion_tokens": self.max_completion_tokens,
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
        return with_retries(
            lambda remaining_s: self._completion(self._send(messages, tools, model_id, remaining_s, timeout_s), model_id),
            model_id=model_id, timeout_s=timeout_s, max_retries=self.max_retries, backoff_s=self.backoff_s,
            on_attempt=self._count_attempt,
        )

    def _count_attempt(self) -> None:
        with self._lock:
            self.attempts += 1

    def _send(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, model_id: str,
              remaining_s: float, timeout_s: float) -> Any:
        """One request. The one place where the client's exceptions (openai, httpx) become ProviderErrors."""
        import openai  # imported by __init__ already: a dictionary lookup

        kwargs: dict[str, Any] = {"model": model_id, "messages": messages, "timeout": remaining_s}
        if tools:
            kwargs["tools"] = tools
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.max_completion_tokens is not None:
            kwargs["max_completion_tokens"] = self.max_completion_tokens
        try:
            return self._client.chat.completions.create(**kwargs)
        except openai.APITimeoutError:
            raise ProviderTimeout(
                f"{model_id} at {self.base_url} did not answer within {timeout_s:g} s "
                "(per-call timeout: RLM_SUBCALL_TIMEOUT_S for sub-calls, RLM_STEP_TIMEOUT_S scale for root turns)",
                billed=None,
            ) from None
        except openai.APIConnectionError as exc:
            if not never_sent(exc):
                # The request may have reached the model: its usage is unknown, and a retry could bill twice.
                raise ProviderError(f"the connection to {self.base_url} broke during the call: {exc}",
                                    billed=None) from None
            raise Retryable(f"cannot reach {self.base_url}: {exc}", billed=False) from None
        except openai.APIStatusError as exc:
            error = Retryable if exc.status_code in RETRYABLE_STATUS else ProviderError
            raise error(f"{self.base_url} answered HTTP {exc.status_code} for model {model_id}: {_status_detail(exc)}",
                        billed=False, status=exc.status_code) from None
        except (openai.OpenAIError, *HTTP_ERRORS) as exc:  # e.g. an answer the client cannot parse
            raise ProviderError(f"{self.base_url} failed for model {model_id}: {type(exc).__name__}: {exc}",
                                billed=None) from None

    def _completion(self, response: Any, model_id: str) -> Completion:
        if not getattr(response, "choices", None):
            raise ProviderError(f"{self.base_url} answered without choices for model {model_id}", billed=None)
        message = response.choices[0].message
        calls = []
        for call in message.tool_calls or ():
            function = getattr(call, "function", None)
            if function is None:
                continue
            calls.append(ToolCall(id=call.id, name=function.name, code=_code_from_arguments(function.arguments)))
        usage = None
        if response.usage is not None and response.usage.prompt_tokens is not None:
            prompt = int(response.usage.prompt_tokens)
            completion = int(response.usage.completion_tokens or 0)
            details = getattr(response.usage, "prompt_tokens_details", None)
            cached = getattr(details, "cached_tokens", None)  # part of prompt_tokens, billed at the cached price
            cached = int(cached) if isinstance(cached, int) else None
            cost = self.prices.cost(model_id, prompt, completion, cache_read_tokens=cached)
            reported = getattr(response.usage, "cost", None)  # OpenRouter reports the charge itself
            if cost is None and isinstance(reported, (int, float)):
                cost = float(reported)
            usage = Usage(prompt, completion, cost, cache_read_tokens=cached)
        return Completion(
            text=message.content or "",
            tool_calls=tuple(calls),
            usage=usage,
            model=getattr(response, "model", None) or model_id,
        )


def child_provider(*, settings: RLMSettings, prompt: str, base_url: str, model: str, api_key_env: str,
                   max_retries: int, backoff_s: float, temperature: float | None = None,
                   max_completion_tokens: int | None = None) -> OpenAIProvider:
    """A child process's provider (``child_spec``'s factory); the key is read again from its environment."""
    prices = PriceTable.load(settings.prices_usd_per_mtok, settings.price_table_file)
    return OpenAIProvider(base_url=base_url, model=model, api_key_env=api_key_env, prices=prices,
                          temperature=temperature, max_completion_tokens=max_completion_tokens,
                          max_retries=max_retries, backoff_s=backoff_s)


def _code_from_arguments(arguments: str | None) -> str:
    # Models occasionally send the code raw instead of {"code": "..."}: run what they meant.
    if not arguments:
        return ""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict):
        code = parsed.get("code")
        return code if isinstance(code, str) else ""
    return arguments


def _status_detail(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:MAX_STATUS_DETAIL_CHARS]
    return str(exc.message)[:MAX_STATUS_DETAIL_CHARS]
