"""The edge's refusals: one class per reason, each with a stable code and its wire form in both bindings.

The a2a-sdk chooses the JSON-RPC code, the HTTP status and the ``ErrorInfo``
reason of an error by looking its exact class up in four public tables
(``JSON_RPC_ERROR_CODE_MAP``, ``A2A_ERROR_MAPPING``, ``A2A_ERROR_REASONS`` and
the JSON-RPC ``EXCEPTION_MAP``); an unknown class becomes an internal error.
Every ``EdgeError`` subclass registers itself there, so a refusal raised inside
the SDK's request handler reaches the customer with its own code.

Codes: ``code`` (lower snake case, in ``ErrorInfo.metadata.code``) is the
machine-readable reason; the JSON-RPC code is ``-(HTTP status * 100 + n)``,
outside the range JSON-RPC reserves, so both bindings agree on the status.
"""

from __future__ import annotations

import json
from typing import ClassVar, Literal

from a2a.server.jsonrpc_models import JSONRPCError
from a2a.server.request_handlers.response_helpers import EXCEPTION_MAP, build_error_response
from a2a.utils.error_handlers import build_rest_error_payload
from a2a.utils.errors import (
    A2A_ERROR_MAPPING,
    A2A_ERROR_REASONS,
    A2A_REASON_TO_ERROR,
    JSON_RPC_ERROR_CODE_MAP,
    A2AError,
    ErrorMapping,
)
from starlette.responses import Response

Binding = Literal["jsonrpc", "rest"]


class EdgeError(A2AError):
    """A refusal by the edge. ``message`` says what to do; ``data['code']`` is the stable reason."""

    code: ClassVar[str] = "edge_error"
    http_status: ClassVar[int] = 400
    grpc_status: ClassVar[str] = "FAILED_PRECONDITION"
    json_rpc_code: ClassVar[int] = 0  # 0: abstract, not registered

    def __init__(self, message: str, *, code: str | None = None, **details: object) -> None:
        # ErrorInfo.metadata is a map of strings on the wire.
        data = {"code": code or self.code, **{key: str(value) for key, value in details.items()}}
        super().__init__(message, data=data)

    @property
    def stable_code(self) -> str:
        return str((self.data or {}).get("code", self.code))

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.json_rpc_code:
            reason = cls.code.upper()
            JSON_RPC_ERROR_CODE_MAP[cls] = cls.json_rpc_code
            A2A_ERROR_MAPPING[cls] = ErrorMapping(cls.http_status, cls.grpc_status, reason)
            A2A_ERROR_REASONS[cls] = reason
            A2A_REASON_TO_ERROR[reason] = cls
            EXCEPTION_MAP[cls] = JSONRPCError


# --- authentication and traffic (answered by middleware, before the SDK) ------------


class KeyRequired(EdgeError):
    code = "key_required"
    http_status = 401
    grpc_status = "UNAUTHENTICATED"
    json_rpc_code = -40100


class KeyRejected(EdgeError):
    """The presented key was refused; ``data['code']`` is the reason from ``ledger.keys``."""

    code = "key_refused"
    http_status = 401
    grpc_status = "UNAUTHENTICATED"
    json_rpc_code = -40101


class RateLimited(EdgeError):
    code = "rate_limited"
    http_status = 429
    grpc_status = "RESOURCE_EXHAUSTED"
    json_rpc_code = -42901


class PayloadTooLarge(EdgeError):
    code = "payload_too_large"
    http_status = 413
    grpc_status = "INVALID_ARGUMENT"
    json_rpc_code = -41301


class UnsupportedMediaType(EdgeError):
    code = "unsupported_media_type"
    http_status = 415
    grpc_status = "INVALID_ARGUMENT"
    json_rpc_code = -41501


class MalformedRequest(EdgeError):
    """Not a request the edge reads safely: a body that is not UTF-8 or nests past the limit, or a NUL
    character (which PostgreSQL cannot store) in the body or the path."""

    code = "malformed_request"
    http_status = 400
    grpc_status = "INVALID_ARGUMENT"
    json_rpc_code = -32700  # JSON-RPC's own parse error


class ServiceBusy(EdgeError):
    code = "service_busy"
    http_status = 503
    grpc_status = "UNAVAILABLE"
    json_rpc_code = -50301


class UnknownSpecialist(EdgeError):
    code = "specialist_not_found"
    http_status = 404
    grpc_status = "NOT_FOUND"
    json_rpc_code = -40401


# --- admission (raised inside the request handler) ------------------------------


class OverCreditCeiling(EdgeError):
    code = "over_credit_ceiling"
    http_status = 400
    grpc_status = "FAILED_PRECONDITION"
    json_rpc_code = -40001


class MessageIdConflict(EdgeError):
    code = "message_id_conflict"
    http_status = 409
    grpc_status = "ALREADY_EXISTS"
    json_rpc_code = -40901


class ContextUnavailable(EdgeError):
    code = "context_id_unavailable"
    http_status = 409
    grpc_status = "FAILED_PRECONDITION"
    json_rpc_code = -40902


class TaskNotAwaitingInput(EdgeError):
    code = "task_not_awaiting_input"
    http_status = 409
    grpc_status = "FAILED_PRECONDITION"
    json_rpc_code = -40903


class KeyRequiredForListing(EdgeError):
    code = "key_required_for_listing"
    http_status = 401
    grpc_status = "UNAUTHENTICATED"
    json_rpc_code = -40102


# The ledger refused the reservation; the codes are the ledger's reserve outcomes.
class InsufficientCredits(EdgeError):
    code = "insufficient_credits"
    http_status = 402
    grpc_status = "FAILED_PRECONDITION"
    json_rpc_code = -40201


class NotEntitled(EdgeError):
    code = "not_entitled"
    http_status = 403
    grpc_status = "PERMISSION_DENIED"
    json_rpc_code = -40301


class EntitlementExpired(EdgeError):
    code = "expired"
    http_status = 403
    grpc_status = "PERMISSION_DENIED"
    json_rpc_code = -40302


class ConcurrencyCap(EdgeError):
    code = "concurrency_cap"
    http_status = 429
    grpc_status = "RESOURCE_EXHAUSTED"
    json_rpc_code = -42902


class ReservationConflict(EdgeError):
    """The ledger already holds a reservation for this task id with other terms (a bug, never a retry)."""

    code = "reservation_conflict"
    http_status = 409
    grpc_status = "ABORTED"
    json_rpc_code = -40904


RESERVATION_REFUSALS: dict[str, type[EdgeError]] = {
    cls.code: cls for cls in (InsufficientCredits, NotEntitled, EntitlementExpired, ConcurrencyCap)
}


def error_response(error: EdgeError, binding: Binding, headers: dict[str, str] | None = None) -> Response:
    """The HTTP answer for a refusal made before the SDK saw the request.

    JSON-RPC gets a JSON-RPC error object with ``id: null`` (the body was not
    parsed), HTTP+JSON the SDK's REST error payload; both use the refusal's
    HTTP status so proxies and clients see 401/413/415/429/503 as such.
    """
    if binding == "jsonrpc":
        payload = build_error_response(None, error)
        media_type = "application/json"
    else:
        payload = build_rest_error_payload(error)
        media_type = "application/json"
    return Response(
        content=json.dumps(payload, separators=(",", ":")),
        status_code=error.http_status,
        media_type=media_type,
        headers=headers,
    )
