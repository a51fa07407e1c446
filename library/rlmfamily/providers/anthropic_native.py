"""Anthropic's Messages API via the official ``anthropic`` client (the optional extra ``rlmfamily[anthropic]``).

The session speaks chat messages in the OpenAI shape (system, user, assistant
with ``tool_calls``, tool results); this module translates them to the Messages
API (a ``system`` parameter, content blocks, ``tool_use`` / ``tool_result``) and
the answer back. Prompt caching: the system prompt (which, with the tool, is the
prefix of every request) and the last block of the conversation carry
``cache_control``, so each turn reads the prefix the previous turn wrote.
The key, the retries (529 "overloaded" among the retried answers) and the
client's exceptions are ``HTTPProvider``'s (providers/http.py).
"""

from __future__ import annotations

import json
from typing import Any

from rlmfamily.errors import SettingsInvalid
from rlmfamily.providers.base import Completion, ToolCall, Usage, tool_call
from rlmfamily.providers.http import HTTPProvider

ANTHROPIC_DEFAULT_MAX_TOKENS = 8192  # the API requires max_tokens; RLM_MAX_COMPLETION_TOKENS overrides it
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


class AnthropicProvider(HTTPProvider):
    name = "anthropic"
    key_for = "the Anthropic API key"
    sdk_error = "AnthropicError"
    default_max_completion_tokens = ANTHROPIC_DEFAULT_MAX_TOKENS

    def __init__(self, *, model: str, api_key_env: str = "ANTHROPIC_API_KEY", **kwargs: Any) -> None:
        super().__init__(model=model, api_key_env=api_key_env, **kwargs)

    _sdk = staticmethod(_import_anthropic)

    def _open_client(self, sdk: Any, key: str, base_url: str | None) -> Any:
        # base_url None: the client's own default (https://api.anthropic.com, or ANTHROPIC_BASE_URL).
        return sdk.Anthropic(api_key=key, base_url=base_url, max_retries=0)

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

    def _create(self, request: dict[str, Any], timeout_s: float) -> Any:
        return self._client.messages.create(**request, timeout=timeout_s)

    def _completion(self, response: Any, model_id: str) -> Completion:
        texts, calls = [], []
        for block in getattr(response, "content", None) or ():
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                if block.name != "python":
                    calls.append(tool_call(block.id, block.name, block.input))
                    continue
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


child_provider = AnthropicProvider.for_child  # the factory named by child_spec()
