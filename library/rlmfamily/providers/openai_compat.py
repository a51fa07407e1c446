"""Any OpenAI-compatible chat-completions endpoint (OpenAI, Azure OpenAI, OpenRouter, vLLM, Ollama, llama.cpp's
server...) via the official client.

Configured by base URL, model id and the NAME of the environment variable that
holds the key. The servers' usage quirks (docs/RLM.md, "Provider recipes"): an
answer without usage has unknown usage; cached prompt tokens come from
``prompt_tokens_details.cached_tokens``, else llama.cpp's ``timings.cache_n``;
OpenRouter's ``usage.cost`` is the cost of a model the price table lacks. The
key, the retries (connections that could not be opened, 429/5xx answers; never a
timeout or a connection broken mid-call, which may have billed) and the client's
exceptions are ``HTTPProvider``'s (providers/http.py); this module gives the
chat-completions wire format.
"""

from __future__ import annotations

import json
from typing import Any

from rlmfamily.errors import ProviderError
from rlmfamily.providers.base import Completion, ToolCall, Usage, tool_call
from rlmfamily.providers.http import HTTPProvider


class OpenAIProvider(HTTPProvider):
    name = "openai"
    key_for = "the API key for {base_url}"
    sdk_error = "OpenAIError"

    def __init__(self, *, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url=base_url, **kwargs)  # no default endpoint: the settings give one

    @staticmethod
    def _sdk() -> Any:
        import openai

        return openai

    def _open_client(self, sdk: Any, key: str, base_url: str | None) -> Any:
        return sdk.OpenAI(base_url=base_url, api_key=key, max_retries=0)

    def _request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 model_id: str) -> dict[str, Any]:
        request: dict[str, Any] = {"model": model_id, "messages": messages}
        if tools:
            request["tools"] = tools
        if self.temperature is not None:
            request["temperature"] = self.temperature
        if self.max_completion_tokens is not None:
            request["max_completion_tokens"] = self.max_completion_tokens
        return request

    def _create(self, request: dict[str, Any], timeout_s: float) -> Any:
        return self._client.chat.completions.create(**request, timeout=timeout_s)

    def _completion(self, response: Any, model_id: str) -> Completion:
        if not getattr(response, "choices", None):
            raise ProviderError(f"{self.base_url} answered without choices for model {model_id}", billed=None)
        message = response.choices[0].message
        calls = []
        for call in message.tool_calls or ():
            function = getattr(call, "function", None)
            if function is None:
                continue
            if function.name == "python":
                calls.append(ToolCall(id=call.id, name=function.name, code=_code_from_arguments(function.arguments)))
            else:
                calls.append(tool_call(call.id, function.name, function.arguments))
        usage = None
        if response.usage is not None and response.usage.prompt_tokens is not None:
            prompt = int(response.usage.prompt_tokens)
            completion = int(response.usage.completion_tokens or 0)
            details = getattr(response.usage, "prompt_tokens_details", None)
            cached = getattr(details, "cached_tokens", None)  # part of prompt_tokens, billed at the cached price
            cached = int(cached) if isinstance(cached, int) else None
            if cached is None:  # llama.cpp's server: prompt tokens reused from the slot's KV cache
                timings = getattr(response, "timings", None)
                reused = timings.get("cache_n") if isinstance(timings, dict) else None
                cached = reused if isinstance(reused, int) and 0 <= reused <= prompt else None
            written = getattr(details, "cache_write_tokens", None)  # part of prompt_tokens, at the cache-write price
            written = int(written) if isinstance(written, int) else None
            cost = self.prices.cost(model_id, prompt, completion, cache_read_tokens=cached,
                                    cache_creation_tokens=written)
            reported = getattr(response.usage, "cost", None)  # OpenRouter reports the charge itself
            if cost is None and isinstance(reported, (int, float)):
                cost = float(reported)
            usage = Usage(prompt, completion, cost, cache_read_tokens=cached, cache_creation_tokens=written)
        return Completion(
            text=message.content or "",
            tool_calls=tuple(calls),
            usage=usage,
            model=getattr(response, "model", None) or model_id,
        )


child_provider = OpenAIProvider.for_child  # the factory named by child_spec()


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
