"""The A2A gRPC binding: a shared ``grpc.aio`` server for every specialist (routing on the tenant), and one per
specialist given a port of its own (no tenant needed), all on the HTTP bindings' handlers.

Each specialist's ``EdgeRequestHandler`` (admission, ledger, task store, tenancy)
is served by the a2a-sdk's ``GrpcHandler``; what the HTTP guard does in
middleware (app/middleware.py) happens here, per call, before the SDK sees the
request, in the same order and with the same checks:
  1. the request's size against ``max_request_body_bytes`` (it arrives as bytes:
     the method handlers are registered without a deserializer, so the size is
     known before protobuf parses it), then the parse (a bad message is
     ``MalformedRequest``);
  2. the specialist: on a specialist's own listener (``SPECIALISTS_GRPC_SPECIALIST_PORTS``,
     the first GRPC interface of its card, with no tenant) that specialist, so a
     client that follows only the card's URL reaches it; on the shared listener
     (``SPECIALISTS_GRPC_PORT``) the request's ``tenant`` (the card's second GRPC
     interface carries ``tenant=<specialist id>``, which the SDK client copies into
     every request); an unknown one is ``UnknownSpecialist`` (NOT_FOUND), and so is
     a tenant naming another specialist than the listener's;
  3. the key, from the ``authorization`` metadata (``Bearer <key>``), with the
     guard's own ``authenticate``; then the rate limits; then ``a2a-version``,
     when sent: anything but 1.x is ``VersionNotSupportedError`` (UNIMPLEMENTED);
  4. what the request holds (app/bodies.py ``check_parsed``): its parts and
     metadata values against ``max_body_elements``, and no non-finite number,
     before anything walks it in Python;
  5. the SDK's handler, with the caller in the call context and the metadata
     (less credentials) in ``state["headers"]``, as ``EdgeCallContextBuilder``
     puts the HTTP headers there.
A refusal is answered with the gRPC status and ``ErrorInfo`` reason of the edge's
one catalogue (``app.errors.grpc_form``); ``ErrorInfo.metadata`` carries the
stable ``code`` and details, as the HTTP bindings do. The field caps (part
count, names, metadata) are admission's, shared with HTTP. gRPC's own transport
cap (``max_receive_message_length``) is set to twice the body limit: it only
stops what is far over, which the edge then never reads.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
import grpc.aio
from a2a.extensions.common import HTTP_EXTENSION_HEADER, get_requested_extensions
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.grpc_handler import GrpcHandler, GrpcServerCallContextBuilder
from a2a.types import InvalidParamsError, VersionNotSupportedError
from a2a.types.a2a_pb2_grpc import add_A2AServiceServicer_to_server
from a2a.utils.errors import A2AError
from a2a.utils.grpc_status import status_to_grpc
from a2a.utils.proto_utils import validation_errors_to_bad_request
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from packaging.version import InvalidVersion, Version

from app.bodies import check_parsed
from app.errors import (
    EdgeError,
    MalformedRequest,
    PayloadTooLarge,
    RateLimited,
    UnknownSpecialist,
    edge_error_for,
    grpc_form,
)
from app.handler import EdgeRequestHandler
from app.identity import EdgeUser, Identity
from app.middleware import CREDENTIAL_HEADERS, SANE_REQUEST_ID, authenticate
from app.observability import Metrics, customer_var, note_refusal, refusal_var, request_id_var
from app.ratelimit import RateLimiter
from core import telemetry
from core.settings import Settings
from core.specs import LoadedSpec
from ledger.keys import AsyncKeyVerifier

log = logging.getLogger("app.access")

SERVICE_NAME = "lf.a2a.v1.A2AService"
ERROR_DOMAIN = "a2a-protocol.org"
TRANSPORT_CAP_FACTOR = 2  # gRPC's own receive limit, in body limits: see the module's docstring
# Seconds a stopping server gives calls in flight (streams included) to end on their own.
GRACEFUL_STOP_S = 10.0
MAX_VERSION_CHARS = 16  # of an unsupported a2a-version, echoed in the refusal


@dataclass(frozen=True)
class _Caller:
    identity: Identity
    specialist_id: str


# Set by the binding for the one call a task serves; read by the context builder the SDK calls next.
_caller: contextvars.ContextVar[_Caller] = contextvars.ContextVar("grpc_caller")


def _metadata(context: grpc.aio.ServicerContext) -> list[tuple[str, str]]:
    """The call's text metadata, keys in lower case (binary ``-bin`` entries are left out)."""
    pairs = []
    for key, value in context.invocation_metadata() or ():
        if isinstance(value, str):
            pairs.append((key.lower(), value))
    return pairs


class EdgeGrpcContextBuilder(GrpcServerCallContextBuilder):
    """The SDK call context of a gRPC call: the caller the binding resolved, the metadata without credentials."""

    def build(self, context: grpc.aio.ServicerContext) -> ServerCallContext:
        caller = _caller.get()
        pairs = _metadata(context)
        return ServerCallContext(
            user=EdgeUser(caller.identity, caller.specialist_id),
            state={"headers": {key: value for key, value in pairs if key not in CREDENTIAL_HEADERS}},
            requested_extensions=get_requested_extensions(
                [value for key, value in pairs if key == HTTP_EXTENSION_HEADER.lower()]
            ),
        )


async def abort(error: A2AError, context: grpc.aio.ServicerContext) -> NoReturn:
    """End the call with the catalogue's status, and an ``ErrorInfo`` an a2a-sdk client maps back to the class."""
    status_name, reason = grpc_form(error)
    data = error.data if isinstance(error.data, dict) else {}
    status = status_pb2.Status(code=grpc.StatusCode[status_name].value[0], message=error.message)
    info = error_details_pb2.ErrorInfo(
        reason=reason, domain=ERROR_DOMAIN, metadata={k: str(v) for k, v in data.items() if k != "errors"}
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    status.details.append(detail)
    if isinstance(error, InvalidParamsError) and data.get("errors"):
        bad_request = any_pb2.Any()
        bad_request.Pack(validation_errors_to_bad_request(data["errors"]))
        status.details.append(bad_request)
    rich = status_to_grpc(status)
    trailing = list(rich.trailing_metadata)
    if isinstance(error, EdgeError) and (isinstance(error, RateLimited) or "retry_after_s" in error.details):
        trailing.append(("retry-after", error.details.get("retry_after_s", "1")))  # as HTTP's Retry-After
    await context.abort(rich.code, rich.details, trailing_metadata=tuple(trailing))
    raise AssertionError("context.abort returns only by raising")  # pragma: no cover


class _EdgeGrpcHandler(GrpcHandler):
    """The SDK's handler, answering errors with the edge's catalogue (the SDK's table knows only its own)."""

    async def abort_context(self, error: A2AError, context: grpc.aio.ServicerContext) -> None:
        await abort(error, context)


class GrpcBinding:
    """Routes each call to its specialist's SDK handler after the guard's checks (the module's docstring)."""

    def __init__(
        self,
        *,
        specs: dict[str, LoadedSpec],
        handlers: dict[str, EdgeRequestHandler],
        verifier: AsyncKeyVerifier,
        limiter: RateLimiter,
        settings: Settings,
        metrics: Metrics,
    ) -> None:
        self.specs = specs
        self.verifier = verifier
        self.limiter = limiter
        self.settings = settings
        self.metrics = metrics
        builder = EdgeGrpcContextBuilder()
        self.handlers = {sid: _EdgeGrpcHandler(handler, context_builder=builder) for sid, handler in handlers.items()}

    def method_handlers(self, own: str | None = None) -> dict[str, grpc.RpcMethodHandler]:
        """The SDK's generated method table for the A2A service, each method behind the checks and taking raw bytes.

        ``own``: the specialist a listener serves alone (a call there needs no tenant); None: the shared listener.
        """
        table = _MethodTable()
        add_A2AServiceServicer_to_server(_Unused(), table)
        return {name: self._guarded(name, handler, own) for name, handler in table.handlers.items()}

    def _guarded(self, name: str, handler: grpc.RpcMethodHandler, own: str | None) -> grpc.RpcMethodHandler:
        parse: Callable[[bytes], Any] = handler.request_deserializer
        if handler.response_streaming:

            async def stream(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                with _CallLog(self.metrics, name, context) as call:
                    request, grpc_handler = await call.admit(self, raw, parse, own)
                    async for item in getattr(grpc_handler, name)(request, context):
                        yield item

            return handler._replace(request_deserializer=None, unary_stream=stream)

        async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            with _CallLog(self.metrics, name, context) as call:
                request, grpc_handler = await call.admit(self, raw, parse, own)
                return await getattr(grpc_handler, name)(request, context)

        return handler._replace(request_deserializer=None, unary_unary=unary)

    async def check(
        self, raw: bytes, parse: Callable[[bytes], Any], context: grpc.aio.ServicerContext, own: str | None = None
    ) -> tuple[Any, GrpcHandler, _Caller]:
        """The guard's checks for one call, in the module docstring's order; raises the refusal."""
        limit = self.settings.edge.max_request_body_bytes
        if len(raw) > limit:
            raise PayloadTooLarge(
                f"the request message is {len(raw)} bytes; at most {limit} are accepted "
                "(SPECIALISTS_MAX_REQUEST_BODY_BYTES)",
                limit="max_request_body_bytes",
            )
        try:
            request = parse(raw)
        except DecodeError:
            raise MalformedRequest("the request is not a valid A2A protobuf message for this method") from None
        tenant = getattr(request, "tenant", "")
        if own is not None and tenant not in ("", own):
            raise UnknownSpecialist(
                f"this address serves the specialist {own!r} alone and the request's tenant names {tenant!r}: leave "
                "the tenant empty, or call that specialist at its own card's GRPC interface"
            )
        specialist_id = own or tenant
        loaded = self.specs.get(specialist_id)
        if loaded is None or "\x00" in specialist_id:
            raise UnknownSpecialist(
                f"there is no specialist {specialist_id!r}: set the request's tenant to a specialist id, as each "
                "card's GRPC interface does (GET /specialists lists them)"
                if specialist_id
                else "the request names no specialist: set its tenant to a specialist id, as each card's GRPC "
                "interface does (GET /specialists lists them)"
            )
        authorization = next((value for key, value in _metadata(context) if key == "authorization"), None)
        identity = await authenticate(authorization, _peer_address(context), loaded, self.settings, self.verifier)
        customer_var.set(identity.customer_id or "anonymous")
        await self.limiter.check(identity)
        _check_version(context)
        check_parsed(request, self.settings.edge)  # what the request holds, before the SDK walks it
        return request, self.handlers[specialist_id], _Caller(identity, specialist_id)


def _check_version(context: grpc.aio.ServicerContext) -> None:
    """Refuse an ``a2a-version`` other than 1.x, as the HTTP bindings do (spec 3.2.6: ``VersionNotSupportedError``,
    whose gRPC status is section 5.4's ``UNIMPLEMENTED``). Without one the call is served: the gRPC service
    (``lf.a2a.v1``) exists in 1.0 only, so it cannot mean 0.3 as a missing header does over HTTP."""
    offered = next((value for key, value in _metadata(context) if key == "a2a-version"), "").strip()
    if not offered:
        return
    try:
        major_minor = Version(offered).release[:2]
    except InvalidVersion:
        major_minor = None
    if major_minor != (1, 0):
        raise VersionNotSupportedError(
            f"A2A version {offered[:MAX_VERSION_CHARS]!r} is not supported over gRPC: send a2a-version 1.0"
        )


def _peer_address(context: grpc.aio.ServicerContext) -> str:
    """The client's address from gRPC's peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``)."""
    peer = context.peer() or "unknown"
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer


class _CallLog:
    """Per call, what ``RequestLog`` does per HTTP request: a request id, one access line, the metrics."""

    def __init__(self, metrics: Metrics, method: str, context: grpc.aio.ServicerContext) -> None:
        self.metrics = metrics
        self.method = method
        self.context = context
        self.refusal: dict[str, str] = {}

    def __enter__(self) -> _CallLog:
        offered = next((v for k, v in _metadata(self.context) if k == "x-request-id"), None)
        self.request_id = offered if offered and SANE_REQUEST_ID.match(offered) else uuid.uuid4().hex
        # Set, never reset: grpc.aio serves each call in a task of its own, whose context is a copy, so nothing
        # set here outlives the call. A reset could not work: a stream whose client went away is finalised by
        # asyncio in another task (another context), where resetting raised "created in a different Context".
        request_id_var.set(self.request_id)
        customer_var.set("-")
        refusal_var.set(self.refusal)
        self.started = time.perf_counter()
        return self

    async def admit(
        self, binding: GrpcBinding, raw: bytes, parse: Callable[[bytes], Any], own: str | None
    ) -> tuple[Any, GrpcHandler]:
        try:
            request, grpc_handler, caller = await binding.check(raw, parse, self.context, own)
        except EdgeError as refused:
            self.metrics.count_refusal(refused.code)
            note_refusal(refused.code)
            await abort(refused, self.context)
        except Exception as failed:
            await abort(edge_error_for(failed, retry_after_s=binding.settings.edge.db_retry_after_s), self.context)
        _caller.set(caller)
        return request, grpc_handler

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        duration_s = time.perf_counter() - self.started
        code = self.context.code()
        if self.context.cancelled() or exc_type in (GeneratorExit, asyncio.CancelledError):
            status = "CANCELLED"  # by the client, or its deadline (a stream is closed mid-way): code() says nothing
        else:
            status = code.name if isinstance(code, grpc.StatusCode) else "OK" if code in (None, 0) else str(code)
        operation = f"grpc_{self.method}"
        self.metrics.requests.labels(operation=operation, status=status).inc()
        self.metrics.latency.labels(operation=operation).observe(duration_s)
        log.info(
            "gRPC %s %s",
            self.method,
            status,
            extra={
                "event": "grpc_call",
                "method": self.method,
                "status": status,
                "duration_ms": round(duration_s * 1000, 2),
                "code": self.refusal.get("code"),
                "task_id": self.refusal.get("task_id"),
            },
        )


class _MethodTable:
    """Stands in for a server to collect the SDK's generated method table."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.handlers.update(handlers)


class _Unused:
    """The generated registration reads one attribute per method; the binding replaces every one of them."""

    def __getattr__(self, name: str) -> None:
        return None


def build_servers(binding: GrpcBinding, settings: Settings) -> list[grpc.aio.Server]:
    """The ``grpc.aio`` servers (in the running event loop): the shared one on SPECIALISTS_GRPC_PORT, routing on the
    tenant, and one per entry of SPECIALISTS_GRPC_SPECIALIST_PORTS, serving that specialist alone.

    A stock gRPC client dials the card's ``host:port`` and nothing more (no path, and the ``:authority`` it sends
    is not visible to a Python servicer), so a listener is what can name a specialist without a tenant.
    """
    listeners: list[tuple[int, str | None]] = [(settings.edge.grpc_port, None)] if settings.edge.grpc_port else []
    listeners += [(port, sid) for sid, port in sorted(settings.edge.grpc_specialist_ports.items())]
    return [_server(binding, settings, port, own) for port, own in listeners]


def _server(binding: GrpcBinding, settings: Settings, port: int, own: str | None) -> grpc.aio.Server:
    cap = settings.edge.max_request_body_bytes * TRANSPORT_CAP_FACTOR
    server = grpc.aio.server(
        interceptors=telemetry.grpc_server_interceptors(),  # the call's span, when telemetry is on
        options=[("grpc.max_receive_message_length", cap), ("grpc.max_send_message_length", -1)],
    )
    handlers = binding.method_handlers(own)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    address = f"{settings.edge.host}:{port}"
    if server.add_insecure_port(address) == 0:
        setting = "SPECIALISTS_GRPC_PORT" if own is None else f"SPECIALISTS_GRPC_SPECIALIST_PORTS ({own!r})"
        raise OSError(f"the gRPC binding cannot listen on {address} ({setting})")
    return server
