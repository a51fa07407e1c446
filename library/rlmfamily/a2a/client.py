"""The strict A2A peer client: Agent Card discovery, and calls on both HTTP bindings over one careful HTTP path.

The two bindings A2A 1.0 defines over HTTP are spoken: JSON-RPC 2.0
(``JSONRPC``) and HTTP+JSON (``HTTP+JSON``, the SDK's REST routes). Both
build their requests from the same ProtoJSON params (``rlmfamily.a2a.wire``), go
through the same ``_exchange`` below, and map the peer's errors to the same
classes, ``rpc_code`` and ``reason`` (``_refusal``), so a delegation behaves
the same whichever binding the card offered.

Strict on purpose, because a peer is untrusted:
- redirects are never followed (a 3xx answer is an error);
- the Agent Card may not move the configured origin: every interface it lists
  must stay on the configured scheme://host:port, and it must list the
  configured skill;
- a Content-Encoding other than identity is refused before the body is read
  (no decompression bombs), and ``Accept-Encoding: identity`` is asked for;
- byte limits apply while reading: the body is streamed and counted;
- no proxy or netrc from the environment, and a fresh connection per request,
  so a dropped connection always means *this* request's answer was lost.

Each failure says what it means for a send (``PeerClientError.outcome``):
``not_sent``, ``refused`` or ``unknown``. Nothing here retries a send.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from rlmfamily.a2a.errors import (
    PeerCardInvalid,
    PeerCardMovesOrigin,
    PeerClientError,
    PeerCompressedResponse,
    PeerOutcomeUnknown,
    PeerProtocolError,
    PeerRedirectRefused,
    PeerRefused,
    PeerResponseTooLarge,
    PeerTariffBelowPrice,
    PeerUnreachable,
)
from rlmfamily.a2a.peers import BINDINGS, HTTP_JSON_BINDING, JSONRPC_BINDING, PeerConfig, origin_of, url_problem

A2A_VERSION = "1.0"
JSONRPC_INTERNAL_ERROR = -32603  # the only JSON-RPC error after which the peer's state is unknown
# A2A 1.0's error table (the a2a-sdk's ``A2A_ERROR_MAPPING``): the HTTP+JSON ``ErrorInfo.reason`` of each
# JSON-RPC code. Both bindings report the pair, so a caller reads one error whichever binding carried it.
REASON_BY_RPC_CODE = {
    -32001: "TASK_NOT_FOUND", -32002: "TASK_NOT_CANCELABLE", -32003: "PUSH_NOTIFICATION_NOT_SUPPORTED",
    -32004: "UNSUPPORTED_OPERATION", -32005: "CONTENT_TYPE_NOT_SUPPORTED", -32006: "INVALID_AGENT_RESPONSE",
    -32007: "EXTENDED_AGENT_CARD_NOT_CONFIGURED", -32008: "EXTENSION_SUPPORT_REQUIRED",
    -32009: "VERSION_NOT_SUPPORTED", -32602: "INVALID_PARAMS", -32600: "INVALID_REQUEST",
    -32601: "METHOD_NOT_FOUND", -32603: "INTERNAL_ERROR",
}
RPC_CODE_BY_REASON = {reason: code for code, reason in REASON_BY_RPC_CODE.items()}
ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
MAX_REASON_CHARS = 64  # of a peer's ErrorInfo reason kept (reasons are short upper-case words)
MAX_PEER_TEXT = 500  # characters of a peer's error text kept in our messages
MAX_RPC_DATA_CHARS = 2000  # a JSON-RPC error's ``data`` is kept (as ``rpc_data``) only when its JSON is shorter


@dataclass(frozen=True)
class PinnedInterface:
    """The interface a delegation talks to from admission on, even if the card changes later."""

    url: str
    binding: str
    version: str
    tariff_credits: int | None = None  # the price per task the card states (None: it states none)


def _peer_text(text: Any) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= MAX_PEER_TEXT else flat[:MAX_PEER_TEXT] + "..."


class StrictClient:
    """Synchronous (host functions run in threads); one instance per run, safe to share between threads."""

    def __init__(self, *, connect_timeout_s: float, request_timeout_s: float, max_card_bytes: int) -> None:
        self.max_card_bytes = max_card_bytes
        self._http = httpx.Client(
            follow_redirects=False,
            trust_env=False,
            timeout=httpx.Timeout(request_timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_keepalive_connections=0),
            headers={"A2A-Version": A2A_VERSION, "Accept-Encoding": "identity", "User-Agent": "rlm-a2a/1"},
        )

    def close(self) -> None:
        self._http.close()

    # ---------- the card ----------

    def fetch_card(self, peer: PeerConfig) -> PinnedInterface:
        """Read the peer's public card and pick its JSON-RPC 1.0 interface, refusing a card that moves the origin."""
        from a2a.client.card_resolver import parse_agent_card

        status, body = self._exchange("GET", peer.card_url, None, {}, self.max_card_bytes, "a2a_max_card_bytes")
        if status != 200:
            raise PeerCardInvalid(f"peer {peer.alias!r}: its Agent Card answered HTTP {status} at {peer.card_url}")
        try:
            card = parse_agent_card(json.loads(body))
        except Exception as exc:  # noqa: BLE001 - any parse failure is the same refusal
            raise PeerCardInvalid(f"peer {peer.alias!r}: its Agent Card is not valid A2A: {_peer_text(exc)}") from None
        interfaces = list(card.supported_interfaces)
        if not interfaces:
            raise PeerCardInvalid(f"peer {peer.alias!r}: its Agent Card lists no supportedInterfaces")
        for iface in interfaces:
            problem = url_problem(iface.url)
            if problem is not None:
                # Refused before it is pinned: a pinned URL httpx cannot parse fails every later call.
                raise PeerCardInvalid(f"peer {peer.alias!r}: its Agent Card lists a {iface.protocol_binding or '?'} "
                                      f"interface whose {_peer_text(problem)}")
            if origin_of(iface.url) != peer.origin:
                raise PeerCardMovesOrigin(
                    f"peer {peer.alias!r}: its Agent Card points a {iface.protocol_binding or '?'} interface at "
                    f"{origin_of(iface.url)}, away from the configured {peer.origin}; a card may not move the "
                    "origin. Configure the other origin as its own peer if you trust it"
                )
        chosen = _choose_interface(peer, interfaces)
        if peer.skill and peer.skill not in {s.id for s in card.skills}:
            offered = ", ".join(s.id for s in card.skills) or "none"
            raise PeerCardInvalid(
                f"peer {peer.alias!r}: its card does not list skill {peer.skill!r} (it lists {offered}); "
                "fix `skill` in the peers file"
            )
        card_tariff = _card_tariff(card)
        check_tariff(peer, card_tariff)
        return PinnedInterface(url=chosen.url, binding=chosen.protocol_binding, version=chosen.protocol_version,
                               tariff_credits=card_tariff)

    # ---------- one call, on the pinned binding ----------

    def call(self, binding: str, url: str, method: str, params: dict[str, Any], *, bearer: str | None,
             max_response_bytes: int) -> Any:
        """``method`` (SendMessage, GetTask, CancelTask) with ProtoJSON ``params`` on ``binding`` at ``url``.

        Returns what JSON-RPC calls ``result`` (the same ProtoJSON on both bindings) or raises a PeerClientError.
        """
        if binding == JSONRPC_BINDING:
            return self.rpc(url, method, params, bearer=bearer, max_response_bytes=max_response_bytes)
        if binding == HTTP_JSON_BINDING:
            return self.rest(url, method, params, bearer=bearer, max_response_bytes=max_response_bytes)
        raise PeerProtocolError(f"binding {binding!r} is not spoken by this client (it speaks {', '.join(BINDINGS)})",
                                outcome="not_sent")

    # ---------- JSON-RPC ----------

    def rpc(self, url: str, method: str, params: dict[str, Any], *, bearer: str | None,
            max_response_bytes: int) -> Any:
        """One JSON-RPC 2.0 call; returns ``result`` or raises a PeerClientError."""
        request_id = str(uuid.uuid4())
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params},
                          ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        status, raw = self._exchange("POST", url, body, headers, max_response_bytes, "max_result_bytes")
        if status in (401, 403):
            raise PeerRefused(f"the peer refused the credential (HTTP {status}) for {method}; check the key in the "
                              "peer's credential_env variable", http_status=status)
        if status >= 500:
            raise PeerOutcomeUnknown(f"the peer answered HTTP {status} to {method}; it may or may not have "
                                     "accepted the request", http_status=status)
        try:
            envelope = json.loads(raw)
        except ValueError:
            if status >= 400:
                raise PeerRefused(f"the peer answered HTTP {status} to {method}: {_peer_text(raw[:MAX_PEER_TEXT])}",
                                  http_status=status) from None
            raise PeerProtocolError(f"the peer's answer to {method} is not JSON (HTTP {status})") from None
        if not isinstance(envelope, dict) or envelope.get("jsonrpc") != "2.0":
            raise PeerProtocolError(f"the peer's answer to {method} is not a JSON-RPC 2.0 response")
        error = envelope.get("error")
        if error is not None:
            if not isinstance(error, dict):
                raise PeerProtocolError(f"the peer's answer to {method} has a malformed error")
            code = error.get("code")
            raise _refusal(method, code=code if isinstance(code, int) else None,
                           reason=REASON_BY_RPC_CODE.get(code) if isinstance(code, int) else None,
                           message=error.get("message", ""), data=error.get("data"))
        if status >= 400:
            raise PeerRefused(f"the peer answered HTTP {status} to {method}", http_status=status)
        if envelope.get("id") != request_id:
            raise PeerProtocolError(f"the peer's answer to {method} carries another request id")
        if "result" not in envelope:
            raise PeerProtocolError(f"the peer's answer to {method} has neither result nor error")
        return envelope["result"]

    # ---------- HTTP+JSON ----------

    def rest(self, url: str, method: str, params: dict[str, Any], *, bearer: str | None,
             max_response_bytes: int) -> Any:
        """One HTTP+JSON call (A2A 1.0's REST routes under ``url``); returns the answer's JSON or raises."""
        verb, target, body = _rest_request(url, method, params)
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        status, raw = self._exchange(verb, target, body, headers, max_response_bytes, "max_result_bytes")
        if status in (401, 403):
            raise PeerRefused(f"the peer refused the credential (HTTP {status}) for {method}; check the key in the "
                              "peer's credential_env variable", http_status=status)
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
            if status < 400:
                raise PeerProtocolError(f"the peer's answer to {method} is not JSON (HTTP {status})") from None
        if status >= 500:
            raise PeerOutcomeUnknown(f"the peer answered HTTP {status} to {method}; it may or may not have "
                                     "accepted the request", http_status=status)
        if status >= 400:
            error = answer.get("error") if isinstance(answer, dict) else None
            if not isinstance(error, dict):
                raise PeerRefused(f"the peer answered HTTP {status} to {method}: {_peer_text(raw[:MAX_PEER_TEXT])}",
                                  http_status=status)
            reason, metadata = _error_info(error.get("details"))
            raise _refusal(method, code=RPC_CODE_BY_REASON.get(reason or ""), reason=reason,
                           message=error.get("message", ""), data=metadata, http_status=status)
        if status != 200:
            raise PeerProtocolError(f"the peer answered HTTP {status} to {method}; A2A answers 200")
        return answer

    # ---------- one HTTP exchange ----------

    def _exchange(self, method: str, url: str, body: bytes | None, headers: dict[str, str], max_bytes: int,
                  limit_name: str) -> tuple[int, bytes]:
        try:
            with self._http.stream(method, url, content=body, headers=headers) as response:
                status = response.status_code
                if 300 <= status < 400:
                    target = response.headers.get("location", "?")
                    raise PeerRedirectRefused(
                        f"{url} answered HTTP {status} (redirect to {_peer_text(target)}); redirects are never "
                        "followed: configure the final URL if you trust it", http_status=status)
                encoding = response.headers.get("content-encoding", "").strip().lower()
                if encoding not in ("", "identity"):
                    raise PeerCompressedResponse(
                        f"{url} answered with Content-Encoding {_peer_text(encoding)}; compressed answers are "
                        "refused before they are read")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                    raise PeerResponseTooLarge(
                        f"{url} announced {int(declared):,} bytes; at most {max_bytes:,} are read ({limit_name})")
                data = bytearray()
                for chunk in response.iter_raw():
                    data += chunk
                    if len(data) > max_bytes:
                        raise PeerResponseTooLarge(
                            f"{url} sent more than {max_bytes:,} bytes; reading stopped there ({limit_name})")
                return status, bytes(data)
        except PeerClientError:
            raise
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol) as exc:
            raise PeerUnreachable(f"{url} could not be reached: {_peer_text(exc) or type(exc).__name__}") from None
        except httpx.TimeoutException as exc:
            raise PeerOutcomeUnknown(
                f"{url} did not answer in time ({type(exc).__name__}); the request may have been received") from None
        except httpx.TransportError as exc:
            raise PeerOutcomeUnknown(
                f"the connection to {url} broke before an answer was read ({_peer_text(exc) or type(exc).__name__}); "
                "the request may have been received") from None
        except httpx.InvalidURL as exc:
            raise PeerUnreachable(f"{url} cannot be requested: {_peer_text(exc) or type(exc).__name__}") from None
        except (httpx.HTTPError, httpx.StreamError) as exc:  # anything else httpx raises once a request may be out
            raise PeerOutcomeUnknown(
                f"the exchange with {url} failed ({_peer_text(exc) or type(exc).__name__}); "
                "the request may have been received") from None


def _choose_interface(peer: PeerConfig, interfaces: list[Any]) -> Any:
    """The peers file's ``binding`` if the card offers it at A2A 1.x; else JSON-RPC, then HTTP+JSON."""
    usable = [i for i in interfaces
              if i.protocol_binding in BINDINGS and (i.protocol_version or "").split(".")[0] == "1"]
    offered = ", ".join(f"{i.protocol_binding} {i.protocol_version}" for i in interfaces)
    wanted = (peer.binding,) if peer.binding else BINDINGS
    for binding in wanted:
        for iface in usable:
            if iface.protocol_binding == binding:
                return iface
    if peer.binding:
        raise PeerCardInvalid(f"peer {peer.alias!r}: the peers file asks for binding {peer.binding!r}, which its "
                              f"card does not offer at A2A 1.0 (it offers {offered}); remove `binding` or pick "
                              "one the card lists")
    raise PeerCardInvalid(f"peer {peer.alias!r} offers no A2A 1.0 JSON-RPC or HTTP+JSON interface (it offers "
                          f"{offered})")


def _rest_request(url: str, method: str, params: dict[str, Any]) -> tuple[str, str, bytes | None]:
    """The HTTP verb, target and body of ``method`` on A2A 1.0's HTTP+JSON binding (the a2a-sdk's routes)."""
    base = url.rstrip("/")
    if method == "SendMessage":
        return "POST", f"{base}/message:send", _json_body(params)
    task_id = params.get("id")
    if not isinstance(task_id, str) or not task_id or task_id in (".", ".."):
        # The id becomes a path segment: a dot segment would name another route.
        raise PeerProtocolError(f"{method} needs a task id usable in a URL path, got {_peer_text(repr(task_id))}",
                                outcome="not_sent")
    path = f"{base}/tasks/{quote(task_id, safe='')}"
    if method == "GetTask":
        query = {k: v for k, v in params.items() if k not in ("id", "tenant")}
        return "GET", path + (f"?{urlencode(query)}" if query else ""), None
    if method == "CancelTask":
        return "POST", f"{path}:cancel", _json_body(params)
    raise PeerProtocolError(f"{method} has no HTTP+JSON route in this client", outcome="not_sent")


def _json_body(params: dict[str, Any]) -> bytes:
    return json.dumps(params, ensure_ascii=False).encode()


def _error_info(details: Any) -> tuple[str | None, dict[str, Any] | None]:
    """The ``reason`` and ``metadata`` of the first ``google.rpc.ErrorInfo`` in an HTTP+JSON error's details."""
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, dict) and detail.get("@type") == ERROR_INFO_TYPE:
            reason = detail.get("reason")
            metadata = detail.get("metadata")
            return (reason[:MAX_REASON_CHARS] if isinstance(reason, str) and reason else None,
                    metadata if isinstance(metadata, dict) and metadata else None)
    return None, None


def _refusal(method: str, *, code: int | None, reason: str | None, message: Any, data: Any,
             http_status: int | None = None) -> PeerClientError:
    """The error a peer's A2A error becomes, the same on both bindings.

    An internal error leaves the peer's state unknown; any other error is a refusal. ``rpc_code`` and
    ``reason`` are A2A 1.0's pair for the error (either may be None for a code outside its table).
    """
    text = _peer_text(message)
    details = {k: v for k, v in (("rpc_code", code), ("reason", reason), ("http_status", http_status))
               if v is not None}
    if code == JSONRPC_INTERNAL_ERROR:
        return PeerOutcomeUnknown(f"the peer had an internal error during {method}: {text}", **details)
    label = code if code is not None else reason or "error"
    kept = data if isinstance(data, (dict, list)) and len(json.dumps(data)) < MAX_RPC_DATA_CHARS else None
    return PeerRefused(f"the peer refused {method} ({label}): {text}", rpc_data=kept, **details)


def check_tariff(peer: PeerConfig, card_tariff: int | None) -> None:
    """Refuse a peer whose card charges more per task than the peers file's ``tariff_credits`` for it.

    The one rule behind ``a2a.start`` (through ``fetch_card``, before anything is held or sent) and the route
    ``rlm peers`` shows. A card that states no price is taken at the configured tariff.
    """
    if card_tariff is not None and card_tariff > peer.tariff_credits:
        raise PeerTariffBelowPrice(
            f"peer {peer.alias!r} charges {card_tariff} credits per task (its card) but the peers file allows "
            f"{peer.tariff_credits}; raise tariff_credits for {peer.alias!r} in the peers file "
            "(RLM_A2A_PEERS_FILE) to at least that if you accept the price",
            setting="a2a_peers_file", field="tariff_credits", tariff_credits=peer.tariff_credits,
            card_tariff_credits=card_tariff,
        )


def _card_tariff(card: Any) -> int | None:
    """The tariff a card states in an extension's ``tariffCredits`` param (this project's hosted cards do)."""
    from google.protobuf.json_format import MessageToDict

    for extension in card.capabilities.extensions:
        params = MessageToDict(extension.params) if extension.HasField("params") else {}
        value = params.get("tariffCredits")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return None
