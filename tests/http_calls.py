"""HTTP calls from tests to the processes they start: httpx's functions with a timeout for a loaded machine.

httpx gives up after 5 s by default, and on a loaded 2-core machine an edge that
admits a task, starts a stream or runs its first request after start-up can take
longer than that. What a test proves is the answer, not how fast it came, so
calls from tests wait up to ``TIMEOUT_S``. A test that checks a real client's
timeout (the a2a-sdk client's 5 s, say) builds that client itself.
"""

from __future__ import annotations

from typing import Any

import httpx

TIMEOUT_S = 60.0


def _with_timeout(kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs.setdefault("timeout", TIMEOUT_S)
    return kwargs


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, url, **_with_timeout(kwargs))


def get(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.get(url, **_with_timeout(kwargs))


def head(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.head(url, **_with_timeout(kwargs))


def post(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(url, **_with_timeout(kwargs))


def put(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.put(url, **_with_timeout(kwargs))


def delete(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.delete(url, **_with_timeout(kwargs))


def stream(method: str, url: str, **kwargs: Any) -> Any:
    return httpx.stream(method, url, **_with_timeout(kwargs))
