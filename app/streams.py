"""The stream slots of one edge instance, and the HTTP answer of a stream refused for want of one.

An event stream (SendStreamingMessage, SubscribeToTask) holds a slot for as long
as it is open. An instance serves at most ``max_open_streams``, and one caller at
most ``max_open_streams_per_customer`` of them, so that no customer can take
every slot (anonymous callers count per client address, as their rate limit does).

The refusal is raised inside the request handler, where the a2a-sdk's JSON-RPC
dispatcher answers every error with HTTP 200. A refused stream must look refused
to proxies and clients on both bindings, so the gate notes the refusal in a
per-request holder and ``StreamRefusalStatus`` (ASGI middleware) starts the
response with the refusal's wire status and ``Retry-After``; the body stays the
binding's own error.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import CustomerStreamCap, EdgeError, ServiceBusy, wire_form
from app.identity import ANONYMOUS, Identity
from app.observability import Metrics, note_refusal
from core.settings import EdgeSettings

# The request's stream refusal, if any: a holder set per request by the middleware, filled in by the gate
# (possibly in a task the SDK started, which sees the same holder).
_refusal_var: ContextVar[dict[str, EdgeError] | None] = ContextVar("stream_refusal", default=None)


def caller_of(identity: Identity) -> str:
    """Whose slots a stream counts against: the customer, or an anonymous caller's address."""
    return identity.customer_id or f"{ANONYMOUS}@{identity.client_address}"


class StreamGate:
    """Counts the event streams this instance serves, in all and per caller, and refuses one over either cap."""

    def __init__(self, settings: EdgeSettings, metrics: Metrics) -> None:
        self.limit = settings.max_open_streams
        self.per_caller_limit = settings.max_open_streams_per_customer
        self.retry_after_s = settings.stream_retry_after_s
        self.open = 0
        self.open_by_caller: dict[str, int] = {}  # only callers with an open stream: at most ``limit`` entries
        self.metrics = metrics

    @contextlib.asynccontextmanager
    async def slot(self, caller: str) -> AsyncIterator[None]:
        held = self.open_by_caller.get(caller, 0)
        if held >= self.per_caller_limit:
            self._refuse(CustomerStreamCap(
                f"you already hold {self.per_caller_limit} streams on this instance "
                "(SPECIALISTS_MAX_OPEN_STREAMS_PER_CUSTOMER); close one, or poll with GetTask",
                retry_after_s=self.retry_after_s,
            ))
        if self.open >= self.limit:
            self._refuse(ServiceBusy(
                f"this instance already serves {self.limit} streams (SPECIALISTS_MAX_OPEN_STREAMS); "
                "retry shortly, or poll with GetTask",
                retry_after_s=self.retry_after_s,
            ))
        self.open += 1
        self.open_by_caller[caller] = held + 1
        self.metrics.open_streams.inc()
        try:
            yield
        finally:
            self.open -= 1
            left = self.open_by_caller[caller] - 1
            if left:
                self.open_by_caller[caller] = left
            else:
                del self.open_by_caller[caller]
            self.metrics.open_streams.dec()

    def _refuse(self, refused: EdgeError) -> None:
        self.metrics.count_refusal(refused.code)
        note_refusal(refused.code)
        holder = _refusal_var.get()
        if holder is not None:
            holder["refused"] = refused
        raise refused


class StreamRefusalStatus:
    """Starts the answer to a stream the gate refused with the refusal's HTTP status and ``Retry-After``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        holder: dict[str, EdgeError] = {}
        token = _refusal_var.set(holder)

        async def send_with_status(message: Message) -> None:
            refused = holder.get("refused")
            if message["type"] == "http.response.start" and refused is not None:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"retry-after"]
                headers.append((b"retry-after", refused.details["retry_after_s"].encode()))
                message = {**message, "status": wire_form(refused).http_status, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            _refusal_var.reset(token)
