"""Agent Cards built from specs, and the public discovery routes with HTTP caching.

Each specialist's card lists its one skill, input and output modes, the bearer
security scheme, its JSON-RPC and HTTP+JSON interfaces (A2A 1.0, plus the 0.3
JSON-RPC names on the same endpoint), its GRPC interface when gRPC is on
(``EdgeSettings.grpc_url``, with the specialist as the tenant), and its tariff
and limits in the ``TARIFF_EXTENSION`` params (the card has no other place for them). Cards are
the same for every caller, so they are rendered once: a strong ``ETag`` from
their bytes, ``Last-Modified`` from the spec file, ``Cache-Control`` from
``card_max_age_s``; ``If-None-Match`` (or ``If-Modified-Since``) answers 304,
and HEAD answers the headers alone.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from email.utils import format_datetime, parsedate_to_datetime
from typing import Any

from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types.a2a_pb2 import AgentCard
from google.protobuf.json_format import ParseDict
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from core.settings import Settings
from core.specs import LoadedSpec

CARD_PATH = "/.well-known/agent-card.json"
TARIFF_EXTENSION = "urn:specialists:extension:tariff-and-limits:v1"
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
    if settings.edge.grpc_url:
        # One gRPC server serves every specialist: the tenant, which a client copies into each
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
            "pushNotifications": False,
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
                }
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
    """GET/HEAD /specialists and each specialist's /.well-known/agent-card.json."""
    routes = []
    listing = []
    for specialist_id, loaded in sorted(specs.items()):
        rendered = Rendered.of(agent_card_to_dict(cards[specialist_id]), loaded.modified_at)
        routes.append(
            Route(f"/specialists/{specialist_id}{CARD_PATH}", serve(rendered, settings), methods=["GET", "HEAD"])
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
                "jsonrpc_url": f"{base}/jsonrpc",
                "http_json_url": base,
            }
        )
    newest = max(loaded.modified_at for loaded in specs.values())
    routes.append(Route("/specialists", serve(Rendered.of({"specialists": listing}, newest), settings), methods=["GET", "HEAD"]))
    return routes
