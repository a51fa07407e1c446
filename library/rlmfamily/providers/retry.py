"""The retry loop both HTTP providers share: what may be retried, how long to wait, when to give up.

A failure is retried only when the request never billed: a connection that
could not be opened, or an answer with a retryable status (429, 5xx, 529
"overloaded"). A timeout or a connection broken mid-call may have been billed,
so it is never retried here: its usage is unknown and a retry could bill twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import httpx

from rlmfamily.errors import ProviderError, ProviderTimeout

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})  # 529: Anthropic's "overloaded"
MAX_CAUSE_DEPTH = 10  # links of an exception chain searched for a connect error (chains can loop)

T = TypeVar("T")


class Retryable(ProviderError):
    """A failure whose request never billed (never sent, or a retryable status): ``with_retries`` retries it."""


def with_retries(send: Callable[[float], T], *, model_id: str, timeout_s: float, max_retries: int,
                 backoff_s: float, on_attempt: Callable[[], None]) -> T:
    """Call ``send(remaining_s)`` until it returns, retrying ``Retryable`` up to ``max_retries`` times in ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        attempt += 1
        on_attempt()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ProviderTimeout(f"{model_id} did not answer within {timeout_s:g} s, retries included", billed=None)
        try:
            return send(remaining)
        except Retryable as error:
            if attempt > max_retries:
                raise ProviderError(
                    f"{error.message} (gave up after {attempt} attempts; RLM_PROVIDER_MAX_RETRIES={max_retries})",
                    billed=error.billed, **error.details,
                ) from None
        time.sleep(min(backoff_s * (2 ** (attempt - 1)), max(0.0, deadline - time.monotonic())))


def _transport_errors() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(connect errors, every HTTP error) of httpx and, when installed, httpx2 (the official clients' transport)."""
    connect: list[type[BaseException]] = [httpx.ConnectError, httpx.ConnectTimeout, ConnectionRefusedError]
    http: list[type[BaseException]] = [httpx.HTTPError]
    try:
        import httpx2

        connect += [httpx2.ConnectError, httpx2.ConnectTimeout]
        http.append(httpx2.HTTPError)
    except ImportError:
        pass
    return tuple(connect), tuple(http)


CONNECT_ERRORS, HTTP_ERRORS = _transport_errors()


def never_sent(exc: BaseException) -> bool:
    """True when the connection was never opened (refused, DNS, connect timeout): the request did not leave."""
    seen: BaseException | None = exc
    for _ in range(MAX_CAUSE_DEPTH):
        if seen is None:
            break
        if isinstance(seen, CONNECT_ERRORS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
