"""Agent Cards built from specs, and the public discovery routes with HTTP caching.

Each specialist's card lists its one skill, input and output modes, the bearer
security scheme, its JSON-RPC and HTTP+JSON interfaces (A2A 1.0, plus the 0.3
JSON-RPC names on the same endpoint), its GRPC interface when gRPC is on
(``EdgeSettings.grpc_url``, with the specialist as the tenant), its tariff and
limits in the ``TARIFF_EXTENSION`` params (the card has no other place for
them), and its idempotency policy in the ``IDEMPOTENCY_EXTENSION`` params.

Two documents per specialist: ``CARD_PATH`` is the A2A 1.0 card, exactly the
protobuf ``AgentCard`` in ProtoJSON (``card_document``). The a2a-sdk's
``agent_card_to_dict`` is not used for it: because the card lists a 0.3
interface, it merges a 0.3 card's fields (``url``, ``preferredTransport``,
``protocolVersion``, ``security``, ...) into the top level, which the 1.0 schema
refuses. 0.3 clients read ``CARD_V03_PATH`` instead: the SDK's own 0.3 conversion
of the same card (``card_document_v03``).

Cards are the same for every caller, so they are rendered once: a strong
``ETag`` from their bytes, ``Last-Modified`` from the spec file,
``Cache-Control`` from ``card_max_age_s``; ``If-None-Match`` (or
``If-Modified-Since``) answers 304, and HEAD answers the headers alone.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import format_datetime, parsedate_to_datetime
from typing import Any

from a2a.compat.v0_3.conversions import to_compat_agent_card
from a2a.types.a2a_pb2 import AgentCard
from google.protobuf.json_format import MessageToDict, ParseDict
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from core.push_signing import PushSigner
from core.settings import Settings
from core.specs import LoadedSpec

CARD_PATH = "/.well-known/agent-card.json"
CARD_V03_PATH = "/.well-known/agent-card-0.3.json"  # the same card in A2A 0.3's shape, for 0.3 clients
CARD_PATHS = (CARD_PATH, CARD_V03_PATH)  # public documents: no key, no rate limit (``str.endswith`` takes the tuple)
TARIFF_EXTENSION = "urn:specialists:extension:tariff-and-limits:v1"
IDEMPOTENCY_EXTENSION = "urn:specialists:extension:idempotency:v1"
IDEMPOTENCY_HEADER = "Idempotency-Key"
BEARER = "bearer"
ETAG_DIGEST_CHARS = 32  # hex characters of the body's SHA-256 in a card's ETag


def specialist_base(settings: Settings, specialist_id: str) -> str:
    return f"{settings.edge.url}/specialists/{specialist_id}"


def anonymous_allowed(settings: Settings, loaded: LoadedSpec) -> bool:
    return settings.edge.anonymous_free_skills and loaded.spec.tariff_credits == 0


def build_card(loaded: LoadedSpec, settings: Settings) -> AgentCard:
    spec = loaded.spec
    base = specialist_base(settings, spec.id)
    requirements: list[dict[str, Any]] = [{"schemes": {BEARER: {"list": []}}}]
    if anonymous_allowed(settings, loaded):
        requirements.append({})  # an empty requirement: callers without a key are served too
    limits = spec.limits
    interfaces: list[dict[str, str]] = [
        {"url": f"{base}/jsonrpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        {"url": base, "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
        {"url": f"{base}/jsonrpc", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
    ]
    own_grpc_url = settings.edge.grpc_specialist_url(spec.id)
    if own_grpc_url:
        # This specialist's own listener, first: a client that follows only the URL (and copies no tenant)
        # reaches it (app/grpc_binding.py).
        interfaces.append({"url": own_grpc_url, "protocolBinding": "GRPC", "protocolVersion": "1.0"})
    if settings.edge.grpc_url:
        # The shared gRPC server serves every specialist: the tenant, which a client copies into each
        # request, chooses it (app/grpc_binding.py).
        interfaces.append(
            {"url": settings.edge.grpc_url, "protocolBinding": "GRPC", "protocolVersion": "1.0", "tenant": spec.id}
        )
    card = {
        "name": spec.name,
        "description": spec.description,
        "version": spec.version,
        "provider": {"organization": "specialists", "url": settings.edge.url},
        "supportedInterfaces": interfaces,
        "capabilities": {
            "streaming": spec.streaming,
            "pushNotifications": settings.push.enabled and spec.push_notifications,
            "extendedAgentCard": True,
            "extensions": [
                {
                    "uri": TARIFF_EXTENSION,
                    "description": "Credits reserved per task, and the limits one message may reach.",
                    "required": False,
                    "params": {
                        "tariffCredits": spec.tariff_credits,
                        "creditCeilingMetadataKey": "credit_ceiling",
                        "maxInputBytes": limits.max_input_bytes,
                        "maxParts": limits.max_parts,
                        "maxMetadataBytes": limits.max_metadata_bytes,
                        "maxRequestBodyBytes": settings.edge.max_request_body_bytes,
                    },
                },
                idempotency_extension(loaded, settings),
            ],
        },
        "securitySchemes": {
            BEARER: {
                "httpAuthSecurityScheme": {
                    "scheme": "Bearer",
                    "bearerFormat": "sk_<live|test>_<secret id>_<payload>.<signature>",
                    "description": "An API key issued by the operator: `Authorization: Bearer <key>`.",
                }
            }
        },
        "securityRequirements": requirements,
        "defaultInputModes": spec.input_modes,
        "defaultOutputModes": spec.output_modes,
        "skills": [
            {
                "id": spec.skill.id,
                "name": spec.skill.name,
                "description": f"{spec.skill.description} Tariff: {spec.tariff_credits} credits per task.",
                "tags": spec.skill.tags or [spec.id],  # the card format requires at least one
                "examples": spec.skill.examples,
                "inputModes": spec.input_modes,
                "outputModes": spec.output_modes,
            }
        ],
    }
    return ParseDict(card, AgentCard())


def card_document(card: AgentCard) -> dict[str, Any]:
    """The A2A 1.0 card as published: the protobuf message in ProtoJSON, nothing merged in."""
    return MessageToDict(card)


def card_document_v03(card: AgentCard) -> dict[str, Any]:
    """The card as an A2A 0.3 client reads it (``url``, ``preferredTransport``: the 0.3 JSON-RPC interface)."""
    return to_compat_agent_card(card).model_dump(mode="json", by_alias=True, exclude_none=True)


def idempotency_extension(loaded: LoadedSpec, settings: Settings) -> dict[str, Any]:
    """The specialist's idempotency policy (docs/A2A_EDGE.md), after the tariff extension (which the extended card
    expects first): what makes a resend replay the first answer, and for how long a key is remembered."""
    return {
        "uri": IDEMPOTENCY_EXTENSION,
        "description": (
            "A resend with the same Idempotency-Key and the same content replays the first answer"
            + (", and so does one with the same messageId" if loaded.spec.idempotency == "message_id" else "")
            + "; the same key with other content is refused (idempotency_key_conflict)."
        ),
        "required": False,
        "params": {
            "policy": loaded.spec.idempotency,
            "header": IDEMPOTENCY_HEADER,
            "retentionSeconds": settings.edge.idempotency_key_retention_s,
        },
    }


@dataclass(frozen=True)
class Rendered:
    """A JSON document served with validators: its bytes, strong ETag and Last-Modified."""

    body: bytes
    etag: str
    last_modified: datetime

    @classmethod
    def of(cls, document: Any, last_modified: datetime) -> Rendered:
        body = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
        return cls(body=body, etag=f'"{hashlib.sha256(body).hexdigest()[:ETAG_DIGEST_CHARS]}"', last_modified=last_modified)


def _not_modified(request: Request, rendered: Rendered) -> bool:
    if_none_match = request.headers.get("if-none-match")
    if if_none_match is not None:  # RFC 9110 13.1.2: it takes precedence over If-Modified-Since
        candidates = [c.strip().removeprefix("W/") for c in if_none_match.split(",")]
        return "*" in candidates or rendered.etag in candidates
    if_modified_since = request.headers.get("if-modified-since")
    if if_modified_since:
        try:
            return rendered.last_modified <= parsedate_to_datetime(if_modified_since)
        except (TypeError, ValueError):
            return False
    return False


def serve(rendered: Rendered, settings: Settings) -> Any:
    async def endpoint(request: Request) -> Response:
        headers = {
            "ETag": rendered.etag,
            "Last-Modified": format_datetime(rendered.last_modified, usegmt=True),
            "Cache-Control": f"public, max-age={settings.edge.card_max_age_s}",
        }
        if _not_modified(request, rendered):
            return Response(status_code=304, headers=headers)
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(rendered.body))
            return Response(status_code=200, headers=headers, media_type="application/json")
        return Response(content=rendered.body, headers=headers, media_type="application/json")

    return endpoint


def discovery_routes(specs: dict[str, LoadedSpec], cards: dict[str, AgentCard], settings: Settings) -> list[Route]:
    """GET/HEAD /specialists and each specialist's 1.0 card (``CARD_PATH``) and 0.3 card (``CARD_V03_PATH``)."""
    routes = []
    listing = []
    for specialist_id, loaded in sorted(specs.items()):
        for path, document in (
            (CARD_PATH, card_document(cards[specialist_id])),
            (CARD_V03_PATH, card_document_v03(cards[specialist_id])),
        ):
            rendered = Rendered.of(document, loaded.modified_at)
            routes.append(
                Route(f"/specialists/{specialist_id}{path}", serve(rendered, settings), methods=["GET", "HEAD"])
            )
        base = specialist_base(settings, specialist_id)
        listing.append(
            {
                "id": specialist_id,
                "name": loaded.spec.name,
                "description": loaded.spec.description,
                "skill": loaded.spec.skill.id,
                "tariff_credits": loaded.spec.tariff_credits,
                "card_url": f"{base}{CARD_PATH}",
                "card_v03_url": f"{base}{CARD_V03_PATH}",
                "jsonrpc_url": f"{base}/jsonrpc",
                "http_json_url": base,
            }
        )
    newest = max(loaded.modified_at for loaded in specs.values())
    routes.append(Route("/specialists", serve(Rendered.of({"specialists": listing}, newest), settings), methods=["GET", "HEAD"]))
    return routes


JWKS_PATH = "/.well-known/jwks.json"


def jwks_routes(settings: Settings) -> list[Route]:
    """GET/HEAD ``JWKS_PATH``: the public keys that verify push notifications' JWTs (``core.push_signing``),
    every key of the rotation; none when push is off."""
    if not settings.push.enabled:
        return []
    signer = PushSigner(settings.push.signing_secrets, issuer=settings.edge.url, lifetime_s=settings.push.jwt_lifetime_s)
    rendered = Rendered.of(signer.jwks(), datetime.now(timezone.utc))
    return [Route(JWKS_PATH, serve(rendered, settings), methods=["GET", "HEAD"])]
