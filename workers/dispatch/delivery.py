"""Delivering a job to the worker endpoint over HTTP, and what the answer means for the queue.

The embedded dispatcher (one machine: the outbox is the queue) delivers with
``deliver_over_http`` and acts on the verdict; Cloud Tasks reads the same
answers by status code. The worker's answer codes are listed in workers/server.py.

* ``done``: the job finished, was already finished, is unknown (an operator
  reconciles it), or our result was stale; stop delivering (``row_closed``: the
  worker's finish already closed the job's outbox row).
* ``retry``: busy, at capacity, certificates or database unavailable, the worker
  unreachable or failing; deliver again after ``retry_delay_s``.
* ``refused``: the worker refused the delivery itself (authentication, size,
  a specialist it does not serve). Retrying the same bytes cannot help; this is a
  configuration problem for an operator, and the job has not run.

The requests go over ``WorkerConnections``: keep-alive HTTP/1.1 connections of the
standard library's ``http.client``, pooled per worker URL (issue 44: a delivery
through httpx cost the dispatcher 0.36-0.38 ms of CPU, through ``http.client``
0.09; the dispatcher's CPU per job was 1.9-2.3 ms).
"""

from __future__ import annotations

import http.client
import json
import random
import select
import ssl
import threading
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import certifi

from workers.dispatch.base import DispatchJob
from workers.dispatch.cloud_tasks import BODY_CONTENT_TYPE

Verdict = Literal["done", "retry", "refused"]


@dataclass(frozen=True)
class DeliveryResult:
    verdict: Verdict
    status: int | None  # None: no HTTP answer (connection refused, reset, timed out)
    code: str
    retry_after_s: float | None = None
    # done: the worker's finish closed the job's outbox row in its transaction (its answer's ``row_closed``).
    row_closed: bool = False


# A worker's answer is a short JSON object (workers/server.py); one longer than this is read no further, its code
# taken as unknown, and its connection closed.
MAX_ANSWER_BYTES = 64 * 1024


@dataclass(frozen=True)
class _Endpoint:
    https: bool
    host: str
    port: int | None
    target: str  # the request target: path and query


class WorkerConnections:
    """Keep-alive connections to the worker URLs, shared by the delivery threads: each request takes an idle
    connection of its URL (or opens one) and gives it back once its answer is read, keeping at most
    ``max_idle_per_url`` idle per URL. A pooled connection the worker closed while it sat idle (its keep-alive
    timeout, a restart) is seen by its socket before reuse, without a round trip, and a new one is opened."""

    def __init__(self, *, max_idle_per_url: int) -> None:
        assert max_idle_per_url >= 1, max_idle_per_url
        self.max_idle_per_url = max_idle_per_url
        self._lock = threading.Lock()
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}
        self._endpoints: dict[str, _Endpoint] = {}
        self._tls: ssl.SSLContext | None = None

    def _endpoint(self, url: str) -> _Endpoint:
        endpoint = self._endpoints.get(url)
        if endpoint is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"a worker URL must be http:// or https:// with a host, got {url!r}")
            endpoint = _Endpoint(parts.scheme == "https", parts.hostname, parts.port,
                                 (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
            self._endpoints[url] = endpoint
        return endpoint

    def _take(self, url: str, endpoint: _Endpoint, timeout_s: float) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection of ``url`` that is still open (True: reused), or a new one."""
        while True:
            with self._lock:
                idle = self._idle.get(url)
                connection = idle.pop() if idle else None
            if connection is None:
                break
            if _open(connection):
                connection.timeout = timeout_s
                if connection.sock is not None:
                    connection.sock.settimeout(timeout_s)
                return connection, True
            connection.close()
        if endpoint.https:
            if self._tls is None:  # the public CAs as httpx verified them (certifi's)
                self._tls = ssl.create_default_context(cafile=certifi.where())
            return http.client.HTTPSConnection(endpoint.host, endpoint.port, timeout=timeout_s,
                                               context=self._tls), False
        return http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout_s), False

    def _give_back(self, url: str, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(url, [])
            if len(idle) < self.max_idle_per_url:
                idle.append(connection)
                return
        connection.close()

    def post(self, url: str, body: bytes, *, content_type: str, timeout_s: float) -> tuple[int, str | None, bytes]:
        """POST ``body``; the answer's status, its Retry-After header and its body (at most ``MAX_ANSWER_BYTES``).
        Raises ``TimeoutError`` (no answer within ``timeout_s`` of any step) or ``OSError`` /
        ``http.client.HTTPException`` (no answer). A reused connection the worker closed just as it was taken
        (reset or closed before any byte of an answer) is tried once more on a new one: a delivery is safe to
        repeat, its claim answers it."""
        endpoint = self._endpoint(url)
        headers = {"Content-Type": content_type}
        connection, reused = self._take(url, endpoint, timeout_s)
        try:
            try:
                connection.request("POST", endpoint.target, body=body, headers=headers)
                response = connection.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if not reused:
                    raise
                connection.close()
                connection, reused = self._take(url, endpoint, timeout_s)
                connection.request("POST", endpoint.target, body=body, headers=headers)
                response = connection.getresponse()
            answer = response.read(MAX_ANSWER_BYTES + 1)
            whole = len(answer) <= MAX_ANSWER_BYTES and response.isclosed()
        except BaseException:
            connection.close()
            raise
        if whole and not response.will_close:
            self._give_back(url, connection)
        else:
            connection.close()
        return response.status, response.getheader("retry-after"), answer if whole else b""

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()


def _open(connection: http.client.HTTPConnection) -> bool:
    """Whether a pooled connection may carry a request: its socket has nothing to read. An idle HTTP connection
    is sent nothing but its close (EOF) by a worker that ends it."""
    sock = connection.sock
    if sock is None:
        return True  # not connected yet: it connects on its request
    try:
        waiting = select.poll()
        waiting.register(sock, select.POLLIN | select.POLLPRI)
        return not waiting.poll(0)
    except (OSError, ValueError):
        return False


def _retry_after(value: str | None) -> float | None:
    value = (value or "").strip()
    return float(value) if value.isdigit() else None


def deliver_over_http(job: DispatchJob, *, client: WorkerConnections, timeout_s: float) -> DeliveryResult:
    """POST the signed body to the job's worker URL; ``timeout_s`` plays the dispatch deadline's part."""
    try:
        status, retry_after, answer = client.post(job.worker_url, job.body, content_type=BODY_CONTENT_TYPE,
                                                  timeout_s=timeout_s)
    except TimeoutError:
        return DeliveryResult("retry", None, "worker_timed_out")
    except (OSError, http.client.HTTPException):
        return DeliveryResult("retry", None, "worker_unreachable")
    try:
        parsed = json.loads(answer)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        parsed = {}
    code = str(parsed.get("code", "")) or f"http_{status}"
    if status == 200:
        return DeliveryResult("done", 200, code, row_closed=parsed.get("row_closed") is True)
    if status in (429, 503) or status >= 500:
        return DeliveryResult("retry", status, code, _retry_after(retry_after))
    return DeliveryResult("refused", status, code)


def retry_delay_s(attempt: int, retry_after_s: float | None, *, base_s: float, max_s: float) -> float:
    """Exponential backoff with full jitter, never sooner than the worker's Retry-After, capped at ``max_s``."""
    backoff_s = random.uniform(0, min(max_s, base_s * 2 ** max(0, attempt)))
    return min(max_s, max(backoff_s, retry_after_s or 0.0))
