"""The ASGI middleware around every request: request ids and access logs, then the A2A guard.

The a2a-sdk's routes bypass FastAPI dependencies, so whatever must hold for
every A2A call is middleware, in this order:
  1. ``RequestLog``: a request id (the caller's ``X-Request-Id`` when sane),
     one JSON access line and the HTTP metrics per request;
  2. ``ErrorBoundary`` (app/boundary.py): nothing unexpected leaves the guard or
     the SDK with its own text;
  3. ``A2AGuard``, for ``/specialists/<id>/...`` except the public card:
     unknown specialist (404), the key (401 + ``WWW-Authenticate``), the rate
     limits (429 + ``Retry-After``), the body's media type (A2A's
     ContentTypeNotSupported, 415) and encoding (the edge's own 415),
     its size while it is read (413, before it is read whole), then what it
     holds, before anything parses it (app/bodies.py: element count, number
     literals). The resolved caller is put in the ASGI scope for the
     call-context builder.
Refusals use the binding's own error format (JSON-RPC error object or the
HTTP+JSON error payload).
"""

from __future__ import annotations

import itertools
import logging
import operator
import re
import time
import uuid
from contextlib import nullcontext

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.bodies import ElementCounter, check_numbers, count_elements, outside_strings
from app.cards import CARD_PATHS, anonymous_allowed
from app.errors import (
    Binding,
    ContentTypeNotSupported,
    EdgeError,
    KeyRejected,
    KeyRequired,
    MalformedRequest,
    PayloadTooLarge,
    RateLimited,
    UnknownSpecialist,
    UnsupportedMediaType,
    error_response,
)
from app.identity import Identity
from app.observability import Metrics, customer_var, note_refusal, refusal_var, request_id_var
from app.ratelimit import RateLimiter
from core import telemetry
from core.settings import Settings
from core.specs import LoadedSpec
from ledger.keys import AsyncKeyVerifier, KeyRefused

log = logging.getLogger("app.access")

# Headers (and gRPC metadata) that carry credentials never enter the SDK's call context (which it logs at DEBUG).
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
IDENTITY_SCOPE_KEY = "specialists.identity"
SPECIALIST_SCOPE_KEY = "specialists.specialist"
REQUEST_ID_HEADER = "x-request-id"
SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")
JSON_MEDIA_TYPES = ("application/json", "application/a2a+json")
REALM = 'Bearer realm="specialists"'


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


# Probes and the scrape, many times a minute: no span.
UNTRACED_OPERATIONS = frozenset({"healthz", "readyz", "metrics"})


def operation_of(path: str) -> str:
    """A low-cardinality label for metrics and logs."""
    if path in ("/healthz", "/readyz", "/metrics"):
        return path.lstrip("/")
    if path == "/specialists":
        return "list_specialists"
    if path.endswith(CARD_PATHS):
        return "agent_card"
    if path.startswith("/specialists/"):
        return "jsonrpc" if path.endswith("/jsonrpc") else "http_json"
    return "other"


def check_json_text(body: bytes, max_depth: int) -> bytes:
    """Refuse a body the JSON parsers downstream would choke on: not UTF-8, or nested past ``max_depth``; return
    its bytes outside strings (``outside_strings``), for the checks after this one.

    Only the bracket depth outside strings is measured here (one pass, no parsing);
    whether the text is valid JSON is left to the protocol layer, which answers that
    with its own parse error.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as bad:
        raise MalformedRequest(
            f"the body is not UTF-8 (invalid byte at offset {bad.start}); A2A bodies are UTF-8 JSON"
        ) from None
    # The escape in either case, as _ESCAPED_NUL reads it, without a lowered copy of the body (0.4 ms for 475 KB).
    escaped = b"\\u0000" in body or b"\\U0000" in body
    if "\x00" in text or (escaped and _ESCAPED_NUL.search(text)):
        raise MalformedRequest("the body carries a NUL character (\\u0000), which A2A text here cannot hold; remove it")
    outside = outside_strings(body)
    if _depth_outside_strings(outside) > max_depth:
        raise MalformedRequest(
            f"the body nests JSON deeper than {max_depth} levels (SPECIALISTS_MAX_JSON_DEPTH)",
            limit="max_json_depth",
        )
    return outside


def json_depth(body: bytes) -> int:
    """How deep the body's JSON nests: its brackets outside strings, each opening one +1, each closing one -1, at
    their deepest. Every step in C (``outside_strings``, then ``translate`` to one byte a bracket, then a running
    sum): a message of 200 parts has over 400 brackets, and a regex over its strings then a loop over them cost
    2.5 ms of every such send (issue 44). Strings are told as JSON tells them; past a body's first syntax error
    the count may differ from a parser's, which stops there."""
    return _depth_outside_strings(outside_strings(body))


def _depth_outside_strings(outside: bytes) -> int:
    deltas = outside.translate(_BRACKET_DELTAS, _NOT_BRACKETS)  # opening 2, closing 0
    return max(map(operator.sub, itertools.accumulate(deltas), itertools.count(1)), default=0)


_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")
_BRACKET_DELTAS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
# \u0000 as a JSON escape: preceded by an even number of backslashes (so not an escaped backslash).
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000", re.IGNORECASE)


async def authenticate(
    authorization: str | None, address: str, loaded: LoadedSpec, settings: Settings, verifier: AsyncKeyVerifier
) -> Identity:
    """The caller of one A2A request, from its ``Authorization`` value: the one key check of every binding.

    No value: anonymous where the specialist allows it (``anonymous_allowed``), else ``KeyRequired``.
    A value that is not ``Bearer <key>``, or a key the verifier refuses: ``KeyRejected`` with the reason.
    The HTTP guard passes the header, the gRPC binding (app/grpc_binding.py) the ``authorization`` metadata.
    """
    if authorization is None or not authorization.strip():
        if anonymous_allowed(settings, loaded):
            return Identity(customer_id=None, key_id=None, tier=None, client_address=address)
        raise KeyRequired("this request needs an API key: send `Authorization: Bearer <key>` (the operator issues keys)")
    scheme, _, credential = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        raise KeyRejected("the Authorization header must read `Bearer <key>`", code="key_malformed")
    try:
        verified = await verifier.verify(credential.strip())
    except KeyRefused as refused:
        raise KeyRejected(refused.message, code=refused.code) from None
    return Identity(customer_id=verified.customer_id, key_id=verified.key_id, tier=verified.tier, client_address=address)


class RequestLog:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        offered = _header(scope, REQUEST_ID_HEADER.encode())
        request_id = offered if offered and SANE_REQUEST_ID.match(offered) else uuid.uuid4().hex
        id_token = request_id_var.set(request_id)
        customer_token = customer_var.set("-")
        refusal: dict[str, str] = {}
        refusal_token = refusal_var.set(refusal)
        operation = operation_of(scope["path"])
        started = time.perf_counter()
        status = 500
        first_byte_s: float | None = None

        async def send_with_id(message: Message) -> None:
            nonlocal status, first_byte_s
            if message["type"] == "http.response.start":
                status = message["status"]
                first_byte_s = time.perf_counter() - started
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        # The request's span (when telemetry is on): the root of its trace, the access line written inside it.
        traced = telemetry.is_on() and operation not in UNTRACED_OPERATIONS
        try:
            with telemetry.request_span(scope["method"], operation, _header(scope, b"traceparent")) if traced else nullcontext() as span:
                try:
                    await self.app(scope, receive, send_with_id)
                finally:
                    if span is not None:
                        telemetry.annotate(span, **{"http.response.status_code": status,
                                                    "specialists.code": refusal.get("code")})
                    self._account(scope, operation, status, time.perf_counter() - started, first_byte_s, refusal)
        finally:
            refusal_var.reset(refusal_token)
            customer_var.reset(customer_token)
            request_id_var.reset(id_token)

    def _account(self, scope: Scope, operation: str, status: int, duration_s: float, first_byte_s: float | None,
                 refusal: dict[str, str]) -> None:
        """The request's Prometheus metrics (``/metrics``: this instance's) and its access line."""
        self.metrics.requests.labels(operation=operation, status=str(status)).inc()
        self.metrics.latency.labels(operation=operation).observe(first_byte_s or duration_s)
        log.info(
            "%s %s %s",
            scope["method"],
            scope["path"],
            status,
            extra={
                "event": "http_request",
                "method": scope["method"],
                "path": scope["path"],
                "status": status,
                "duration_ms": round(duration_s * 1000, 2),
                "code": refusal.get("code"),
                "task_id": refusal.get("task_id"),
            },
        )


class A2AGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        specs: dict[str, LoadedSpec],
        verifier: AsyncKeyVerifier,
        limiter: RateLimiter,
        settings: Settings,
        metrics: Metrics,
    ) -> None:
        self.app = app
        self.specs = specs
        self.verifier = verifier
        self.limiter = limiter
        self.settings = settings
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/specialists/") or path.endswith(CARD_PATHS):
            await self.app(scope, receive, send)
            return
        binding: Binding = "jsonrpc" if path.endswith("/jsonrpc") else "rest"
        specialist_id = path.split("/", 3)[2]
        loaded = self.specs.get(specialist_id)
        try:
            if "\x00" in path or b"%00" in scope.get("query_string", b""):
                raise MalformedRequest("the request path or query carries a NUL character (%00); ids never contain one")
            if loaded is None:
                raise UnknownSpecialist(f"there is no specialist {specialist_id!r}; GET /specialists lists them")
            identity = await self._authenticate(scope, loaded)
            customer_var.set(identity.customer_id or "anonymous")
            await self.limiter.check(identity)
            receive = await self._bounded_body(scope, receive)
        except EdgeError as refused:
            await self._refuse(refused, binding, scope, receive, send)
            return
        scope[IDENTITY_SCOPE_KEY] = identity
        scope[SPECIALIST_SCOPE_KEY] = specialist_id
        await self.app(scope, receive, send)

    async def _authenticate(self, scope: Scope, loaded: LoadedSpec) -> Identity:
        address = (scope.get("client") or ("unknown", 0))[0]
        return await authenticate(_header(scope, b"authorization"), address, loaded, self.settings, self.verifier)

    async def _bounded_body(self, scope: Scope, receive: Receive) -> Receive:
        """Check media type and encoding, then read the body up to the limit; replay it to the app."""
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return receive
        limit = self.settings.edge.max_request_body_bytes
        encoding = (_header(scope, b"content-encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise UnsupportedMediaType(
                f"compressed request bodies (Content-Encoding: {encoding}) are refused; send the body uncompressed",
            )
        media_type = (_header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()
        if media_type and media_type not in JSON_MEDIA_TYPES:  # refused before reading, like an oversize body
            raise ContentTypeNotSupported(
                f"the body's Content-Type is {media_type}; send application/json (or application/a2a+json)"
            )
        declared = _header(scope, b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            raise PayloadTooLarge(
                f"the request body is {int(declared)} bytes; at most {limit} are accepted "
                "(SPECIALISTS_MAX_REQUEST_BODY_BYTES)",
                limit="max_request_body_bytes",
            )
        chunks: list[bytes] = []
        size = 0
        elements = ElementCounter(self.settings.edge.max_body_elements)
        trailing: list[Message] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                trailing.append(message)  # a disconnect: let the app see it
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(
                    f"the request body is over {limit} bytes, the most accepted (SPECIALISTS_MAX_REQUEST_BODY_BYTES)",
                    limit="max_request_body_bytes",
                )
            chunks.append(chunk)
            elements.feed(chunks, chunk)  # a body of too many values is refused before the rest arrives
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body and not media_type:
            raise ContentTypeNotSupported(
                "the body has no Content-Type; send application/json (or application/a2a+json)"
            )
        count_elements(body, self.settings.edge.max_body_elements)  # before anything walks the body: app/bodies.py
        outside = check_json_text(body, self.settings.edge.max_json_depth)
        check_numbers(body, self.settings.edge, outside)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            if trailing:
                return trailing.pop(0)
            return await receive()  # later: the disconnect that ends a stream

        return replay

    async def _refuse(self, refused: EdgeError, binding: Binding, scope: Scope, receive: Receive, send: Send) -> None:
        self.metrics.count_refusal(refused.code)
        note_refusal(refused.code)
        headers: dict[str, str] = {}
        if isinstance(refused, KeyRequired):
            headers["WWW-Authenticate"] = REALM
        elif isinstance(refused, KeyRejected):
            headers["WWW-Authenticate"] = f'{REALM}, error="invalid_token", error_description="{refused.code}"'
        elif isinstance(refused, RateLimited):
            headers["Retry-After"] = refused.details.get("retry_after_s", "1")
        if isinstance(refused, PayloadTooLarge):
            headers["Connection"] = "close"  # the unread rest of the body is not wanted
        response = error_response(refused, binding, headers)
        await response(scope, receive, send)

