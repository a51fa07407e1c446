"""What every HTTP model provider shares: the key, the sampling and retry settings, call counts, the retry loop,
the conversion of the official clients' exceptions, and how a child process rebuilds the provider.

A subclass holds only what its wire protocol differs in: the client it opens
(``_open_client``), the request body (``_request``), the call (``_create``) and
the reading of the answer (``_completion``, usage and cost from the price
table). Both official clients (``openai``, ``anthropic``) are generated from the
same template, so their exception classes have the same names and are
converted here, in one place. The key is read from the variable *named* in
``api_key_env`` and never stored.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping
from threading import Lock
from typing import Any, ClassVar

from rlmfamily.errors import MissingAPIKey, ProviderError, ProviderTimeout
from rlmfamily.providers.base import Completion, PriceTable
from rlmfamily.providers.retry import HTTP_ERRORS, RETRYABLE_STATUS, Retryable, never_sent, with_retries
from rlmfamily.settings import RLMSettings

MAX_STATUS_DETAIL_CHARS = 300  # of an error body quoted in a ProviderError


class HTTPProvider(ABC):
    """A model behind an HTTP API, called through its official client. Subclasses give the wire protocol."""

    name: ClassVar[str]
    key_for: ClassVar[str]  # whose key the variable holds, for the missing-key message: "the Anthropic API key"
    sdk_error: ClassVar[str]  # the root exception class of the client module: "OpenAIError"
    default_max_completion_tokens: ClassVar[int | None] = None  # None: the endpoint's default

    def __init__(
        self,
        *,
        model: str,
        api_key_env: str,
        base_url: str | None = None,
        prices: PriceTable | None = None,
        temperature: float | None = None,
        max_completion_tokens: int | None = None,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        sdk = self._sdk()  # first: a missing optional client is named before a missing key
        env = os.environ if environ is None else environ
        key = env.get(api_key_env)
        if not key:
            raise MissingAPIKey(
                f"the environment variable {api_key_env} is not set; put {self.key_for.format(base_url=base_url)} "
                "in it, or name another variable with --api-key-env / RLM_API_KEY_ENV",
                setting="api_key_env",
                variable=api_key_env,
            )
        self.api_key_env = api_key_env  # the NAME only: a child process reads the key again (rlmfamily/family/spec.py)
        self.default_model = model
        self.prices = prices or PriceTable()
        self.temperature = temperature  # None: the endpoint's default
        self.max_completion_tokens = max_completion_tokens or self.default_max_completion_tokens
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        # Our own retry loop decides what is safe to retry; the client's would retry timeouts.
        self._client = self._open_client(sdk, key, base_url)
        # base_url None: the client's own default (its environment variable, else the vendor's URL).
        self.base_url = base_url if base_url is not None else str(self._client.base_url).rstrip("/")
        self._lock = Lock()
        self.calls: Counter[str] = Counter()
        self.attempts = 0

    # ---------- what a wire protocol gives ----------

    @staticmethod
    @abstractmethod
    def _sdk() -> Any:
        """The client module, imported (each takes about half a second, so only when a provider is built)."""

    @abstractmethod
    def _open_client(self, sdk: Any, key: str, base_url: str | None) -> Any:
        """The client, with its own retries off (``with_retries`` decides what is safe to send again)."""

    @abstractmethod
    def _request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 model_id: str) -> dict[str, Any]:
        """The keyword arguments of one call, built once and sent again on a retry."""

    @abstractmethod
    def _create(self, request: dict[str, Any], timeout_s: float) -> Any:
        """Send one request with the client, within ``timeout_s``."""

    @abstractmethod
    def _completion(self, response: Any, model_id: str) -> Completion:
        """The answer's text, python calls and usage (with its cost from the price table)."""

    # ---------- shared ----------

    def reports_cost(self, model: str) -> bool:
        return self.prices.has(model)

    def child_spec(self) -> dict[str, Any]:
        """How a child process rebuilds this provider (rlmfamily/family/spec.py): the key's variable NAME, never the key."""
        return {"factory": f"{type(self).__module__}:child_provider", "kwargs": {
            "base_url": self.base_url, "model": self.default_model, "api_key_env": self.api_key_env,
            "temperature": self.temperature, "max_completion_tokens": self.max_completion_tokens,
            "max_retries": self.max_retries, "backoff_s": self.backoff_s,
        }}

    @classmethod
    def for_child(cls, *, settings: RLMSettings, prompt: str, **kwargs: Any) -> HTTPProvider:
        """A child process's provider (``child_spec``'s factory); the key is read again from its environment."""
        return cls(prices=PriceTable.load(settings.prices_usd_per_mtok, settings.price_table_file), **kwargs)

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

    def _send(self, request: dict[str, Any], model_id: str, remaining_s: float, timeout_s: float) -> Any:
        """One request. The one place where the client's exceptions (and httpx's) become ProviderErrors."""
        sdk = self._sdk()  # imported by __init__ already: a dictionary lookup
        try:
            return self._create(request, remaining_s)
        except sdk.APITimeoutError:
            raise ProviderTimeout(
                f"{model_id} at {self.base_url} did not answer within {timeout_s:g} s "
                "(per-call timeout: RLM_SUBCALL_TIMEOUT_S for sub-calls, RLM_ROOT_TIMEOUT_S for root turns)",
                billed=None,
            ) from None
        except sdk.APIConnectionError as exc:
            if not never_sent(exc):
                # The request may have reached the model: its usage is unknown, and a retry could bill twice.
                raise ProviderError(f"the connection to {self.base_url} broke during the call: {exc}",
                                    billed=None) from None
            raise Retryable(f"cannot reach {self.base_url}: {exc}", billed=False) from None
        except sdk.APIStatusError as exc:
            error = Retryable if exc.status_code in RETRYABLE_STATUS else ProviderError
            raise error(f"{self.base_url} answered HTTP {exc.status_code} for model {model_id}: {status_detail(exc)}",
                        billed=False, status=exc.status_code) from None
        except (getattr(sdk, self.sdk_error), *HTTP_ERRORS) as exc:  # e.g. an answer the client cannot parse
            raise ProviderError(f"{self.base_url} failed for model {model_id}: {type(exc).__name__}: {exc}",
                                billed=None) from None


def status_detail(exc: Any) -> str:
    """What the server said in an error answer: its ``error.message``, else the client's message, bounded."""
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:MAX_STATUS_DETAIL_CHARS]
    return str(exc.message)[:MAX_STATUS_DETAIL_CHARS]
