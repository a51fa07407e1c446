"""The edge's section of the settings (``settings.edge``): where the A2A edge listens and every bound it enforces.

docs/A2A_EDGE.md lists the bounds for customers. Part of the one ``Settings`` object (core/settings.py); this module
imports only core/settings_base.py.
"""

from __future__ import annotations

import re

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from core.settings_base import Section

_HOST_PORT = re.compile(r"^[A-Za-z0-9.\-]+:[0-9]{1,5}$")  # a gRPC target as a stock client takes it


class EdgeSettings(Section):
    """The A2A edge (app/): every bound it enforces. docs/A2A_EDGE.md lists them for customers."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_")

    host: str = Field(default="127.0.0.1", validation_alias="SPECIALISTS_EDGE_HOST", description="Interface the edge listens on.")
    port: int = Field(
        default=8080, ge=1, le=65535, validation_alias="SPECIALISTS_EDGE_PORT", description="TCP port the edge listens on."
    )
    public_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/]+(/[^\s]*)?$",
        validation_alias="SPECIALISTS_EDGE_PUBLIC_URL",
        description="Base URL customers reach the edge at (put in Agent Cards). "
        "Unset: http://SPECIALISTS_EDGE_HOST:SPECIALISTS_EDGE_PORT.",
    )
    grpc_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        validation_alias="SPECIALISTS_GRPC_PORT",
        description="TCP port of the A2A gRPC binding, on SPECIALISTS_EDGE_HOST (h2c: HTTP/2 without TLS). "
        "0: no gRPC server in this process (several edges may start on one machine).",
    )
    grpc_public_url: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9.\-]+:[0-9]{1,5}$",
        validation_alias="SPECIALISTS_GRPC_PUBLIC_URL",
        description="host:port customers reach the gRPC binding at (each Agent Card's GRPC interface). "
        "Unset: 127.0.0.1:SPECIALISTS_GRPC_PORT when that is set, else the cards list no GRPC interface.",
    )
    grpc_specialist_ports: dict[str, int] = Field(
        default_factory=dict,
        validation_alias="SPECIALISTS_GRPC_SPECIALIST_PORTS",
        description="Ports, on SPECIALISTS_EDGE_HOST, where the gRPC binding serves one specialist each, as JSON "
        '({"conformance": 50052}): a call there needs no tenant, so a client that follows only the card\'s URL '
        "reaches its specialist. Empty: none (the shared SPECIALISTS_GRPC_PORT routes on the tenant).",
    )
    grpc_specialist_urls: dict[str, str] = Field(
        default_factory=dict,
        validation_alias="SPECIALISTS_GRPC_SPECIALIST_URLS",
        description="host:port customers reach a specialist's own gRPC listener at, as JSON "
        '({"conformance": "conformance-grpc.example.com:443"}): the first GRPC interface of its card, without a '
        "tenant. Unset for a specialist: 127.0.0.1:<its SPECIALISTS_GRPC_SPECIALIST_PORTS port>, if it has one.",
    )
    max_request_body_bytes: int = Field(
        default=2 * 1024 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="Largest HTTP request body accepted; refused with 413 before it is read whole.",
    )
    max_json_depth: int = Field(
        default=100,
        ge=8,
        le=100,
        description="Deepest JSON nesting a request body may have (refused as malformed before parsing; "
        "protobuf's JSON reader stops at 100).",
    )
    max_message_id_chars: int = Field(
        default=256, ge=8, le=1024, description="Longest A2A messageId accepted (it is the idempotency key)."
    )
    max_idempotency_key_chars: int = Field(
        default=255,
        ge=8,
        le=1024,
        description="Longest Idempotency-Key header accepted (printable ASCII; refused as idempotency_key_invalid).",
    )
    idempotency_key_retention_s: int = Field(
        default=86_400,
        ge=60,
        le=30 * 86_400,
        validation_alias="SPECIALISTS_IDEMPOTENCY_KEY_RETENTION_S",
        description="How long an Idempotency-Key is remembered after its first use: a resend within it replays "
        "the first answer; past it the key starts a new task. Dispatchers prune expired keys.",
    )
    max_body_elements: int = Field(
        default=20_000,
        ge=100,
        le=1_000_000,
        description="Most JSON values (objects, arrays, strings, numbers, literals) a request body may hold; counted "
        "on the raw body before any parse, so a body of many tiny elements cannot hold the event loop.",
    )
    max_json_number_chars: int = Field(
        default=40,
        ge=24,
        le=4000,
        description="Longest number literal a request body may hold (a longer integer is refused before Python "
        "converts it); non-finite numbers (NaN, Infinity, 1e999) are refused whatever their length.",
    )
    max_name_chars: int = Field(
        default=256,
        ge=16,
        le=65_536,
        description="Longest short text field of a message: a part's filename and mediaType, an "
        "acceptedOutputModes entry, the tenant.",
    )
    max_uri_chars: int = Field(
        default=2048, ge=64, le=65_536, description="Longest extension URI a message or request may name."
    )
    max_list_items: int = Field(
        default=32,
        ge=1,
        le=10_000,
        description="Most entries of a message's referenceTaskIds or extensions, and of acceptedOutputModes.",
    )
    db_retry_after_s: int = Field(
        default=5,
        ge=1,
        le=3600,
        description="Retry-After of the 503 an A2A request gets while the database cannot be reached.",
    )
    anonymous_free_skills: bool = Field(
        default=False,
        description="Serve callers without a key, only for specialists whose tariff is 0.",
    )
    rate_limit_window_s: int = Field(
        default=60, ge=1, le=3600, description="Length of the fixed rate-limit window, counted in PostgreSQL."
    )
    rate_limit_per_key: int = Field(
        default=600, ge=1, le=10_000_000, description="A2A requests one key may make per window."
    )
    rate_limit_anonymous_per_address: int = Field(
        default=60, ge=1, le=10_000_000, description="A2A requests one client address may make per window without a key."
    )
    rate_limit_global: int = Field(
        default=60_000,
        ge=1,
        le=100_000_000,
        description="A2A requests all callers together may make per window, across every instance.",
    )
    blocking_wait_max_s: float = Field(
        default=60.0,
        ge=1.0,
        le=900.0,
        description="How long a blocking SendMessage waits for the task to finish or ask for input.",
    )
    max_open_streams: int = Field(
        default=500, ge=1, le=100_000, description="Streams (SendStreamingMessage, subscribe) one instance serves at once."
    )
    max_open_streams_per_customer: int = Field(
        default=50,
        ge=1,
        le=100_000,
        description="Streams one customer (an anonymous caller: one client address) may hold open on one instance, "
        "so that no customer takes every slot (one above SPECIALISTS_MAX_OPEN_STREAMS caps nothing more). "
        "Over it: 429, `customer_stream_cap`.",
    )
    stream_retry_after_s: int = Field(
        default=5,
        ge=1,
        le=300,
        description="`Retry-After` of a stream refused for want of a slot (the instance's or the customer's).",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="When set, GET /metrics answers only a request with `Authorization: Bearer <this>` (the "
        "scraper's); unset, anyone who reaches the edge reads the counts (fine on one machine, not on a public API).",
    )
    metrics_open: bool = Field(
        default=False,
        description="With SPECIALISTS_KEY_ENVIRONMENT=live and no SPECIALISTS_METRICS_TOKEN, `serve` refuses to "
        "start (an open /metrics on a public API); true opens /metrics to anyone on purpose (a private network).",
    )
    sse_ping_interval_s: float = Field(
        default=3.0,
        ge=0.5,
        le=60.0,
        description="Keep-alive comment interval on event streams; below the a2a-sdk client's 5 s default timeout.",
    )
    event_poll_interval_s: float = Field(
        default=1.0,
        ge=0.05,
        le=30.0,
        description="Fallback poll of the task event log when a PostgreSQL notification is missed.",
    )
    card_max_age_s: int = Field(
        default=300, ge=0, le=86_400, description="Cache-Control max-age of Agent Cards and the specialist list."
    )
    list_tasks_scan_max_rows: int = Field(
        default=1000,
        ge=100,
        le=100_000,
        description="Most task rows a filtered ListTasks reads beyond its page: its totalSize is counted on its "
        "first page up to this many (exact below it, this number at it), and a page filtered by both contextId "
        "and status examines at most this many of the context's tasks per section (it may then come back short, "
        "with a nextPageToken).",
    )
    list_tasks_accept_sdk_page_tokens: bool = Field(
        default=True,
        description="Accept the a2a-sdk store's page tokens (issued by the release before issue 18's) as positions, "
        "so a listing that spans a rolling deploy keeps paging. Turn off once no instance of that release serves: "
        "then every token must be one this service signed.",
    )
    conformance_hold_working_s: float = Field(
        default=5.0,
        ge=0.0,
        le=60.0,
        description=(
            "How long the conformance specialist keeps a `slow` task (text starting with `slow`, or messageId "
            "`test-resubscribe-message-id`) working: long enough for a foreign client to cancel it."
        ),
    )

    @property
    def url(self) -> str:
        """The base URL customers reach the edge at: public_url, or http://host:port."""
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    @property
    def grpc_url(self) -> str | None:
        """Where customers reach the gRPC binding (host:port), or None when the cards list none."""
        if self.grpc_public_url:
            return self.grpc_public_url
        return f"127.0.0.1:{self.grpc_port}" if self.grpc_port else None

    def grpc_specialist_url(self, specialist_id: str) -> str | None:
        """Where customers reach the gRPC listener of this specialist alone (host:port), or None if it has none."""
        if specialist_id in self.grpc_specialist_urls:
            return self.grpc_specialist_urls[specialist_id]
        port = self.grpc_specialist_ports.get(specialist_id)
        return f"127.0.0.1:{port}" if port else None

    @model_validator(mode="after")
    def _grpc_port_is_its_own(self) -> EdgeSettings:
        if self.grpc_port and self.grpc_port == self.port:
            raise ValueError(
                f"SPECIALISTS_GRPC_PORT ({self.grpc_port}) is SPECIALISTS_EDGE_PORT too; "
                "the gRPC binding needs a port of its own"
            )
        taken = {self.port: "SPECIALISTS_EDGE_PORT", **({self.grpc_port: "SPECIALISTS_GRPC_PORT"} if self.grpc_port else {})}
        for specialist_id, port in sorted(self.grpc_specialist_ports.items()):
            if not 1 <= port <= 65535:
                raise ValueError(f"SPECIALISTS_GRPC_SPECIALIST_PORTS gives {specialist_id!r} port {port}; a port is 1-65535")
            if port in taken:
                raise ValueError(
                    f"SPECIALISTS_GRPC_SPECIALIST_PORTS gives {specialist_id!r} port {port}, which {taken[port]} "
                    "has: each specialist's gRPC listener needs a port of its own"
                )
            taken[port] = f"{taken.get(port, 'SPECIALISTS_GRPC_SPECIALIST_PORTS')} ({specialist_id!r})"
        for specialist_id, url in sorted(self.grpc_specialist_urls.items()):
            if not _HOST_PORT.match(url):
                raise ValueError(f"SPECIALISTS_GRPC_SPECIALIST_URLS gives {specialist_id!r} {url!r}; it takes host:port")
        return self
