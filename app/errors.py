"""The edge's refusals: one class per reason, each with a stable code, and the one table of their wire forms.

Shape: like every error of the project (``core.errors.ServiceError``,
``rlmfamily.errors.RLMError``), an ``EdgeError`` has ``code`` (the instance's stable
reason, lower snake case: ``KeyRejected`` carries ``key_expired``, ``key_revoked``
and so on), a ``message`` that says what to do, and ``to_dict()``. On the wire
``code`` travels as ``ErrorInfo.metadata.code``, next to the details.

Wire form: the a2a-sdk chooses the JSON-RPC code, the HTTP status, the gRPC
status (``grpc_form`` for the edge's gRPC binding) and the ``ErrorInfo`` reason of an error by looking its exact class up in
its public tables (``JSON_RPC_ERROR_CODE_MAP``, ``A2A_ERROR_MAPPING``,
``A2A_ERROR_REASONS``, ``A2A_REASON_TO_ERROR`` and the JSON-RPC ``EXCEPTION_MAP``);
a class it does not know becomes an internal error. Two tables below are the one
place the edge chooses them: ``SPEC_WIRE_FORMS``, A2A's own errors exactly as the
specification's section 5.4 maps them (JSON-RPC code, HTTP status, gRPC status),
and ``WIRE_FORMS``, the edge's refusals. Where the spec has an error for a
situation, the edge answers it (an edge class that is one, such as
``ContentTypeNotSupported`` or ``TaskNotFound``, takes its form and reason); the edge's own codes
are for what the spec does not cover. ``register_with_sdk()`` (called once where
the app is built) copies both into those tables; ``grpc_status_for()`` gives the
gRPC binding the same statuses. The edge's own JSON-RPC codes are
``-(HTTP status * 100 + n)``, outside the ranges JSON-RPC and A2A reserve, so
both bindings agree on the status; their reason is the class's ``code`` in upper
case.

Foreign errors: ``converting_foreign_errors`` wraps every method the SDK calls on
the request handler, so whatever else escapes (SQL, a bug) reaches the customer
as an ``InternalError`` with a generic message, never with its own text; the
original goes to the log with the request id.

One vocabulary: the edge raises only these classes. Where A2A (or JSON-RPC, for invalid params) has an
error for a refusal, the class here refines the a2a-sdk's (``TaskNotFound``, ``TaskNotCancelable``,
``UnsupportedOperation``, ``ContentTypeNotSupported``, ``PushNotificationNotSupported``, ``InvalidParams``,
``InternalFault``), so clients see the SDK's class, form and reason, and every refusal carries its ``code``.
The SDK's own classes remain in two places, on purpose: ``app/grpc_binding.py`` raises the SDK's
``VersionNotSupportedError`` before a request reaches the handler (a version the edge never serves has no
code of its own; the binding is the SDK's, not the edge's vocabulary), and ``internal_error()`` here answers a
foreign failure with the SDK's ``InternalError`` itself: ``InternalFault`` (same form and reason) is for the
edge's own broken rules, and a foreign failure's answer names none.
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
    ContentTypeNotSupportedError,
    ErrorMapping,
    ExtendedAgentCardNotConfiguredError,
    ExtensionSupportRequiredError,
    InternalError,
    InvalidAgentResponseError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
    VersionNotSupportedError,
)
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.responses import Response

from app.integers import metadata_text
from app.observability import request_id_var

log = logging.getLogger(__name__)

Binding = Literal["jsonrpc", "rest"]


class EdgeError(A2AError):
    """A refusal by the edge. ``code`` is the stable reason, ``message`` says what to do."""

    code: str = "edge_error"  # the class's default reason (and, upper-cased, its ErrorInfo reason)

    def __init__(self, message: str, *, code: str | None = None, **details: object) -> None:
        self.code = code or type(self).code
        # ErrorInfo.metadata is a map of strings on the wire.
        self.details = {key: metadata_text(value) for key, value in details.items()}
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
    """A compressed request body (``Content-Encoding`` other than ``identity``): the spec has no error for it."""

    code = "unsupported_media_type"


class ContentTypeNotSupported(EdgeError, ContentTypeNotSupportedError):
    """A request body that is not JSON (``Content-Type: text/plain``, or none), a part of a media type the
    specialist does not take (``part_media_type_not_accepted``), or ``acceptedOutputModes`` it produces none of
    (``output_modes_not_produced``): A2A's own ``ContentTypeNotSupportedError``, so it takes the spec's wire
    form (``SPEC_WIRE_FORMS``), not one of ours."""

    code = "content_type_not_supported"


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
    (``number_not_finite``, ``number_too_long``), a page token the edge did not issue (``page_token_invalid``), a
    ListTasks filter no task can match (``status_invalid``, ``status_timestamp_invalid``), an
    ``Idempotency-Key`` header that is empty, too long or not printable ASCII (``idempotency_key_invalid``), a
    push webhook this service will not call (``webhook_url_invalid``, ``webhook_https_required``,
    ``webhook_address_refused``: ``core.webhooks``), a push configuration field over its limit
    (``push_config_invalid``)."""

    code = "invalid_value"


class UnknownSpecialist(EdgeError):
    code = "specialist_not_found"


# --- A2A's own errors, as the edge raises them ------------------------------------------
# Each refines the a2a-sdk's class (clients and the SDK's dispatchers see that class, in its spec form and with
# its reason) and carries its code like every other refusal.


class TaskNotFound(EdgeError, TaskNotFoundError):
    """No task of the caller's has this id, whatever its shape: every method answers it the same way."""

    code = "task_not_found"


class TaskNotCancelable(EdgeError, TaskNotCancelableError):
    """The task cannot be canceled: it has finished, or its outcome is under reconciliation."""

    code = "task_not_cancelable"


class UnsupportedOperation(EdgeError, UnsupportedOperationError):
    """A follow-up message to a task in a terminal state (``task_terminal``): a new message starts a new task."""

    code = "unsupported_operation"


class InvalidParams(EdgeError, InvalidParamsError):
    """A request field the method cannot take (a messageId or contextId too long, a role other than user, an
    empty part, a contextId that is not the task's): JSON-RPC's own invalid params, whose code and reason
    (``INVALID_PARAMS``) it keeps. ``InvalidValue`` is for values refused whatever the method."""

    code = "invalid_params"


class PushNotificationNotSupported(EdgeError, PushNotificationNotSupportedError):
    """This service, or this specialist, sends no push notifications (no signing secret, or the spec's choice)."""

    code = "push_notification_not_supported"


class InternalFault(EdgeError, InternalError):
    """The edge broke a rule of its own (a bug): the message names the rule. Not for foreign exceptions, whose
    text never reaches a caller (``internal_error``)."""

    code = "internal_error"


# --- admission (raised inside the request handler) ------------------------------


class OverCreditCeiling(EdgeError):
    code = "over_credit_ceiling"


class MessageIdConflict(EdgeError):
    code = "message_id_conflict"


class IdempotencyKeyConflict(EdgeError):
    """The Idempotency-Key was first used with other content (or, without an API key, by a caller the edge cannot
    tell apart from another)."""

    code = "idempotency_key_conflict"


class ContextUnavailable(EdgeError):
    code = "context_id_unavailable"


class TaskNotAwaitingInput(EdgeError):
    code = "task_not_awaiting_input"


class KeyRequiredForListing(EdgeError):
    code = "key_required_for_listing"


class KeyRequiredForPush(EdgeError):
    code = "key_required_for_push"


class PushConfigCap(EdgeError):
    """The customer holds its maximum of push configurations (SPECIALISTS_PUSH_MAX_CONFIGS_PER_CUSTOMER)."""

    code = "push_config_cap"


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
    grpc_status: str  # a grpc.StatusCode name


# A2A's own errors, exactly as the A2A 1.0 specification's section 5.4 ("Error Code Mappings") states them.
# The rows are those of the v1.0.0 release, which the official conformance kit (a2a-tck 1.0-dev) bundles and
# checks (TaskNotCancelable 409, ContentTypeNotSupported 415, InvalidAgentResponse 502, UNIMPLEMENTED for the
# push, operation and version errors). The a2a-sdk 1.3 ships a later table (400, 400, 500, FAILED_PRECONDITION);
# docs/A2A_EDGE.md ("Where the edge and the SDK differ") says why the kit's edition is followed.
# tests/app/test_spec_codes.py checks these rows against the spec's text and the edge's answers.
SPEC_WIRE_FORMS: dict[type[A2AError], WireForm] = {
    TaskNotFoundError: WireForm(-32001, 404, "NOT_FOUND"),
    TaskNotCancelableError: WireForm(-32002, 409, "FAILED_PRECONDITION"),
    PushNotificationNotSupportedError: WireForm(-32003, 400, "UNIMPLEMENTED"),
    UnsupportedOperationError: WireForm(-32004, 400, "UNIMPLEMENTED"),
    ContentTypeNotSupportedError: WireForm(-32005, 415, "INVALID_ARGUMENT"),
    InvalidAgentResponseError: WireForm(-32006, 502, "INTERNAL"),
    ExtendedAgentCardNotConfiguredError: WireForm(-32007, 400, "FAILED_PRECONDITION"),
    ExtensionSupportRequiredError: WireForm(-32008, 400, "FAILED_PRECONDITION"),
    VersionNotSupportedError: WireForm(-32009, 400, "UNIMPLEMENTED"),
}


def spec_reason(cls: type[A2AError]) -> str:
    """The ``ErrorInfo`` reason of an A2A error type (spec 11.6): its name in UPPER_SNAKE_CASE without "Error"."""
    name = cls.__name__.removesuffix("Error")
    return "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(name)).upper()


def spec_error_of(cls: type[A2AError]) -> type[A2AError] | None:
    """The A2A error type a class is (itself, or the one an edge class refines), or None."""
    return next((base for base in cls.__mro__ if base in SPEC_WIRE_FORMS), None)


# The edge's own refusals. A class that refines one of A2A's errors takes that error's form: where the
# spec has a code for a situation, every binding uses it; the edge's codes are for what the spec does not
# cover (docs/A2A_EDGE.md lists them, and why).
WIRE_FORMS: dict[type[EdgeError], WireForm] = {
    KeyRequired: WireForm(-40100, 401, "UNAUTHENTICATED"),
    KeyRejected: WireForm(-40101, 401, "UNAUTHENTICATED"),
    KeyRequiredForListing: WireForm(-40102, 401, "UNAUTHENTICATED"),
    KeyRequiredForPush: WireForm(-40103, 401, "UNAUTHENTICATED"),
    RateLimited: WireForm(-42901, 429, "RESOURCE_EXHAUSTED"),
    PayloadTooLarge: WireForm(-41301, 413, "INVALID_ARGUMENT"),
    UnsupportedMediaType: WireForm(-41501, 415, "INVALID_ARGUMENT"),
    ContentTypeNotSupported: SPEC_WIRE_FORMS[ContentTypeNotSupportedError],
    TaskNotFound: SPEC_WIRE_FORMS[TaskNotFoundError],
    TaskNotCancelable: SPEC_WIRE_FORMS[TaskNotCancelableError],
    UnsupportedOperation: SPEC_WIRE_FORMS[UnsupportedOperationError],
    InvalidParams: WireForm(-32602, 400, "INVALID_ARGUMENT"),  # JSON-RPC's own invalid params, as the SDK sends it
    PushNotificationNotSupported: SPEC_WIRE_FORMS[PushNotificationNotSupportedError],
    InternalFault: WireForm(-32603, 500, "INTERNAL"),  # JSON-RPC's own internal error
    MalformedRequest: WireForm(-32700, 400, "INVALID_ARGUMENT"),  # JSON-RPC's own parse error
    ServiceBusy: WireForm(-50301, 503, "UNAVAILABLE"),
    CustomerStreamCap: WireForm(-42903, 429, "RESOURCE_EXHAUSTED"),
    DatabaseUnavailable: WireForm(-50302, 503, "UNAVAILABLE"),
    InvalidValue: WireForm(-32602, 400, "INVALID_ARGUMENT"),  # JSON-RPC's own invalid params
    UnknownSpecialist: WireForm(-40401, 404, "NOT_FOUND"),
    OverCreditCeiling: WireForm(-40001, 400, "FAILED_PRECONDITION"),
    MessageIdConflict: WireForm(-40901, 409, "ALREADY_EXISTS"),
    IdempotencyKeyConflict: WireForm(-40905, 409, "ALREADY_EXISTS"),
    ContextUnavailable: WireForm(-40902, 409, "FAILED_PRECONDITION"),
    TaskNotAwaitingInput: WireForm(-40903, 409, "FAILED_PRECONDITION"),
    ReservationConflict: WireForm(-40904, 409, "ABORTED"),
    InsufficientCredits: WireForm(-40201, 402, "FAILED_PRECONDITION"),
    NotEntitled: WireForm(-40301, 403, "PERMISSION_DENIED"),
    EntitlementExpired: WireForm(-40302, 403, "PERMISSION_DENIED"),
    ConcurrencyCap: WireForm(-42902, 429, "RESOURCE_EXHAUSTED"),
    PushConfigCap: WireForm(-42904, 429, "RESOURCE_EXHAUSTED"),
}


def reason_of(cls: type[EdgeError]) -> str:
    """The ``ErrorInfo`` reason of a class (what an a2a-sdk client maps back to a class): the A2A error's own
    reason for a class that refines one, otherwise the class's ``code`` in upper case."""
    spec = spec_error_of(cls)
    return spec_reason(spec) if spec is not None else cls.code.upper()


def owns_its_reason(cls: type[EdgeError]) -> bool:
    """Whether a client should map the class's reason back to it: not for a refinement of A2A's or JSON-RPC's
    own errors, whose reason stays the SDK's class (what a client raises)."""
    return spec_error_of(cls) is None and not issubclass(cls, (InternalError, InvalidParamsError))


def wire_form(error: EdgeError) -> WireForm:
    return WIRE_FORMS[type(error)]


_INTERNAL_FORM = WIRE_FORMS[InternalFault]


def wire_form_of(error: A2AError) -> WireForm:
    """The wire form of any error the edge answers: its own (``WIRE_FORMS``), A2A's (``SPEC_WIRE_FORMS``), or
    for JSON-RPC's own errors (invalid params, method not found, ...) the a2a-sdk's; anything else is internal."""
    if isinstance(error, EdgeError):
        return wire_form(error)
    spec = spec_error_of(type(error))
    if spec is not None:
        return SPEC_WIRE_FORMS[spec]
    mapping = A2A_ERROR_MAPPING.get(type(error))
    code = JSON_RPC_ERROR_CODE_MAP.get(type(error))
    if mapping is None or code is None:
        return _INTERNAL_FORM
    return WireForm(code, mapping.http_code, mapping.grpc_status)


def http_status(error: A2AError) -> int:
    """The HTTP status of any error the edge answers."""
    return wire_form_of(error).http_status


def grpc_status_for(error: A2AError) -> str:
    """The gRPC status (a ``grpc.StatusCode`` name, e.g. ``NOT_FOUND``) of any error the edge answers: for the
    gRPC binding, which must use the same table as the other two (``grpc.StatusCode[grpc_status_for(e)]``)."""
    return wire_form_of(error).grpc_status


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
    """Copy ``SPEC_WIRE_FORMS`` and ``WIRE_FORMS`` into the a2a-sdk's error tables. Idempotent.

    The spec's rows override the SDK's defaults wherever they differ (today they agree: the SDK ships the
    v1.0.1 table), so an SDK release with another table cannot change what the edge answers. An edge class
    that refines an A2A error keeps that error's reason, and the reason still maps back to A2A's own class
    (what a client raises).
    """
    for cls, form in SPEC_WIRE_FORMS.items():
        _register(cls, form, spec_reason(cls), owns_reason=True)
    for edge_cls, form in WIRE_FORMS.items():
        _register(edge_cls, form, reason_of(edge_cls), owns_reason=owns_its_reason(edge_cls))


def _register(cls: type[A2AError], form: WireForm, reason: str, *, owns_reason: bool) -> None:
    JSON_RPC_ERROR_CODE_MAP[cls] = form.json_rpc_code
    A2A_ERROR_MAPPING[cls] = ErrorMapping(form.http_status, form.grpc_status, reason)
    A2A_ERROR_REASONS[cls] = reason
    if owns_reason:
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
