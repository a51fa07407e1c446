"""Fake model servers of the providers' tests: Gemini's REST protocol, and the OpenAI-compatible servers people run.

Each speaks the wire format its real counterpart does, quirks included, on 127.0.0.1
(FakeModelServer in tests/rlm/conftest.py records every request, path and header).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..conftest import FakeModelServer, FakeOpenAI


class FakeGemini(FakeModelServer):
    """Gemini's generateContent: POST {base_url}/v1beta/models/{model}:generateContent, camelCase JSON.

    A spec may give ``text``, ``code`` (a python function call), ``signature`` (its thoughtSignature,
    base64), ``thought`` (a thought summary part), the usageMetadata counts (``prompt``, ``candidates``,
    ``cached``, ``thoughts``) or ``usage=False`` (no usageMetadata), and ``status`` for an error.
    """

    @property
    def base_url(self) -> str:  # the client adds /v1beta/models/...
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    @staticmethod
    def error(spec: dict[str, Any]) -> dict[str, Any]:
        status = spec.get("status", 500)
        kind = {400: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE"}.get(status, "INTERNAL")
        return {"error": {"code": status, "message": spec.get("message", "boom"), "status": kind}}

    @staticmethod
    def completion(request: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        if spec.get("thought"):
            parts.append({"text": spec["thought"], "thought": True})
        if spec.get("text") or "code" not in spec:
            parts.append({"text": spec.get("text", "default answer")})
        if "code" in spec:
            part: dict[str, Any] = {"functionCall": {"name": "python", "args": {"code": spec["code"]}}}
            if "call_id" in spec:
                part["functionCall"]["id"] = spec["call_id"]
            if "signature" in spec:
                part["thoughtSignature"] = spec["signature"]
            parts.append(part)
        payload: dict[str, Any] = {
            "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
            "modelVersion": spec.get("model_version", "gemini-test-001"),
            "responseId": spec.get("response_id", "resp-1"),
        }
        if spec.get("usage", True):
            usage = {"promptTokenCount": spec.get("prompt", 100), "candidatesTokenCount": spec.get("candidates", 20)}
            if "cached" in spec:
                usage["cachedContentTokenCount"] = spec["cached"]
            if "thoughts" in spec:
                usage["thoughtsTokenCount"] = spec["thoughts"]
            usage["totalTokenCount"] = usage["promptTokenCount"] + usage["candidatesTokenCount"] + spec.get("thoughts", 0)
            payload["usageMetadata"] = usage
        return payload


class FakeLocalServer(FakeOpenAI):
    """An OpenAI-compatible server with one product's usage quirks (``flavour``), as its docs and answers show.

    - ``vllm``: usage without prompt_tokens_details (prefix caching is not reported per request).
    - ``ollama``: usage present, no details; ``system_fingerprint`` "fp_ollama"; the key is ignored.
    - ``llamacpp``: usage, plus ``timings`` (cache_n: prompt tokens reused from the slot's KV cache) beside it.
    - ``openrouter``: usage with ``cost`` (USD, the charge) and prompt_tokens_details.cached_tokens.
    - ``azure``: (the v1 API, .../openai/v1) usage with prompt_tokens_details.cached_tokens,
      ``prompt_filter_results`` and per-choice ``content_filter_results``; ``model`` is the
      underlying model, not the deployment name the request gave.
    - ``nousage``: no usage object at all (an old or misconfigured server).
    """

    def __init__(self, flavour: str) -> None:
        super().__init__()
        self.flavour = flavour

    def completion(self, request: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        payload = FakeOpenAI.completion(request, {**spec, "usage": False})
        prompt, completion = spec.get("prompt_tokens", 100), spec.get("completion_tokens", 20)
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion}
        if self.flavour == "nousage":
            return payload
        if self.flavour == "ollama":
            payload["system_fingerprint"] = "fp_ollama"
        elif self.flavour == "llamacpp":
            payload["timings"] = {"cache_n": spec.get("cached_tokens", 0), "prompt_n": prompt,
                                  "predicted_n": completion, "prompt_ms": 12.5, "predicted_ms": 40.0}
        elif self.flavour == "openrouter":
            usage["cost"] = spec.get("cost", 0.00042)
            usage["prompt_tokens_details"] = {"cached_tokens": spec.get("cached_tokens", 0)}
            usage["completion_tokens_details"] = {"reasoning_tokens": 0}
            payload["provider"] = "SomeHost"
        elif self.flavour == "azure":
            usage["prompt_tokens_details"] = {"cached_tokens": spec.get("cached_tokens", 0)}
            payload["prompt_filter_results"] = [{"prompt_index": 0, "content_filter_results": {}}]
            payload["choices"][0]["content_filter_results"] = {"hate": {"filtered": False, "severity": "safe"}}
            payload["model"] = "gpt-5-mini-2025-08-07"
        payload["usage"] = usage
        return payload


@pytest.fixture
def fake_gemini() -> Iterator[FakeGemini]:
    server = FakeGemini()
    yield server
    server.close()


@pytest.fixture
def local_server(request: pytest.FixtureRequest) -> Iterator[FakeLocalServer]:
    server = FakeLocalServer(request.param)
    yield server
    server.close()
