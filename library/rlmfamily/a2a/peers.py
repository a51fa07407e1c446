"""The peers file: the A2A agents a run may delegate to, configured explicitly (TOML or JSON).

A peer is never discovered and never enabled by a key in the environment: it
is listed here with its URL, alias, skill, the *name* of the environment
variable that holds its key, its tariff and its limits. Loading refuses inline
secrets, URLs that carry credentials, a query or a fragment, and plain HTTP to
anything but the loopback interface.

    [[peers]]
    alias = "review"
    url = "https://specialists.example.com/specialists/review"
    description = "Reviews a diff"
    skill = "code-review"
    credential_env = "SPECIALISTS_API_KEY"
    tariff_credits = 5
    binding = "HTTP+JSON"   # optional: the binding to prefer; else what the card offers, JSON-RPC first
"""

from __future__ import annotations

import importlib.util
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rlmfamily.a2a.errors import A2AUnavailable, PeerNotFound, PeersFileInvalid

ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
ALIAS = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
# Keys that mean somebody pasted a secret into the file instead of naming its variable.
SECRET_KEYS = {"api_key", "apikey", "key", "token", "secret", "password", "authorization", "bearer", "credential",
               "credentials", "auth", "access_token"}
LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost"}
JSONRPC_BINDING = "JSONRPC"
HTTP_JSON_BINDING = "HTTP+JSON"
BINDINGS = (JSONRPC_BINDING, HTTP_JSON_BINDING)  # the order a card's interfaces are chosen in, by default


class PeerConfig(BaseModel):
    """One configured peer. Limits are per root family (the root and all its children together)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alias: str
    url: str  # the agent's base URL; its card is at <url>/.well-known/agent-card.json
    description: str = ""
    skill: str | None = None  # the card must list this skill id; required for a paid peer
    credential_env: str | None = None  # the NAME of the variable holding the bearer key
    tariff_credits: int = Field(0, ge=0)  # credits per task; > 0 makes it a paid peer
    max_tasks: int = Field(20, ge=1, le=100_000)  # delegations to this peer per root family
    max_concurrent: int = Field(4, ge=1, le=1000)  # delegations still open at once
    max_payload_bytes: int = Field(1_000_000, ge=256, le=64 << 20)  # one request body
    max_result_bytes: int = Field(4_000_000, ge=1024, le=256 << 20)  # one answer body, counted while reading
    deadline_s: float = Field(900.0, gt=0, le=7 * 86_400)  # default and largest deadline of one delegation
    binding: Literal["JSONRPC", "HTTP+JSON"] | None = None  # the card must offer it; None: JSON-RPC, then HTTP+JSON

    @field_validator("alias")
    @classmethod
    def _alias(cls, value: str) -> str:
        if not ALIAS.match(value):
            raise ValueError("alias must be 1-64 of a-z 0-9 _ . - (starting with a letter or digit)")
        return value

    @field_validator("credential_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME.match(value):
            raise ValueError(
                "credential_env must be the NAME of an environment variable (upper case, e.g. REVIEW_API_KEY), "
                "never the key itself"
            )
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        problem = url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        parts = urlsplit(value)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError("url must be an absolute http(s) URL")
        if parts.username is not None or parts.password is not None or "@" in parts.netloc:
            raise ValueError("url must not carry credentials; name the key's variable in credential_env")
        if parts.query or "?" in value:
            raise ValueError("url must not carry a query string (keys hide there); use the agent's base URL")
        if parts.fragment or "#" in value:
            raise ValueError("url must not carry a fragment")
        if parts.scheme == "http" and parts.hostname not in LOOPBACK_HOSTS:
            raise ValueError("plain http is only allowed to the loopback interface; use https")
        try:
            parts.port  # noqa: B018 - raises on a malformed port
        except ValueError as exc:
            raise ValueError(f"url has an invalid port: {exc}") from None
        return value.rstrip("/")

    @model_validator(mode="after")
    def _paid_needs(self) -> PeerConfig:
        if self.tariff_credits > 0 and (not self.skill or not self.credential_env):
            raise ValueError("a paid peer (tariff_credits > 0) needs a skill and a credential_env")
        return self

    @property
    def paid(self) -> bool:
        return self.tariff_credits > 0

    @property
    def origin(self) -> str:
        return origin_of(self.url)

    @property
    def card_url(self) -> str:
        return self.url + "/.well-known/agent-card.json"

    def public(self) -> dict[str, Any]:
        """What the model's code may see: no URL, no variable name."""
        return {
            "alias": self.alias, "description": self.description, "skill": self.skill,
            "tariff_credits": self.tariff_credits, "paid": self.paid, "deadline_s": self.deadline_s,
            "max_payload_bytes": self.max_payload_bytes, "max_result_bytes": self.max_result_bytes,
            "max_tasks": self.max_tasks, "max_concurrent": self.max_concurrent,
        }


def url_problem(url: str) -> str | None:
    """What makes ``url`` unusable by the client, or None. Checked where a URL is configured or pinned.

    ``urlsplit`` silently drops tabs and newlines, so a URL that passes every other check here could
    still make every later request fail in httpx: the raw text is checked, then parsed as httpx will.
    """
    for position, char in enumerate(url):
        if char.isspace() or not char.isprintable():
            return f"url has a control or whitespace character {char!r} at position {position}"
    try:
        httpx.URL(url)
    except httpx.InvalidURL as exc:
        return f"url cannot be requested: {exc}"
    return None


def origin_of(url: str) -> str:
    """scheme://host:port with the default port made explicit (the unit the card may not move)."""
    parts = urlsplit(url)
    scheme = (parts.scheme or "").lower()
    host = (parts.hostname or "").lower()
    try:
        port = parts.port or {"https": 443, "http": 80}.get(scheme, 0)
    except ValueError:
        port = -1
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


@dataclass(frozen=True)
class Peers:
    """The loaded peers file (possibly empty)."""

    path: Path | None
    peers: tuple[PeerConfig, ...]

    def get(self, alias: str) -> PeerConfig:
        for peer in self.peers:
            if peer.alias == alias:
                return peer
        known = ", ".join(p.alias for p in self.peers) or "none"
        where = f" in {self.path}" if self.path else " (no peers file: RLM_A2A_PEERS_FILE)"
        raise PeerNotFound(f"no peer {alias!r}{where}; configured peers: {known}", setting="a2a_peers_file")

    def credential_names(self) -> set[str]:
        return {p.credential_env for p in self.peers if p.credential_env}


def load_peers(path: str | Path | None) -> Peers:
    """Read and validate a peers file; ``None`` means no peers. Errors name the file, the peer and the field."""
    if path is None:
        return Peers(None, ())
    if importlib.util.find_spec("a2a") is None:
        raise A2AUnavailable("delegation to A2A peers needs the library's a2a extra: pip install 'rlmfamily[a2a]' "
                             "(or unset a2a_peers_file)", setting="a2a_peers_file")
    file = Path(path).expanduser()
    try:
        raw_text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise PeersFileInvalid(f"peers file {file} cannot be read: {exc}", setting="a2a_peers_file") from None
    try:
        data: Any = json.loads(raw_text) if file.suffix.lower() == ".json" else tomllib.loads(raw_text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise PeersFileInvalid(f"peers file {file} is not valid {file.suffix or 'TOML'}: {exc}",
                               setting="a2a_peers_file") from None
    entries = data.get("peers") if isinstance(data, dict) else data
    if isinstance(data, dict) and set(data) - {"peers"}:
        raise PeersFileInvalid(f"peers file {file}: unknown top-level keys {sorted(set(data) - {'peers'})}; "
                               "list peers under [[peers]]", setting="a2a_peers_file")
    if not isinstance(entries, list):
        raise PeersFileInvalid(f"peers file {file} must hold a list of peers ([[peers]] in TOML)",
                               setting="a2a_peers_file")
    peers: list[PeerConfig] = []
    for index, entry in enumerate(entries):
        label = f"peer {index + 1}" + (f" ({entry.get('alias')!r})" if isinstance(entry, dict) else "")
        if not isinstance(entry, dict):
            raise PeersFileInvalid(f"peers file {file}: {label} must be a table", setting="a2a_peers_file")
        inline = sorted(k for k in entry if k.lower() in SECRET_KEYS)
        if inline:
            raise PeersFileInvalid(
                f"peers file {file}: {label} has an inline secret ({', '.join(inline)}); secrets never go in "
                "this file: put the key in an environment variable and write its NAME in credential_env",
                setting="a2a_peers_file",
            )
        try:
            peers.append(PeerConfig(**entry))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'peer'}: {e['msg']}" for e in exc.errors())
            raise PeersFileInvalid(f"peers file {file}: {label}: {problems}", setting="a2a_peers_file") from None
    aliases = [p.alias for p in peers]
    duplicates = sorted({a for a in aliases if aliases.count(a) > 1})
    if duplicates:
        raise PeersFileInvalid(f"peers file {file}: alias used twice: {', '.join(duplicates)}",
                               setting="a2a_peers_file")
    return Peers(file, tuple(peers))
