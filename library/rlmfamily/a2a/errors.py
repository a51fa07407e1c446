"""Errors of A2A delegation: configuration, admission, the strict peer client, handles and reconciliation.

Every class has a stable ``code``. Client errors also say what the failure
means for a send (``outcome``): ``not_sent`` (nothing reached the peer),
``refused`` (the peer answered and did not accept the work) or ``unknown``
(the peer may have accepted it: never resend automatically).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from rlmfamily.errors import RLMError

SendOutcome = Literal["not_sent", "refused", "unknown"]


class A2AError(RLMError):
    code = "a2a_error"


# ---------- configuration and admission ----------


class A2ADisabled(A2AError):
    code = "a2a_disabled"


class A2AUnavailable(A2AError):
    code = "a2a_unavailable"


class PaidRoutesDisabled(A2AError):
    code = "a2a_paid_disabled"


class PeersFileInvalid(A2AError):
    code = "peers_file_invalid"


class PeerNotFound(A2AError):
    code = "peer_not_found"


class PeerNotReady(A2AError):
    """The peer is configured but cannot take this work (no key in its variable, no skill, ...)."""

    code = "peer_not_ready"


class MissingPeerCredential(PeerNotReady):
    code = "missing_peer_credential"


class PeerTariffBelowPrice(PeerNotReady):
    """The peer's card states a price per task above the peers file's ``tariff_credits`` for it."""

    code = "peer_tariff_below_price"


class CreditAllowanceExhausted(A2AError):
    code = "credit_allowance_exhausted"


class CreditAllowanceMismatch(A2AError):
    code = "credit_allowance_mismatch"


class DelegationLimitReached(A2AError):
    code = "delegation_limit"


class DelegationPayloadTooLarge(A2AError):
    code = "a2a_payload_too_large"


class DeadlineInvalid(A2AError):
    code = "a2a_deadline_invalid"


class RequestIdConflict(A2AError):
    code = "request_id_conflict"


# ---------- handles ----------


class DelegationNotFound(A2AError):
    code = "delegation_not_found"


class DelegationNotOwned(A2AError):
    code = "delegation_not_owned"


class ReplyNotExpected(A2AError):
    code = "reply_not_expected"


class FollowUpNotAllowed(A2AError):
    code = "follow_up_not_allowed"


class DelegationReadTooLarge(A2AError):
    code = "a2a_read_too_large"


class DelegationReconcileRefused(A2AError):
    code = "delegation_reconcile_refused"


# ---------- the strict peer client ----------


class PeerClientError(A2AError):
    """A failed exchange with a peer. ``outcome`` says whether a send may have been accepted."""

    code = "peer_error"
    default_outcome: ClassVar[SendOutcome] = "unknown"

    def __init__(self, message: str, *, outcome: SendOutcome | None = None, **details: Any) -> None:
        super().__init__(message, **details)
        self.outcome: SendOutcome = outcome or self.default_outcome


class PeerUnreachable(PeerClientError):
    """No connection was made: nothing reached the peer."""

    code = "peer_unreachable"
    default_outcome = "not_sent"


class PeerRedirectRefused(PeerClientError):
    """The peer answered with a redirect; redirects are never followed."""

    code = "peer_redirect_refused"
    default_outcome = "refused"


class PeerCardMovesOrigin(PeerClientError):
    code = "peer_card_moves_origin"
    default_outcome = "not_sent"


class PeerCardInvalid(PeerClientError):
    code = "peer_card_invalid"
    default_outcome = "not_sent"


class PeerCompressedResponse(PeerClientError):
    """The answer had a Content-Encoding other than identity; it was refused before being read."""

    code = "peer_compressed_response_refused"


class PeerResponseTooLarge(PeerClientError):
    code = "peer_response_too_large"


class PeerProtocolError(PeerClientError):
    """The answer is not the A2A 1.0 wire format (JSON-RPC or HTTP+JSON)."""

    code = "peer_protocol_error"


class PeerRefused(PeerClientError):
    """The peer answered with an error (JSON-RPC error or HTTP 4xx): it did not accept the work.

    ``details`` hold ``rpc_code`` and ``reason`` (A2A 1.0's JSON-RPC code and its HTTP+JSON ``ErrorInfo``
    reason, the same pair whichever binding carried the error) and ``http_status`` where there was one.
    """

    code = "peer_refused"
    default_outcome = "refused"


class PeerOutcomeUnknown(PeerClientError):
    """The connection broke or timed out after the request was sent: the peer may have accepted it."""

    code = "peer_outcome_unknown"
