"""The strict A2A peer client: Agent Card discovery and JSON-RPC calls over one careful HTTP path.

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

import httpx

from rlm.a2a.errors import (
    PeerCardInvalid,
    PeerCardMovesOrigin,
    PeerClientError,
    PeerCompressedResponse,
    PeerNotReady,
    PeerOutcomeUnknown,
    PeerProtocolError,
    PeerRedirectRefused,
    PeerRefused,
    PeerResponseTooLarge,
    PeerUnreachable,
)
from rlm.a2a.peers import PeerConfig, origin_of, url_problem

A2A_VERSION = "1.0"
JSONRPC_BINDING = "JSONRPC"
JSONRPC_INTERNAL_ERROR = -32603  # the only JSON-RPC error after which the peer's state is unknown
MAX_PEER_TEXT = 500  # characters of a peer's error text kept in our messages
MAX_RPC_DATA_CHARS = 2000  # a JSON-RPC error's ``data`` is kept (as ``rpc_data``) only when its JSON is shorter


@dataclass(frozen=True)
class PinnedInterface:
    """The interface a delegation talks to from admission on, even if the card changes later."""

    url: str
    binding: str
    version: str


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
        candidates = [i for i in interfaces
                      if i.protocol_binding == JSONRPC_BINDING and (i.protocol_version or "").split(".")[0] == "1"]
        if not candidates:
            offered = ", ".join(f"{i.protocol_binding} {i.protocol_version}" for i in interfaces)
            raise PeerCardInvalid(f"peer {peer.alias!r} offers no A2A 1.0 JSON-RPC interface (it offers {offered})")
        if peer.skill and peer.skill not in {s.id for s in card.skills}:
            offered = ", ".join(s.id for s in card.skills) or "none"
            raise PeerCardInvalid(
                f"peer {peer.alias!r}: its card does not list skill {peer.skill!r} (it lists {offered}); "
                "fix `skill` in the peers file"
            )
        card_tariff = _card_tariff(card)
        if card_tariff is not None and card_tariff > peer.tariff_credits:
            raise PeerNotReady(
                f"peer {peer.alias!r} charges {card_tariff} credits per task (its card) but the peers file allows "
                f"{peer.tariff_credits}; raise tariff_credits there if you accept the price",
                setting="a2a_peers_file",
            )
        chosen = candidates[0]
        return PinnedInterface(url=chosen.url, binding=JSONRPC_BINDING, version=chosen.protocol_version)

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
            code, message = error.get("code"), _peer_text(error.get("message", ""))
            data = error.get("data")
            if code == JSONRPC_INTERNAL_ERROR:
                raise PeerOutcomeUnknown(f"the peer had an internal error during {method}: {message}", rpc_code=code)
            raise PeerRefused(f"the peer refused {method} ({code}): {message}", rpc_code=code,
                              rpc_data=data if isinstance(data, (dict, list)) and len(json.dumps(data)) < MAX_RPC_DATA_CHARS else None)
        if status >= 400:
            raise PeerRefused(f"the peer answered HTTP {status} to {method}", http_status=status)
        if envelope.get("id") != request_id:
            raise PeerProtocolError(f"the peer's answer to {method} carries another request id")
        if "result" not in envelope:
            raise PeerProtocolError(f"the peer's answer to {method} has neither result nor error")
        return envelope["result"]

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


def _card_tariff(card: Any) -> int | None:
    """The tariff a card states in an extension's ``tariffCredits`` param (this project's hosted cards do)."""
    from google.protobuf.json_format import MessageToDict

    for extension in card.capabilities.extensions:
        params = MessageToDict(extension.params) if extension.HasField("params") else {}
        value = params.get("tariffCredits")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return None
