"""The edge's refusals: one class per reason, each with a stable code, and the one table of their wire forms.

Shape: like every error of the project (``core.errors.ServiceError``,
``rlm.errors.RLMError``), an ``EdgeError`` has ``code`` (the instance's stable
reason, lower snake case: ``KeyRejected`` carries ``key_expired``, ``key_revoked``
and so on), a ``message`` that says what to do, and ``to_dict()``. On the wire
``code`` travels as ``ErrorInfo.metadata.code``, next to the details.

Wire form: the a2a-sdk chooses the JSON-RPC code, the HTTP status, the gRPC
status (``grpc_form`` for the edge's gRPC binding) and the ``ErrorInfo`` reason of an error by looking its exact class up in
its public tables (``JSON_RPC_ERROR_CODE_MAP``, ``A2A_ERROR_MAPPING``,
``A2A_ERROR_REASONS``, ``A2A_REASON_TO_ERROR`` and the JSON-RPC ``EXCEPTION_MAP``);
a class it does not know becomes an internal error. ``WIRE_FORMS`` below is the
one place the edge chooses them, and ``register_with_sdk()`` (called once where
the app is built) copies it into those tables. The JSON-RPC code is
``-(HTTP status * 100 + n)``, outside the range JSON-RPC reserves, so both
bindings agree on the status; the reason is the class's ``code`` in upper case.

Foreign errors: ``converting_foreign_errors`` wraps every method the SDK calls on
the request handler, so whatever else escapes (SQL, a bug) reaches the customer
as an ``InternalError`` with a generic message, never with its own text; the
original goes to the log with the request id.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any, Literal, NamedTuple, TypeVar

from a2a.server.jsonrpc_models import JSONRPCError
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.request_handlers.response_helpers import EXCEPTION_MAP, build_error_response
from a2a.utils.error_handlers import build_rest_error_payload
from a2a.utils.errors import (
    A2A_ERROR_MAPPING,
    A2A_ERROR_REASONS,
    A2A_REASON_TO_ERROR,
    JSON_RPC_ERROR_CODE_MAP,
    A2AError,
    ErrorMapping,
    InternalError,
)
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.responses import Response

from app.observability import request_id_var

log = logging.getLogger(__name__)

Binding = Literal["jsonrpc", "rest"]


class EdgeError(A2AError):
    """A refusal by the edge. ``code`` is the stable reason, ``message`` says what to do."""

    code: str = "edge_error"  # the class's default reason (and, upper-cased, its ErrorInfo reason)

    def __init__(self, message: str, *, code: str | None = None, **details: object) -> None:
        self.code = code or type(self).code
        # ErrorInfo.metadata is a map of strings on the wire.
        self.details = {key: str(value) for key, value in details.items()}
        super().__init__(message, data={"code": self.code, **self.details})

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            data["details"] = self.details
        return data


# --- authentication and traffic (answered by middleware, before the SDK) ------------


class KeyRequired(EdgeError):
    code = "key_required"


class KeyRejected(EdgeError):
    """The presented key was refused; ``code`` is the reason from ``ledger.keys`` (``key_expired``, ...)."""

    code = "key_refused"


class RateLimited(EdgeError):
    code = "rate_limited"


class PayloadTooLarge(EdgeError):
    code = "payload_too_large"


class UnsupportedMediaType(EdgeError):
    code = "unsupported_media_type"


class MalformedRequest(EdgeError):
    """Not a request the edge reads safely: a body that is not UTF-8 or nests past the limit, or a NUL
    character (which PostgreSQL cannot store) in the body or the path."""

    code = "malformed_request"


class ServiceBusy(EdgeError):
    code = "service_busy"


class CustomerStreamCap(EdgeError):
    """The caller holds its maximum of streams on this instance (SPECIALISTS_MAX_OPEN_STREAMS_PER_CUSTOMER)."""

    code = "customer_stream_cap"


class DatabaseUnavailable(EdgeError):
    """The edge cannot reach PostgreSQL (an outage, a failover): nothing was done, retry after ``Retry-After``."""

    code = "database_unavailable"


class InvalidValue(EdgeError):
    """A value the edge cannot take whatever the method: a number that is not finite or too long to convert
    (``number_not_finite``, ``number_too_long``), a page token the edge did not issue (``page_token_invalid``)."""

    code = "invalid_value"


class UnknownSpecialist(EdgeError):
    code = "specialist_not_found"


# --- admission (raised inside the request handler) ------------------------------


class OverCreditCeiling(EdgeError):
    code = "over_credit_ceiling"


class MessageIdConflict(EdgeError):
    code = "message_id_conflict"


class ContextUnavailable(EdgeError):
    code = "context_id_unavailable"


class TaskNotAwaitingInput(EdgeError):
    code = "task_not_awaiting_input"


class KeyRequiredForListing(EdgeError):
    code = "key_required_for_listing"


# The ledger refused the reservation; the codes are the ledger's reserve outcomes.
class InsufficientCredits(EdgeError):
    code = "insufficient_credits"


class NotEntitled(EdgeError):
    code = "not_entitled"


class EntitlementExpired(EdgeError):
    code = "expired"


class ConcurrencyCap(EdgeError):
    code = "concurrency_cap"


class ReservationConflict(EdgeError):
    """The ledger already holds a reservation for this task id with other terms (a bug, never a retry)."""

    code = "reservation_conflict"


RESERVATION_REFUSALS: dict[str, type[EdgeError]] = {
    cls.code: cls for cls in (InsufficientCredits, NotEntitled, EntitlementExpired, ConcurrencyCap)
}


# --- the wire forms: the one place they are chosen ------------------------------------


class WireForm(NamedTuple):
    json_rpc_code: int
    http_status: int
    grpc_status: str


WIRE_FORMS: dict[type[EdgeError], WireForm] = {
    KeyRequired: WireForm(-40100, 401, "UNAUTHENTICATED"),
    KeyRejected: WireForm(-40101, 401, "UNAUTHENTICATED"),
    KeyRequiredForListing: WireForm(-40102, 401, "UNAUTHENTICATED"),
    RateLimited: WireForm(-42901, 429, "RESOURCE_EXHAUSTED"),
    PayloadTooLarge: WireForm(-41301, 413, "INVALID_ARGUMENT"),
    UnsupportedMediaType: WireForm(-41501, 415, "INVALID_ARGUMENT"),
    MalformedRequest: WireForm(-32700, 400, "INVALID_ARGUMENT"),  # JSON-RPC's own parse error
    ServiceBusy: WireForm(-50301, 503, "UNAVAILABLE"),
    CustomerStreamCap: WireForm(-42903, 429, "RESOURCE_EXHAUSTED"),
    DatabaseUnavailable: WireForm(-50302, 503, "UNAVAILABLE"),
    InvalidValue: WireForm(-32602, 400, "INVALID_ARGUMENT"),  # JSON-RPC's own invalid params
    UnknownSpecialist: WireForm(-40401, 404, "NOT_FOUND"),
    OverCreditCeiling: WireForm(-40001, 400, "FAILED_PRECONDITION"),
    MessageIdConflict: WireForm(-40901, 409, "ALREADY_EXISTS"),
    ContextUnavailable: WireForm(-40902, 409, "FAILED_PRECONDITION"),
    TaskNotAwaitingInput: WireForm(-40903, 409, "FAILED_PRECONDITION"),
    ReservationConflict: WireForm(-40904, 409, "ABORTED"),
    InsufficientCredits: WireForm(-40201, 402, "FAILED_PRECONDITION"),
    NotEntitled: WireForm(-40301, 403, "PERMISSION_DENIED"),
    EntitlementExpired: WireForm(-40302, 403, "PERMISSION_DENIED"),
    ConcurrencyCap: WireForm(-42902, 429, "RESOURCE_EXHAUSTED"),
}


def reason_of(cls: type[EdgeError]) -> str:
    """The ``ErrorInfo`` reason of a class (what an a2a-sdk client maps back to the class)."""
    return cls.code.upper()


def wire_form(error: EdgeError) -> WireForm:
    return WIRE_FORMS[type(error)]


def http_status(error: A2AError) -> int:
    """The HTTP status of any error the edge answers: its own (``WIRE_FORMS``) or the SDK's."""
    if isinstance(error, EdgeError):
        return wire_form(error).http_status
    return A2A_ERROR_MAPPING.get(type(error), ErrorMapping(500, "INTERNAL", "INTERNAL_ERROR")).http_code


def grpc_form(error: A2AError) -> tuple[str, str]:
    """The gRPC status name and ``ErrorInfo`` reason of any error the edge answers: its own or the SDK's.

    The a2a-sdk's gRPC handler looks statuses up in a private table of its own classes only, so the
    edge's gRPC binding (app/grpc_binding.py) asks here, from the same tables as the HTTP bindings.
    """
    if isinstance(error, EdgeError):
        return wire_form(error).grpc_status, reason_of(type(error))
    mapping = A2A_ERROR_MAPPING.get(type(error), ErrorMapping(500, "INTERNAL", "INTERNAL_ERROR"))
    return mapping.grpc_status, A2A_ERROR_REASONS.get(type(error), mapping.reason)


def register_with_sdk() -> None:
    """Copy ``WIRE_FORMS`` into the a2a-sdk's error tables. Idempotent: every call writes the same entries."""
    for cls, form in WIRE_FORMS.items():
        reason = reason_of(cls)
        JSON_RPC_ERROR_CODE_MAP[cls] = form.json_rpc_code
        A2A_ERROR_MAPPING[cls] = ErrorMapping(form.http_status, form.grpc_status, reason)
        A2A_ERROR_REASONS[cls] = reason
        A2A_REASON_TO_ERROR[reason] = cls
        EXCEPTION_MAP[cls] = JSONRPCError


def error_response(error: A2AError, binding: Binding, headers: dict[str, str] | None = None) -> Response:
    """The HTTP answer for a refusal made before the SDK saw the request.

    JSON-RPC gets a JSON-RPC error object with ``id: null`` (the body was not
    parsed), HTTP+JSON the SDK's REST error payload; both use the refusal's
    HTTP status so proxies and clients see 401/413/415/429/503 as such.
    """
    if binding == "jsonrpc":
        payload = build_error_response(None, error)
    else:
        payload = build_rest_error_payload(error)
    return Response(
        content=json.dumps(payload, separators=(",", ":")),
        status_code=http_status(error),
        media_type="application/json",
        headers=headers,
    )


# --- foreign errors: the one boundary between the request handler and the SDK ----------

# What a customer reads when the edge failed in a way it did not foresee: nothing of the failure itself.
INTERNAL_MESSAGE = "the service could not answer this request; retry later, or give the operator the X-Request-Id"
# Retry-After of a database outage met inside the request handler (the edge's setting, read once by create_app).
DATABASE_RETRY_AFTER_S = 5


INTERNAL_CODE = "internal_error"


def internal_error() -> InternalError:
    """The catalogue's one internal error: a fixed message, and the request id the operator can look up."""
    return InternalError(message=INTERNAL_MESSAGE, data={"code": INTERNAL_CODE, "request_id": request_id_var.get()})


def is_database_outage(exc: BaseException) -> bool:
    """A failure to reach PostgreSQL (refused, reset, timed out, the pool exhausted), not a fault of the request."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, (OperationalError, InterfaceError, PoolTimeout, ConnectionError, TimeoutError, OSError))


def database_unavailable(retry_after_s: int) -> DatabaseUnavailable:
    return DatabaseUnavailable(
        f"the service cannot reach its database; nothing was done: retry in {retry_after_s} s",
        retry_after_s=retry_after_s,
    )


def edge_error_for(exc: Exception, *, retry_after_s: int = DATABASE_RETRY_AFTER_S) -> A2AError:
    """What the customer sees for an exception that left the request handler (or the guard).

    An A2A error (the edge's refusals and the SDK's own) is already a wire error.
    A database that cannot be reached is ``DatabaseUnavailable`` (503, retry). Anything
    else (a bug) is logged here, with its traceback and the request id, and answered as
    the catalogue's internal error, whose message says nothing of it: the SDK's JSON-RPC
    dispatcher would otherwise send ``str(exc)``, SQL included.
    """
    if isinstance(exc, A2AError):
        return exc
    if is_database_outage(exc):
        log.warning("request failed: the database cannot be reached (%s)", type(exc).__name__,
                    extra={"event": "database_unavailable"})
        return database_unavailable(retry_after_s)
    log.error("request failed: %s", type(exc).__name__, exc_info=exc, extra={"event": "request_failed"})
    return internal_error()


@contextlib.contextmanager
def _converted(handler: object) -> Iterator[None]:
    try:
        yield
    except A2AError:
        raise
    except Exception as exc:
        settings = getattr(handler, "settings", None)  # the edge handler's; a bare RequestHandler has none
        retry_after_s = settings.edge.db_retry_after_s if settings is not None else DATABASE_RETRY_AFTER_S
        raise edge_error_for(exc, retry_after_s=retry_after_s) from exc


Method = TypeVar("Method", bound=Callable[..., Any])


def _converting(method: Method) -> Method:
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
            with _converted(args[0] if args else None):
                async with contextlib.aclosing(method(*args, **kwargs)) as events:
                    async for event in events:
                        yield event

        stream.converts_foreign_errors = True  # type: ignore[attr-defined]
        return stream  # type: ignore[return-value]

    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> Any:
        with _converted(args[0] if args else None):
            return await method(*args, **kwargs)

    call.converts_foreign_errors = True  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]


# Every method the SDK's dispatchers (JSON-RPC 1.0 and 0.3, HTTP+JSON) call on a request handler.
SDK_ENTRY_POINTS: tuple[str, ...] = tuple(sorted(RequestHandler.__abstractmethods__))

Handler = TypeVar("Handler", bound=type[RequestHandler])


def converting_foreign_errors(handler_class: Handler) -> Handler:
    """Class decorator: every SDK entry point of the handler raises only A2A errors (see ``edge_error_for``)."""
    for name in SDK_ENTRY_POINTS:
        setattr(handler_class, name, _converting(getattr(handler_class, name)))
    return handler_class
