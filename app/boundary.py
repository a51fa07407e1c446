"""The outermost guard of the A2A routes: every answer is in the error catalogue, nothing leaves with its own text.

``@converting_foreign_errors`` (app/errors.py) covers what the SDK calls on the
request handler. Some paths run outside it: the SDK's own JSON-RPC and REST
dispatch (its body parse, its envelope checks, its "Unhandled exception"
branch, which answers ``str(exc)``), and the edge's guard in front of the SDK
(the key lookup, the rate-limit counters, both in PostgreSQL). This middleware
wraps all of them, for ``/specialists/<id>/...`` except the public card:

- an exception that escapes before the answer started is answered in the
  catalogue's form: ``database_unavailable`` (503, ``Retry-After``) when
  PostgreSQL cannot be reached, otherwise the internal error (a fixed message and
  the request id); the detail goes to the log with the request id;
- an internal error the SDK wrote itself (JSON-RPC -32603 without the edge's
  ``code``, or an HTTP+JSON 500) is replaced by the catalogue's internal error,
  and its text goes to the log instead;
- a 503 without ``Retry-After`` gets one.

Event streams pass untouched: their errors come from the handler, already converted.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from a2a.utils.errors import A2AError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.cards import CARD_PATHS
from app.errors import INTERNAL_MESSAGE, Binding, edge_error_for, error_response, internal_error
from app.observability import Metrics, note_refusal

log = logging.getLogger(__name__)

JSON_RPC_INTERNAL = -32603


def is_a2a_call(scope: Scope) -> bool:
    path = scope.get("path", "")
    return scope["type"] == "http" and path.startswith("/specialists/") and not path.endswith(CARD_PATHS)


def binding_of(path: str) -> Binding:
    return "jsonrpc" if path.endswith("/jsonrpc") else "rest"


def _uncatalogued_json_rpc_error(body: bytes) -> str | None:
    """The message of a JSON-RPC internal error that does not carry the edge's ``code``, else None."""
    if str(JSON_RPC_INTERNAL).encode() not in body:  # the usual answer: not parsed at all
        return None
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict) or error.get("code") != JSON_RPC_INTERNAL:
        return None
    return None if _edge_code(error.get("data")) else str(error.get("message"))


def _edge_code(data: Any) -> str | None:
    """The edge's ``code`` in a JSON-RPC error's data: 1.0 puts it in ErrorInfo metadata, 0.3 in data itself."""
    if isinstance(data, dict):
        code = data.get("code")
        return code if isinstance(code, str) else None
    if isinstance(data, list):
        for item in data:
            if isinstance(item, dict) and isinstance(item.get("metadata"), dict):
                code = item["metadata"].get("code")
                if isinstance(code, str):
                    return code
    return None


class ErrorBoundary:
    def __init__(self, app: ASGIApp, *, metrics: Metrics, retry_after_s: int) -> None:
        self.app = app
        self.metrics = metrics
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_a2a_call(scope):
            await self.app(scope, receive, send)
            return
        binding = binding_of(scope["path"])
        answer = _Answer(send, binding, self.retry_after_s)
        try:
            await self.app(scope, receive, answer.send)
        except Exception as exc:  # noqa: BLE001 - the point of this class
            if answer.started:  # a stream broke after its head: nothing more can be said on the wire
                log.error("request failed after its answer started: %s", type(exc).__name__, exc_info=exc,
                          extra={"event": "request_failed"})
                return
            await self._answer(edge_error_for(exc, retry_after_s=self.retry_after_s), binding, scope, receive, send)
            return
        await answer.flush()

    async def _answer(self, error: A2AError, binding: Binding, scope: Scope, receive: Receive, send: Send) -> None:
        code = (error.data or {}).get("code", "internal_error")
        self.metrics.count_refusal(code)
        note_refusal(code)
        headers = {"Retry-After": str(self.retry_after_s)} if code == "database_unavailable" else None
        await error_response(error, binding, headers)(scope, receive, send)


class _Answer:
    """The downstream answer: JSON held until complete (so an internal error can be replaced), streams passed on."""

    def __init__(self, send: Send, binding: Binding, retry_after_s: int) -> None:
        self._send = send
        self.binding = binding
        self.retry_after_s = retry_after_s
        self.started = False  # the head went to the client
        self._head: Message | None = None
        self._chunks: list[bytes] = []

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers", []))
            if message["status"] == 503 and b"retry-after" not in headers:
                message["headers"] = [*message.get("headers", []), (b"retry-after", str(self.retry_after_s).encode())]
            if not headers.get(b"content-type", b"").startswith(b"application/"):
                self.started = True  # an event stream (or anything not JSON): on its way
                await self._send(message)
                return
            self._head = message
            return
        if self._head is None:
            await self._send(message)
            return
        if message["type"] == "http.response.body":
            self._chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                await self.flush()
            return
        await self._send(message)

    async def flush(self) -> None:
        if self._head is None:
            return
        head, self._head = self._head, None
        body = b"".join(self._chunks)
        self._chunks = []
        leaked = self._leak(head["status"], body)
        if leaked is not None:
            log.error("an internal error left the SDK: %s", leaked[:2000], extra={"event": "request_failed"})
            replacement = error_response(internal_error(), self.binding)
            status = head["status"] if self.binding == "jsonrpc" else replacement.status_code
            head = {**head, "status": status,
                    "headers": [(k, v) for k, v in head.get("headers", []) if k != b"content-length"]
                    + [(b"content-length", str(len(replacement.body)).encode())]}
            body = replacement.body
        self.started = True
        await self._send(head)
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    def _leak(self, status: int, body: bytes) -> str | None:
        """The text of an internal error that is not the catalogue's, if this answer is one."""
        if self.binding == "jsonrpc":
            return _uncatalogued_json_rpc_error(body)
        if status != 500:
            return None
        try:
            error = json.loads(body).get("error", {})
        except (ValueError, AttributeError):
            return body.decode(errors="replace")
        details = error.get("details") if isinstance(error, dict) else None
        if _edge_code(details) and error.get("message") == INTERNAL_MESSAGE:
            return None  # already the catalogue's internal error
        return str(error.get("message") if isinstance(error, dict) else body)
