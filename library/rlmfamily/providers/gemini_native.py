"""Google's Gemini API via the official ``google-genai`` client (the optional extra ``rlmfamily[gemini]``).

The session speaks chat messages in the OpenAI shape; this module translates
them to ``generateContent`` (a ``system_instruction``, ``user``/``model``
contents of parts, ``function_call`` / ``function_response`` parts) and the
answer back. Usage is ``usageMetadata``: ``promptTokenCount`` counts every
prompt token, the ``cachedContentTokenCount`` read from Gemini's implicit cache
among them (priced at the table's ``cached`` rate); output is
``candidatesTokenCount`` plus ``thoughtsTokenCount``, since Google bills
thinking as output. An answer without ``usageMetadata`` has unknown usage.

Gemini 3 refuses a conversation whose function calls come back without the
``thoughtSignature`` they were answered with, so the provider keeps each call's
signature by its call id (bounded: ``MAX_SIGNATURES``) and sends it back. A
conversation from elsewhere (a resume in a new process, a scripted history) has
no signature; its calls are sent with the placeholder Google documents for
history the client did not receive.

The key (``GEMINI_API_KEY`` by default, sent as ``x-goog-api-key``) and the
retry loop are ``HTTPProvider``'s; the client's own retries are off. Its
exceptions are not the OpenAI-template ones ``HTTPProvider._send`` converts, so
this module converts them (``_send``).
"""

from __future__ import annotations

import base64
import json
from collections import OrderedDict
from typing import Any

from rlmfamily.errors import ProviderError, ProviderTimeout, SettingsInvalid
from rlmfamily.providers.base import Completion, ToolCall, Usage, tool_call
from rlmfamily.providers.http import MAX_STATUS_DETAIL_CHARS, HTTPProvider
from rlmfamily.providers.retry import HTTP_ERRORS, RETRYABLE_STATUS, Retryable, never_sent

INSTALL_HINT = "pip install 'rlmfamily[gemini]'"
MAX_SIGNATURES = 10_000  # function calls whose thought signature is kept to send back (oldest forgotten first)
# Google's documented stand-in for a function call the client did not receive from the model itself.
NO_SIGNATURE = b"skip_thought_signature_validator"


def _import_genai() -> Any:
    try:
        from google import genai
    except ImportError:
        raise SettingsInvalid(
            f"provider gemini needs Google's google-genai client, which is not installed: {INSTALL_HINT} "
            "(or choose another provider with --provider / RLM_PROVIDER)",
            setting="provider",
        ) from None
    return genai


class GeminiProvider(HTTPProvider):
    name = "gemini"
    key_for = "the Gemini API key"
    sdk_error = "APIError"

    def __init__(self, *, model: str, api_key_env: str = "GEMINI_API_KEY", **kwargs: Any) -> None:
        self._signatures: OrderedDict[str, bytes] = OrderedDict()
        super().__init__(model=model, api_key_env=api_key_env, **kwargs)

    _sdk = staticmethod(_import_genai)

    def _open_client(self, sdk: Any, key: str, base_url: str | None) -> Any:
        # retry_options None: the client sends once (HTTPProvider's loop decides what is safe to send again).
        options = sdk.types.HttpOptions(base_url=base_url) if base_url else None
        client = sdk.Client(api_key=key, http_options=options)
        client.base_url = client._api_client._http_options.base_url  # HTTPProvider names the endpoint in messages
        return client

    def _request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 model_id: str) -> dict[str, Any]:
        system, contents = self.to_contents(messages)
        config: dict[str, Any] = {}
        if system:
            config["system_instruction"] = system
        if tools:
            config["tools"] = [{"function_declarations": [to_declaration(t) for t in tools]}]
            config["automatic_function_calling"] = {"disable": True}
        if self.temperature is not None:
            config["temperature"] = self.temperature
        if self.max_completion_tokens is not None:
            config["max_output_tokens"] = self.max_completion_tokens
        return {"model": model_id, "contents": contents, "config": config}

    def _create(self, request: dict[str, Any], timeout_s: float) -> Any:
        config = {**request["config"], "http_options": {"timeout": max(1, int(timeout_s * 1000))}}  # milliseconds
        return self._client.models.generate_content(model=request["model"], contents=request["contents"],
                                                    config=config)

    def _send(self, request: dict[str, Any], model_id: str, remaining_s: float, timeout_s: float) -> Any:
        """One request; google-genai's exceptions (and httpx's, which it lets through) become ProviderErrors."""
        from google.genai import errors

        try:
            return self._create(request, remaining_s)
        except errors.APIError as exc:
            status = int(exc.code) if isinstance(exc.code, int) else 0
            error = Retryable if status in RETRYABLE_STATUS else ProviderError
            detail = str(exc.message or exc.status or exc)[:MAX_STATUS_DETAIL_CHARS]
            raise error(f"{self.base_url} answered HTTP {status} for model {model_id}: {detail}",
                        billed=False, status=status) from None
        except HTTP_ERRORS as exc:
            if never_sent(exc):
                raise Retryable(f"cannot reach {self.base_url}: {exc}", billed=False) from None
            if any(cls.__name__ == "TimeoutException" for cls in type(exc).__mro__):  # httpx's or httpx2's
                raise ProviderTimeout(
                    f"{model_id} at {self.base_url} did not answer within {timeout_s:g} s "
                    "(per-call timeout: RLM_SUBCALL_TIMEOUT_S for sub-calls, RLM_ROOT_TIMEOUT_S for root turns)",
                    billed=None,
                ) from None
            # The request may have reached the model: its usage is unknown, and a retry could bill twice.
            raise ProviderError(f"the connection to {self.base_url} broke during the call: {exc}",
                                billed=None) from None
        except (ValueError, errors.UnknownApiResponseError) as exc:  # an answer the client cannot parse
            raise ProviderError(f"{self.base_url} failed for model {model_id}: {type(exc).__name__}: {exc}",
                                billed=None) from None

    def _completion(self, response: Any, model_id: str) -> Completion:
        candidates = getattr(response, "candidates", None) or ()
        usage = self._usage(response, model_id)
        if not candidates:
            feedback = getattr(response, "prompt_feedback", None)
            reason = getattr(feedback, "block_reason", None)
            raise ProviderError(f"{self.base_url} answered without a candidate for model {model_id}"
                                + (f" (prompt blocked: {reason})" if reason else ""), billed=None)
        content = getattr(candidates[0], "content", None)
        texts: list[str] = []
        calls: list[ToolCall] = []
        for index, part in enumerate(getattr(content, "parts", None) or ()):
            if part.function_call is not None:
                call = part.function_call
                call_id = call.id or f"gemini-{response.response_id or id(response)}-{index}"
                if part.thought_signature:
                    self._remember(call_id, part.thought_signature)
                if call.name == "python":
                    code = (call.args or {}).get("code")
                    calls.append(ToolCall(id=call_id, name="python", code=code if isinstance(code, str) else ""))
                else:
                    calls.append(tool_call(call_id, call.name or "", dict(call.args or {})))
            elif part.text and not part.thought:  # thought summaries are not the answer
                texts.append(part.text)
        return Completion(text="".join(texts), tool_calls=tuple(calls), usage=usage,
                          model=getattr(response, "model_version", None) or model_id)

    def _usage(self, response: Any, model_id: str) -> Usage | None:
        meta = getattr(response, "usage_metadata", None)
        if meta is None or meta.prompt_token_count is None:
            return None
        # promptTokenCount includes the cached tokens; tool-use prompt tokens are billed as input too.
        prompt = int(meta.prompt_token_count) + int(meta.tool_use_prompt_token_count or 0)
        completion = int(meta.candidates_token_count or 0) + int(meta.thoughts_token_count or 0)
        cached = int(meta.cached_content_token_count or 0)
        cost = self.prices.cost(model_id, prompt, completion, cache_read_tokens=cached)
        return Usage(prompt, completion, cost, cache_read_tokens=cached, cache_creation_tokens=0)

    def _remember(self, call_id: str, signature: bytes) -> None:
        with self._lock:
            self._signatures[call_id] = signature
            while len(self._signatures) > MAX_SIGNATURES:
                self._signatures.popitem(last=False)

    def to_contents(self, messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
        """The system instruction and the ``generateContent`` contents of OpenAI-shaped chat messages.

        Consecutive messages of one role become one content (a model turn's function calls and the
        function responses after it are each one turn, as the API requires).
        """
        system: list[str] = []
        contents: list[dict[str, Any]] = []
        names: dict[str, str] = {}  # tool call id -> function name, for its function_response

        def add(role: str, parts: list[dict[str, Any]]) -> None:
            if contents and contents[-1]["role"] == role:
                contents[-1]["parts"].extend(parts)
            else:
                contents.append({"role": role, "parts": parts})

        for message in messages:
            role, content = message.get("role"), message.get("content")
            if role == "system":
                system.append(content or "")
            elif role == "tool":
                call_id = message.get("tool_call_id") or ""
                add("user", [{"function_response": {"id": call_id, "name": names.get(call_id, "python"),
                                                    "response": {"output": content or ""}}}])
            elif role == "assistant":
                parts: list[dict[str, Any]] = [{"text": content}] if content else []
                for call in message.get("tool_calls") or ():
                    function = call["function"]
                    names[call["id"]] = function["name"]
                    with self._lock:
                        signature = self._signatures.get(call["id"], NO_SIGNATURE)
                    parts.append({"function_call": {"id": call["id"], "name": function["name"],
                                                    "args": _arguments(function.get("arguments"))},
                                  "thought_signature": signature})
                add("model", parts or [{"text": "(no reply)"}])
            else:
                add("user", [{"text": content or ""}])
        return "\n\n".join(system), contents


def to_declaration(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped function tool as a Gemini function declaration (its JSON Schema as given)."""
    function = tool.get("function", tool)
    return {"name": function["name"], "description": function.get("description", ""),
            "parameters_json_schema": function.get("parameters", {"type": "object"})}


def _arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return {"code": arguments}
    return parsed if isinstance(parsed, dict) else {"code": arguments}


def signature_text(signature: bytes) -> str:
    """A signature as the REST API carries it (base64), for tests and records."""
    return base64.b64encode(signature).decode()


child_provider = GeminiProvider.for_child  # the factory named by child_spec()
