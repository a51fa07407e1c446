"""The service's one settings object, read from the environment, with a section per room.

Nothing else in the service reads ``os.environ``. Every limit is a named field
with a default that works on one machine, validated when the settings load.
Each section is a pydantic-settings class that reads its own variables (the
names are in docs/SETTINGS.md, rendered from these classes by core/settings_doc.py);
``Settings`` holds one of each and checks the rules that span two sections.

In tests, give a section as a dict of its fields: ``Settings(database={"url": url})``
reads the rest of that section, and every other section, from the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# Ceilings the ledger's schema enforces with CHECK constraints (migrations/versions/0002_ledger.py);
# the ledger section's bounds stop at them. ledger/limits.py gives them to the ledger, and
# tests/ledger/test_schema_limits.py checks them against the live schema.
SCHEMA_MAX_CREDITS = 10**15
SCHEMA_MAX_PRIORITY = 1000
SCHEMA_MAX_PARALLEL = 100_000
SCHEMA_MAX_TEXT_CHARS = 500
SCHEMA_MAX_ID_CHARS = 200
SCHEMA_MAX_OPERATIONS_PER_BATCH = 1000  # ledger_batch refuses more (migration 0150)


def _split_commas(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


# A list of secrets in one variable: comma-separated, newest first.
SecretList = Annotated[list[SecretStr], NoDecode, BeforeValidator(_split_commas)]


class Section(BaseSettings):
    """One room's settings: the variables ``env_prefix`` + FIELD, or a field's own ``validation_alias``."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable that sets ``field``, for error messages and the reference."""
        alias = cls.model_fields[field].validation_alias
        if isinstance(alias, str):
            return alias
        return (cls.model_config.get("env_prefix") or "") + field.upper()


class DatabaseSettings(Section):
    """The database: which PostgreSQL, and the connection pool of each process."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_DB_")

    url: str | None = Field(
        default=None,
        validation_alias="DATABASE_URL",
        description="PostgreSQL URL. Unset: start the embedded PostgreSQL in SPECIALISTS_DATA_DIR.",
    )
    data_dir: Path = Field(
        default=PROJECT_ROOT / ".data",
        validation_alias="SPECIALISTS_DATA_DIR",
        description="Project-local folder for the embedded database and local secrets.",
    )
    pool_size: int = Field(default=10, ge=1, le=200, description="Connections each process keeps open to PostgreSQL.")
    max_overflow: int = Field(
        default=20, ge=0, le=500, description="Extra connections a process may open under load, above the pool."
    )
    connect_timeout_s: int = Field(
        default=10, ge=1, le=120, description="Seconds to wait for a new database connection before failing."
    )

    @property
    def embedded(self) -> bool:
        return self.url is None


class KeySettings(Section):
    """Customer keys: the signing secrets and the revocation bound (ledger/keys.py)."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_KEY_")

    min_secret_chars: int = Field(default=32, ge=16, le=1024, description="Shortest key-signing secret accepted at start-up.")
    signing_secrets: SecretList = Field(
        default_factory=list,
        description="Comma-separated key-signing secrets, newest first. The newest signs, all verify.",
    )
    environment: str = Field(
        default="test", pattern="^(live|test)$", description="Key prefix this service issues and accepts: live or test."
    )
    default_ttl_days: int = Field(
        default=365, ge=1, le=3650, description="Lifetime of a new key unless `keys issue --ttl-days` says otherwise."
    )
    revocation_cache_s: float = Field(
        default=5.0,
        ge=0.0,
        le=300.0,
        validation_alias="SPECIALISTS_REVOCATION_CACHE_S",
        description="How long an instance may trust a key's revocation status: the revocation bound.",
    )

    @field_validator("signing_secrets")
    @classmethod
    def _secrets_long_enough(cls, value: list[SecretStr], info) -> list[SecretStr]:
        minimum = info.data.get("min_secret_chars", 32)
        for index, secret in enumerate(value):
            if len(secret.get_secret_value()) < minimum:
                raise ValueError(
                    f"key-signing secret #{index + 1} has {len(secret.get_secret_value())} characters; "
                    f"at least {minimum} are required (SPECIALISTS_KEY_MIN_SECRET_CHARS)"
                )
        return value


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

    @model_validator(mode="after")
    def _grpc_port_is_its_own(self) -> EdgeSettings:
        if self.grpc_port and self.grpc_port == self.port:
            raise ValueError(
                f"SPECIALISTS_GRPC_PORT ({self.grpc_port}) is SPECIALISTS_EDGE_PORT too; "
                "the gRPC binding needs a port of its own"
            )
        return self


class LogSettings(Section):
    """The JSON logs every process writes."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_LOG_")

    level: str = Field(
        default="INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$", description="Lowest level of the JSON logs written."
    )


class TelemetrySettings(Section):
    """Traces and metrics (core/telemetry.py, docs/OPERATIONS.md "Traces and metrics"): OpenTelemetry, exported by
    OTLP over HTTP. Off unless enabled; `/metrics` in Prometheus form stays either way."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_OTEL_")

    enabled: bool = Field(
        default=False,
        description="Record traces and OpenTelemetry metrics and export them (off: no span is recorded, no "
                    "exporter runs, log lines carry no trace).",
    )
    endpoint: str = Field(
        default="http://127.0.0.1:4318", pattern=r"^https?://[^\s/]+(/[^\s]*)?$", max_length=500,
        description="The OTLP/HTTP receiver: its /v1/traces and /v1/metrics. On Cloud Run, the collector beside "
                    "each service (infra/observability.tf).",
    )
    traces: Literal["otlp", "none"] = Field(default="otlp", description="Where spans go: the OTLP receiver, or "
                                                                        "nowhere (ids in logs only).")
    metrics: Literal["otlp", "none"] = Field(default="otlp", description="Where OpenTelemetry metrics go.")
    sampling_ratio: float = Field(
        default=0.1, ge=0.0, le=1.0,
        description="The share of new traces whose spans are recorded and exported (a trace continued from a "
                    "caller keeps the caller's decision). Every task's log lines carry its trace id whatever it "
                    "is. 1.0 records every task's spans, at 10-13% more edge CPU per admission at saturation "
                    "against 2-9% for 0.1 (docs/BENCHMARKS.md).",
    )
    accept_traceparent: bool = Field(
        default=False,
        description="Continue a customer's W3C `traceparent` at the edge. Off: every request starts a trace of "
                    "its own, and a caller cannot join or mark ours.",
    )
    export_delay_s: float = Field(
        default=5.0, gt=0, le=60, description="Longest a finished span waits before it is exported."
    )
    metrics_interval_s: float = Field(
        default=60.0, gt=0, le=3600,
        description="How often metrics are exported (Cloud Monitoring accepts a point per series every 5 s at "
                    "most; its collector batches).",
    )
    export_timeout_s: float = Field(default=10.0, gt=0, le=60, description="One export's time limit.")
    shutdown_s: float = Field(
        default=3.0, gt=0, le=30,
        description="The longest a stopping process (or a job's process, after its outcome) waits to export what it "
                    "still holds; past it the rest is dropped. Cloud Run allows 10 s after SIGTERM, the worker's "
                    "drain included.",
    )
    service_name: str = Field(
        default="", max_length=100, validation_alias=AliasChoices("SPECIALISTS_OTEL_SERVICE_NAME", "K_SERVICE"),
        description="The resource's service.name (Cloud Run sets K_SERVICE); empty: specialists-<role>.",
    )
    revision: str = Field(
        default="", max_length=100, validation_alias=AliasChoices("SPECIALISTS_OTEL_REVISION", "K_REVISION"),
        description="The resource's service.version (Cloud Run sets K_REVISION); empty: the package's version.",
    )
    project: str = Field(
        default="", max_length=100,
        validation_alias=AliasChoices("SPECIALISTS_OTEL_PROJECT", "GOOGLE_CLOUD_PROJECT"),
        description="The Google Cloud project named in the logs' `logging.googleapis.com/trace`, so Cloud "
                    "Logging opens a line's trace; empty: the field holds the bare trace id.",
    )


class DispatchSettings(Section):
    """Dispatch (workers/dispatch): getting an admitted job to a worker. docs/WORKERS.md explains each bound."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_DISPATCH_")

    backend: Literal["embedded", "cloud_tasks"] = Field(
        default="embedded",
        description="How admitted jobs reach a worker: the embedded PostgreSQL queue or Cloud Tasks.",
    )
    deadline_s: int = Field(
        default=600,
        ge=15,
        le=1800,
        description="Cloud Tasks dispatch deadline: how long one delivery may hold the worker request. "
        "Must exceed every specialist deadline plus SPECIALISTS_WORKER_CANCEL_GRACE_S.",
    )
    max_body_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=100_000,
        description="Largest signed job body a dispatcher sends and a worker reads "
        "(the Cloud Tasks API caps a task at 100 KB; the job's input lives in PostgreSQL).",
    )
    enqueue_timeout_s: float = Field(
        default=10.0, ge=1.0, le=60.0, description="How long one enqueue to Cloud Tasks may take, retries included."
    )
    worker_url: str = Field(
        default="http://127.0.0.1:8081/jobs",
        description="The private worker endpoint that dispatched jobs are delivered to. The embedded "
        "dispatcher accepts several, comma-separated, and spreads deliveries over them.",
    )
    job_deadline_s: float = Field(
        default=300.0,
        ge=1.0,
        le=1800.0,
        description="The deadline a worker gives every job (until specs carry their own).",
    )
    poll_interval_s: float = Field(
        default=1.0,
        ge=0.05,
        le=60.0,
        description="How often a dispatcher looks at the outbox when no notification woke it.",
    )
    batch_size: int = Field(default=32, ge=1, le=1000, description="Outbox rows one dispatcher round takes.")
    delivery_lease_s: float = Field(
        default=30.0,
        ge=1.0,
        le=3600.0,
        description="Embedded: how long a row being delivered is held by its dispatcher (renewed while the "
        "delivery lasts); a dispatcher that dies releases its rows after this long.",
    )
    retry_base_s: float = Field(default=0.5, ge=0.01, le=60.0, description="First retry delay of a delivery.")
    retry_max_s: float = Field(
        default=60.0, ge=0.1, le=3600.0, description="Longest delay between two deliveries (or enqueues) of one job."
    )
    max_attempts: int = Field(
        default=50,
        ge=1,
        le=10_000,
        description="Deliveries (or enqueues) of a job that no worker claimed before it is failed as undeliverable.",
    )
    sweep_interval_s: float = Field(
        default=5.0,
        ge=0.1,
        le=600.0,
        description="How often a dispatcher records running jobs whose lease passed as unknown.",
    )
    task_events_retention_days: float = Field(
        default=14.0,
        ge=0.01,
        le=3650.0,
        validation_alias="SPECIALISTS_TASK_EVENTS_RETENTION_DAYS",
        description="Events of a task finished this long ago are deleted (a finished task cannot be streamed; "
        "GetTask still answers from the task itself). Dispatchers prune every SPECIALISTS_TASK_EVENTS_PRUNE_INTERVAL_S.",
    )
    task_events_prune_batch: int = Field(
        default=5000,
        ge=100,
        le=1_000_000,
        validation_alias="SPECIALISTS_TASK_EVENTS_PRUNE_BATCH",
        description="Events deleted at most per prune round (one transaction).",
    )
    task_events_prune_interval_s: float = Field(
        default=300.0,
        ge=1.0,
        le=86_400.0,
        validation_alias="SPECIALISTS_TASK_EVENTS_PRUNE_INTERVAL_S",
        description="How often a dispatcher prunes the events of finished tasks.",
    )
    idempotency_keys_prune_batch: int = Field(
        default=1000,
        ge=10,
        le=100_000,
        validation_alias="SPECIALISTS_IDEMPOTENCY_KEYS_PRUNE_BATCH",
        description="Expired Idempotency-Keys deleted at most per prune round (one short transaction, oldest first "
        "through an index); rounds run every SPECIALISTS_TASK_EVENTS_PRUNE_INTERVAL_S.",
    )
    outbox_retention_days: float = Field(
        default=14.0,
        ge=0.01,
        le=3650.0,
        description="Outbox rows of finished jobs (done, canceled, undeliverable) closed this long ago are deleted, "
        "with the job's message, once their task has ended and their claim is neither running nor unknown. A job "
        "whose row is gone is never claimed again. Must exceed SPECIALISTS_WORKER_JOB_MAX_AGE_S + "
        "SPECIALISTS_DISPATCH_DEADLINE_S, the longest a delivery can still arrive.",
    )
    outbox_prune_batch: int = Field(
        default=1000,
        ge=10,
        le=100_000,
        description="Outbox rows of finished jobs deleted at most per prune round (one statement, oldest first "
        "through an index); rounds run every SPECIALISTS_TASK_EVENTS_PRUNE_INTERVAL_S.",
    )
    job_claims_retention_days: float = Field(
        default=30.0,
        ge=0.01,
        le=3650.0,
        validation_alias="SPECIALISTS_JOB_CLAIMS_RETENTION_DAYS",
        description="Finished and released claims finished this long ago are deleted once their job's outbox row is "
        "gone; running and unknown claims never are. Must exceed SPECIALISTS_WORKER_JOB_MAX_AGE_S + "
        "SPECIALISTS_DISPATCH_DEADLINE_S, the longest a delivery can still arrive.",
    )
    job_claims_prune_batch: int = Field(
        default=1000,
        ge=10,
        le=100_000,
        validation_alias="SPECIALISTS_JOB_CLAIMS_PRUNE_BATCH",
        description="Finished claims deleted at most per prune round (one statement, oldest first through an "
        "index); rounds run every SPECIALISTS_TASK_EVENTS_PRUNE_INTERVAL_S.",
    )
    prune_rescan_interval_s: float = Field(
        default=86_400.0,
        ge=60.0,
        le=30 * 86_400.0,
        validation_alias="SPECIALISTS_PRUNE_RESCAN_INTERVAL_S",
        description="The outbox and claims prunes walk their index from a cursor, passing what they must keep (an "
        "unknown job, a task waiting for input); this often they start from the oldest again, for what has ended "
        "since.",
    )
    crash_point: Literal["none", "before_enqueue", "after_enqueue"] = Field(
        default="none",
        description="Recovery drills only: the dispatcher exits abruptly at this point (after taking rows and "
        "before handing them over, or after handing them over and before recording it).",
    )
    service_account: str | None = Field(
        default=None,
        description="Service account whose OIDC token Cloud Tasks attaches, and the only one workers accept.",
    )
    cloud_tasks_project: str | None = Field(
        default=None, validation_alias="SPECIALISTS_CLOUD_TASKS_PROJECT", description="Google Cloud project of the Cloud Tasks queue."
    )
    cloud_tasks_location: str | None = Field(
        default=None, validation_alias="SPECIALISTS_CLOUD_TASKS_LOCATION", description="Region of the Cloud Tasks queue."
    )
    cloud_tasks_queue: str | None = Field(
        default=None, validation_alias="SPECIALISTS_CLOUD_TASKS_QUEUE", description="Name of the Cloud Tasks queue jobs are enqueued to."
    )
    cloud_tasks_emulator_host: str | None = Field(
        default=None,
        validation_alias="SPECIALISTS_CLOUD_TASKS_EMULATOR_HOST",
        description="host:port of a local Cloud Tasks emulator (insecure gRPC). Unset: Google's API.",
    )

    @property
    def worker_urls(self) -> list[str]:
        return [url.strip() for url in self.worker_url.split(",") if url.strip()]

    @model_validator(mode="after")
    def _consistent(self) -> "DispatchSettings":
        urls = self.worker_urls
        if not urls or not all(url.startswith(("http://", "https://")) for url in urls):
            raise ValueError(
                f"SPECIALISTS_DISPATCH_WORKER_URL must be one or more comma-separated http(s) URLs, got "
                f"{self.worker_url!r}"
            )
        if self.retry_base_s > self.retry_max_s:
            raise ValueError("SPECIALISTS_DISPATCH_RETRY_BASE_S must not exceed SPECIALISTS_DISPATCH_RETRY_MAX_S")
        if self.backend == "cloud_tasks":
            if len(urls) != 1:
                raise ValueError(
                    "with dispatch_backend cloud_tasks, SPECIALISTS_DISPATCH_WORKER_URL names exactly one worker "
                    "endpoint (the worker service's URL; Cloud Run spreads the load)"
                )
            missing = [
                name
                for name in ("cloud_tasks_project", "cloud_tasks_location", "cloud_tasks_queue", "service_account")
                if not getattr(self, name)
            ]
            if missing:
                raise ValueError(
                    "dispatch_backend is cloud_tasks but "
                    + ", ".join(self.env_name(name) for name in missing)
                    + " is not set"
                )
        return self


# A job's process maps about 140 MiB of address space before it runs anything (Python and the service's libraries,
# measured on the scripted specialist), and each thread it starts may reserve a 64 MiB malloc arena: below this
# a cap would fail ordinary jobs.
MIN_JOB_MEMORY_BYTES = 512 * 1024**2


class WorkerSettings(Section):
    """The worker endpoint (workers/): who may send it jobs, leases, heartbeats, draining."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_WORKER_")

    audience: str = Field(
        default="specialists-worker",
        min_length=1,
        max_length=500,
        description="The worker service's audience (its Cloud Run URL in production); "
        "both the OIDC token and the signed job body are bound to it.",
    )
    job_min_secret_chars: int = Field(
        default=32, ge=16, le=1024, description="Shortest job-body signing secret accepted at start-up."
    )
    job_secrets: SecretList = Field(
        default_factory=list,
        description="Comma-separated secrets that sign job bodies, newest first. None: workers refuse every job.",
    )
    job_max_age_s: int = Field(
        default=3600,
        ge=60,
        le=30 * 24 * 3600,
        description="Oldest signed job body a worker accepts; must cover the queue's retry window.",
    )
    oidc_verify: bool = Field(
        default=True,
        description="Check the Cloud Tasks OIDC token. Turn off only on one machine (embedded dispatch or emulator).",
    )
    oidc_certs_url: str = Field(
        default="https://www.googleapis.com/oauth2/v1/certs",
        description="Where the public keys that sign Cloud Tasks OIDC tokens are published.",
    )
    oidc_certs_cache_s: float = Field(
        default=300.0, ge=0.0, le=86400.0, description="How long a worker keeps the OIDC public keys before fetching again."
    )
    oidc_clock_skew_s: int = Field(
        default=10, ge=0, le=300, description="Clock difference tolerated on an OIDC token's issue and expiry times."
    )
    lease_s: float = Field(
        default=30.0,
        ge=1.0,
        le=600.0,
        description="How long a claim stays live without a heartbeat; past it a running job becomes unknown.",
    )
    heartbeat_s: float = Field(
        default=5.0,
        ge=0.05,
        le=200.0,
        description="Lease renewal interval, at most a third of SPECIALISTS_WORKER_LEASE_S; also the cancellation bound.",
    )
    cancel_grace_s: float = Field(
        default=5.0,
        ge=0.0,
        le=300.0,
        description="How long a runner may take to stop after a cancel or its deadline before the job is finished without it.",
    )
    max_concurrent_jobs: int = Field(
        default=4, ge=1, le=256, description="Jobs one worker runs at once; also what the embedded dispatcher "
        "sends one worker endpoint at once."
    )
    finish_attempts: int = Field(
        default=3, ge=1, le=20, description="Tries to record a job's finish and settlement before giving it to the sweeper."
    )
    drain_s: float = Field(
        default=10.0,
        ge=0.0,
        le=3600.0,
        description="On shutdown, how long running jobs may finish; jobs still running then become unknown "
        "after their lease.",
    )
    job_isolation: Literal["process", "thread"] = Field(
        default="process",
        description="Where a job's runner runs: `process` (its own process, forked from a forkserver the worker "
        "starts; no job's code can stall the worker's heartbeats or health answers, and a runner past its grace "
        "is killed) or `thread` (a thread of the worker; only for tests that inject in-process callbacks).",
    )
    job_max_memory_bytes: int = Field(
        default=4 * 1024**3,
        ge=0,
        le=1024**4,
        description="Address space (RLIMIT_AS) of each process of a job, in bytes, process isolation only; "
        "0: no cap. A job past it fails, and the worker and its other jobs go on.",
    )
    host: str = Field(default="127.0.0.1", description="Interface `specialists worker` listens on.")
    port: int = Field(default=8081, ge=1, le=65535, description="TCP port `specialists worker` listens on.")
    seen_window_s: float = Field(
        default=600.0,
        ge=1.0,
        le=7 * 86_400.0,
        description="How far back `specialists health` looks for workers: one that claimed or renewed a job "
        "within it is listed as seen (a worker with no job writes nothing, so it is not seen).",
    )
    beat_s: float = Field(
        default=15.0,
        ge=0.05,
        le=600.0,
        description="How often a worker writes that it is alive, with the specialists it serves (worker_beats); "
        "at most half of SPECIALISTS_HEALTH_WORKER_LIVE_S.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> "WorkerSettings":
        for index, secret in enumerate(self.job_secrets):
            if len(secret.get_secret_value()) < self.job_min_secret_chars:
                raise ValueError(
                    f"worker job secret #{index + 1} has {len(secret.get_secret_value())} characters; at least "
                    f"{self.job_min_secret_chars} are required (SPECIALISTS_WORKER_JOB_SECRETS)"
                )
        if self.heartbeat_s * 3 > self.lease_s:
            raise ValueError(
                f"worker_heartbeat_s ({self.heartbeat_s}) must be at most a third of worker_lease_s "
                f"({self.lease_s}) so that two lost heartbeats do not lose the lease; lower "
                "SPECIALISTS_WORKER_HEARTBEAT_S or raise SPECIALISTS_WORKER_LEASE_S"
            )
        if self.seen_window_s < self.heartbeat_s:
            raise ValueError(
                f"worker_seen_window_s ({self.seen_window_s:g}) must be at least worker_heartbeat_s "
                f"({self.heartbeat_s:g}), or a worker running a job is not seen between two heartbeats; raise "
                "SPECIALISTS_WORKER_SEEN_WINDOW_S"
            )
        if 0 < self.job_max_memory_bytes < MIN_JOB_MEMORY_BYTES:
            raise ValueError(
                f"worker_job_max_memory_bytes ({self.job_max_memory_bytes}) is below {MIN_JOB_MEMORY_BYTES}, where a "
                "job's Python and its libraries do not even load; raise SPECIALISTS_WORKER_JOB_MAX_MEMORY_BYTES, "
                "or set 0 for no cap"
            )
        return self


class ServeSettings(Section):
    """`specialists serve`: the one command that runs the whole service on one machine."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_SERVE_")

    worker: bool = Field(default=True, description="`specialists serve` also starts a worker (a child process).")
    dispatcher: bool = Field(default=True, description="`specialists serve` also starts a dispatcher (a child process).")
    console: bool | None = Field(
        default=None, description="`specialists serve` also starts the operator console (a child process), at the "
        "URL it prints (SPECIALISTS_CONSOLE_HOST, SPECIALISTS_CONSOLE_PORT). Unset: only on one machine (the "
        "embedded database); in production the console is a service of its own (`specialists console`).",
    )
    child_start_timeout_s: float = Field(
        default=30.0, gt=0, le=600,
        description="How long a child of `specialists serve` (worker, dispatcher, console) may start without "
        "progress: not answering yet and using no CPU time (itself and its processes, from /proc; where there is no "
        "/proc, how long it may take at all). A loaded machine's slow start is progress.",
    )
    child_start_max_s: float = Field(
        default=600.0, gt=0, le=3600,
        description="The longest a child of `specialists serve` may take to start, progress or not.",
    )
    child_stop_margin_s: float = Field(
        default=5.0, gt=0, le=300,
        description="After its drain (SPECIALISTS_WORKER_DRAIN_S), how long a child of `specialists serve` may take "
        "to exit once asked before it is killed.",
    )


class ConsoleSettings(Section):
    """The operator console (ops/console, docs/OPERATIONS.md "The console"): where it listens, who may log in, its
    sessions and the bounds of what a browser may send it."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_CONSOLE_")

    host: str = Field(default="127.0.0.1", description="Address the console listens on (0.0.0.0 in a container).")
    port: int = Field(default=8090, ge=1, le=65535, description="Port the console listens on.")
    auth: Literal["local", "iap"] = Field(
        default="local",
        description="Who the operator is: `local` (one machine: the operator secret, and the operator is "
        "SPECIALISTS_CONSOLE_LOCAL_OPERATOR) or `iap` (production: the Google identity in the IAP JWT, which must "
        "be in SPECIALISTS_CONSOLE_OPERATORS).",
    )
    operator_secret: SecretStr | None = Field(
        default=None,
        description="With auth=local, the secret a person types to log in (generated into the local secrets by "
        "`specialists serve`).",
    )
    local_operator: str = Field(
        default="", max_length=200, pattern=r"^[A-Za-z0-9_.@:+-]*$",
        description="With auth=local, the operator every console action is journalled as (empty: the OS user).",
    )
    session_secrets: SecretList = Field(
        default_factory=list,
        description="Comma-separated secrets, newest first, that sign the console's session cookies; the newest "
        "signs, all verify (a rotation puts a new one in front).",
    )
    min_secret_chars: int = Field(default=32, ge=16, le=1024, description="Shortest console secret accepted at start-up.")
    session_ttl_s: int = Field(
        default=8 * 3600, ge=60, le=7 * 86400,
        description="How long a console session lasts after its login; then the operator logs in again.",
    )
    operators: Annotated[list[str], NoDecode, BeforeValidator(_split_commas)] = Field(
        default_factory=list,
        description="With auth=iap, the Google accounts (emails, comma-separated) allowed in; anyone else is "
        "refused even when IAP let them through.",
    )
    iap_audience: str = Field(
        default="", max_length=300,
        description="With auth=iap, the audience of the IAP JWT (`/projects/NUMBER/...`, see docs/OPERATIONS.md).",
    )
    iap_certs_url: str = Field(
        default="https://www.gstatic.com/iap/verify/public_key",
        description="With auth=iap, where IAP's public keys (PEM by key id) are fetched from.",
    )
    iap_certs_cache_s: float = Field(default=3600.0, ge=1, le=86400, description="How long fetched IAP keys are reused.")
    iap_certs_refetch_s: float = Field(
        default=30.0, ge=1, le=3600,
        description="With auth=iap, the least time between two fetches of IAP's keys made because an assertion "
        "named a key id they lack; until then such an assertion is refused without a fetch (the miss is cached).",
    )
    allowed_origins: Annotated[list[str], NoDecode, BeforeValidator(_split_commas)] = Field(
        default_factory=list,
        description="Origins (`scheme://host[:port]`, comma-separated) whose pages may post to the console; any "
        "other Origin or Referer is refused. Empty: with auth=local, `http://HOST:PORT` of the console's own "
        "address (and `localhost` for a loopback one); with auth=iap it must be set (the console's https URL).",
    )
    login_failures_per_address: int = Field(
        default=10, ge=1, le=10_000,
        description="With auth=local, wrong operator secrets from one client address within "
        "SPECIALISTS_CONSOLE_LOGIN_WINDOW_S before that address's logins are refused (429) until the window passes.",
    )
    login_failures_global: int = Field(
        default=100, ge=1, le=1_000_000,
        description="With auth=local, wrong operator secrets from all addresses together within "
        "SPECIALISTS_CONSOLE_LOGIN_WINDOW_S before every login is refused (429) until the window passes.",
    )
    login_window_s: int = Field(
        default=300, ge=1, le=86400,
        description="The window the login failure limits count in (per console process).",
    )
    max_form_bytes: int = Field(
        default=16 * 1024, ge=1024, le=1024 * 1024,
        description="Largest form body the console reads; a larger one is refused before it is parsed.",
    )
    max_usage_days: int = Field(
        default=92, ge=1, le=366,
        description="Longest period the usage page charts (also bounded by SPECIALISTS_LEDGER_MAX_USAGE_DAYS).",
    )

    @model_validator(mode="after")
    def _auth_complete(self) -> "ConsoleSettings":
        for index, secret in enumerate(self.session_secrets):
            if len(secret.get_secret_value()) < self.min_secret_chars:
                raise ValueError(f"SPECIALISTS_CONSOLE_SESSION_SECRETS #{index + 1} is shorter than "
                                 f"SPECIALISTS_CONSOLE_MIN_SECRET_CHARS ({self.min_secret_chars})")
        if self.operator_secret is not None and len(self.operator_secret.get_secret_value()) < self.min_secret_chars:
            raise ValueError(f"SPECIALISTS_CONSOLE_OPERATOR_SECRET is shorter than SPECIALISTS_CONSOLE_MIN_SECRET_CHARS "
                             f"({self.min_secret_chars})")
        for email in self.operators:
            if "@" not in email or len(email) > 200 or any(c.isspace() for c in email):
                raise ValueError(f"SPECIALISTS_CONSOLE_OPERATORS: {email!r} is not an email address")
        for origin in self.allowed_origins:
            parts = urlsplit(origin)
            if (parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query
                    or parts.fragment or len(origin) > 300):
                raise ValueError(f"SPECIALISTS_CONSOLE_ALLOWED_ORIGINS: {origin!r} is not an origin "
                                 "(scheme://host[:port], no path)")
        return self


CheckpointSync = Literal["with_journal", "each_record"]  # workers/hosted_rlm/store.py carries it out


class HostedSettings(Section):
    """The hosted specialists (workers/hosted_rlm, docs/SPECIALISTS.md): which specs, which model routes,
    checkpoints and resumes. A spec's own limits live in specs/*.yaml, bounded by core/specs.py."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_SPECIALIST_")

    specs_dir: Path = Field(
        default=PROJECT_ROOT / "specs",
        validation_alias="SPECIALISTS_SPECS_DIR",
        description="Folder of specialist specs (one YAML file each).",
    )
    model_routes_file: Path = Field(
        default=PROJECT_ROOT / "specs" / "demo" / "routes.toml",
        validation_alias="SPECIALISTS_MODEL_ROUTES_FILE",
        description="Model routes (TOML, JSON or YAML): named OpenAI-compatible endpoints with the NAME of the "
        "variable holding each key, or scripted routes. The default holds the scripted demo routes.",
    )
    model_routes_allow_scripted: bool = Field(
        default=False,
        validation_alias="SPECIALISTS_MODEL_ROUTES_ALLOW_SCRIPTED",
        description="Serve scripted (canned) model routes with an external database too; on one machine "
        "(embedded database) they are always allowed.",
    )
    checkpoint_key_min_chars: int = Field(
        default=32, ge=16, le=1024, description="Shortest checkpoint-signing key accepted at start-up."
    )
    checkpoint_key: SecretStr | None = Field(
        default=None,
        description="HMAC key that signs Monty checkpoints in PostgreSQL; a worker refuses to run rlm "
        "specialists without it. Changing it makes checkpoints of running jobs unusable: their resume fails, "
        "charged nothing.",
    )
    max_resumes: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Times one job may be resumed from its checkpoint after the worker running it died; "
        "past it (or without a checkpoint) the job is unknown.",
    )
    checkpoint_sync: CheckpointSync = Field(
        default="with_journal",
        description="When a Monty checkpoint's commit reaches disk (docs/WORKERS.md, Checkpoint durability). "
        "`with_journal`: it commits without waiting for its WAL flush (synchronous_commit off for that "
        "transaction) and is flushed by the journal's next commit, which always comes before anything relies "
        "on it; a killed worker loses nothing, a PostgreSQL crash only records no journal entry refers to yet. "
        "`each_record`: every checkpoint commit waits for its flush, as the database's synchronous_commit says.",
    )
    resume_window_s: float = Field(
        default=300.0,
        ge=1.0,
        le=86_400.0,
        description="How long after a dead worker's lease expired a later delivery may still resume its job; "
        "until then the lease sweeper leaves it, after it the job is recorded unknown.",
    )
    checkpoint_retention_s: float = Field(
        default=86_400.0,
        ge=0.0,
        le=365 * 86_400.0,
        description="How long the Monty checkpoints of a job that can no longer resume (finished, or unknown) are "
        "kept, for an operator's look at a run; dispatchers then delete them. A running or released job keeps its "
        "own whatever their age.",
    )
    checkpoints_prune_batch: int = Field(
        default=500,
        ge=10,
        le=100_000,
        description="Checkpoints deleted at most per prune round (one short transaction, oldest first).",
    )

    @field_validator("checkpoint_key")
    @classmethod
    def _checkpoint_key_long_enough(cls, value: SecretStr | None, info) -> SecretStr | None:
        minimum = info.data.get("checkpoint_key_min_chars", 32)
        if value is not None and len(value.get_secret_value()) < minimum:
            raise ValueError(
                f"the checkpoint key has {len(value.get_secret_value())} characters; at least {minimum} are "
                "required (SPECIALISTS_SPECIALIST_CHECKPOINT_KEY)"
            )
        return value


class DrillSettings(Section):
    """Drills (`specialists drill`, docs/OPERATIONS.md): the hooks that restart and roll a deployment."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_DRILL_")

    restart_api_hook: str | None = Field(
        default=None,
        max_length=4000,
        description="`drill --target`: a shell command that restarts the API instances (say, a new revision "
        "with the same image) while a drill task runs; DRILL_API_URL names the instance. Unset: skipped.",
    )
    roll_api_hook: str | None = Field(
        default=None,
        max_length=4000,
        description="`drill --target`: a shell command that rolls the API to a new revision mid-task. Unset: skipped.",
    )
    restart_worker_hook: str | None = Field(
        default=None,
        max_length=4000,
        description="`drill --target`: a shell command that restarts the workers gracefully while DRILL_JOB_ID "
        "runs. Unset: skipped.",
    )
    kill_worker_hook: str | None = Field(
        default=None,
        max_length=4000,
        description="`drill --target`: a shell command that kills the worker running DRILL_JOB_ID without "
        "warning (the retained unknown scenario). Unset: skipped.",
    )
    hook_timeout_s: float = Field(
        default=600.0, ge=1.0, le=3600.0, description="How long a drill hook may run, and the API then take to be ready."
    )
    slack_s: float = Field(
        default=2.0,
        ge=0.0,
        le=120.0,
        description="Time a drill allows above a stated bound (cancel, unknown, revocation) for network and "
        "load before it calls the bound broken.",
    )
    credits: int = Field(default=200, ge=20, le=100_000, description="Credits granted to each customer a drill creates.")
    keep_local_runs: int = Field(
        default=5, ge=1, le=1000,
        description="`drill --local` without --logs: the newest runs' folders (logs, data) kept in the temporary "
        "folder; a new run removes older ones, never one still running.",
    )


class PushSettings(Section):
    """A2A push notifications (taskstate/push.py, workers/dispatch/push.py): who may be called, how often, how long.
    docs/A2A_EDGE.md ("Push notifications") states them for customers, docs/OPERATIONS.md for operators."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_PUSH_")

    signing_secrets: SecretList = Field(
        default_factory=list,
        description="Comma-separated secrets, newest first, from which the ES256 keys that sign push notifications' "
        "JWTs are derived. The newest signs; every one is published in the JWKS (`/.well-known/jwks.json`), so a "
        "rotation adds a new secret in front and drops the oldest a JWT lifetime later. None: push is off.",
    )
    min_secret_chars: int = Field(default=32, ge=16, le=1024, description="Shortest push signing secret accepted at start-up.")
    allow_loopback: bool = Field(
        default=False,
        description="Accept `http://` webhooks on loopback addresses (127.0.0.0/8, ::1) for local development. "
        "Refused at start-up with SPECIALISTS_KEY_ENVIRONMENT=live.",
    )
    max_configs_per_customer: int = Field(
        default=100, ge=1, le=100_000,
        description="Push configurations one customer may hold on tasks that have not ended; one more is refused.",
    )
    ca_bundle: Path | None = Field(
        default=None,
        description="A PEM file of extra certificate authorities trusted for webhooks' TLS, beside the public ones "
        "(a customer's private PKI). Read at start-up; the address rules still apply (no private address becomes "
        "reachable).",
    )
    max_url_chars: int = Field(default=2048, ge=64, le=2048, description="Longest webhook URL accepted.")
    max_token_chars: int = Field(default=512, ge=16, le=512, description="Longest client token (echoed back) accepted.")
    max_credentials_chars: int = Field(
        default=2048, ge=16, le=2048, description="Longest `authentication.credentials` accepted in a configuration."
    )
    resolve_timeout_s: float = Field(
        default=5.0, gt=0, le=60, description="How long resolving a webhook's host may take, at registration and at delivery."
    )
    request_timeout_s: float = Field(
        default=10.0, gt=0, le=120,
        description="How long one delivery may take, connect to last byte read; past it the attempt failed.",
    )
    max_response_bytes: int = Field(
        default=64 * 1024, ge=0, le=10 * 1024**2,
        description="Bytes of a webhook's response read at most; the rest is not read (the status decides).",
    )
    max_attempts: int = Field(default=8, ge=1, le=100, description="Attempts per notification before it is recorded as failed.")
    backoff_base_s: float = Field(
        default=1.0, gt=0, le=3600, description="Wait after the first failed attempt; doubled after each further one."
    )
    backoff_max_s: float = Field(default=300.0, gt=0, le=86400, description="Longest wait between two attempts.")
    max_age_s: float = Field(
        default=86400.0, ge=1, le=30 * 86400,
        description="Oldest notification still attempted: past it a pending notification is recorded as failed.",
    )
    lease_s: float = Field(
        default=60.0, ge=1, le=3600,
        description="How long a dispatcher holds a claimed notification; a dispatcher that died leaves it due again "
        "after this. Must exceed SPECIALISTS_PUSH_RESOLVE_TIMEOUT_S + SPECIALISTS_PUSH_REQUEST_TIMEOUT_S.",
    )
    max_in_flight: int = Field(default=16, ge=1, le=1024, description="Deliveries one dispatcher makes at once.")
    max_in_flight_per_customer: int = Field(
        default=2, ge=1, le=1024,
        description="Deliveries one dispatcher makes at once to one customer's webhooks: a slow one holds no more.",
    )
    poll_interval_s: float = Field(
        default=1.0, gt=0, le=60, description="Longest a due notification waits for a dispatcher that heard no event."
    )
    jwt_lifetime_s: int = Field(default=300, ge=10, le=3600, description="Lifetime of a notification's JWT (`exp - iat`).")
    retention_days: float = Field(
        default=7.0, gt=0, le=3650,
        description="How long delivered and failed notifications are kept (the failures' list), and the configurations "
        "of ended tasks with nothing left to send.",
    )
    prune_batch: int = Field(
        default=1000, ge=1, le=100_000, description="Notifications (and configurations) one prune round deletes at most."
    )

    @model_validator(mode="after")
    def _consistent(self) -> "PushSettings":
        for index, secret in enumerate(self.signing_secrets):
            if len(secret.get_secret_value()) < self.min_secret_chars:
                raise ValueError(
                    f"push signing secret #{index + 1} has {len(secret.get_secret_value())} characters; at least "
                    f"{self.min_secret_chars} are required (SPECIALISTS_PUSH_SIGNING_SECRETS)"
                )
        if self.lease_s <= self.resolve_timeout_s + self.request_timeout_s:
            raise ValueError(
                f"push_lease_s ({self.lease_s:g}) must exceed push_resolve_timeout_s + push_request_timeout_s "
                f"({self.resolve_timeout_s:g} + {self.request_timeout_s:g}), or a live delivery loses its lease; "
                "raise SPECIALISTS_PUSH_LEASE_S"
            )
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("SPECIALISTS_PUSH_BACKOFF_MAX_S must be at least SPECIALISTS_PUSH_BACKOFF_BASE_S")
        if self.ca_bundle is not None:
            import ssl  # only when a bundle is set: proven loadable now, not at the first delivery

            try:
                ssl.create_default_context().load_verify_locations(cafile=str(self.ca_bundle))
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"SPECIALISTS_PUSH_CA_BUNDLE cannot be read as PEM certificates "
                                 f"({type(exc).__name__}); point it at a readable PEM file") from None
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.signing_secrets)


class LedgerSettings(Section):
    """The credit ledger (ledger/): every bound a caller can hit, up to the schema's ceilings (SCHEMA_MAX_*).

    The errors that enforce them name the variable to change (``LedgerSettings.env_name``).
    """

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_LEDGER_")

    max_credits_per_operation: int = Field(
        default=10**12,
        ge=1,
        le=SCHEMA_MAX_CREDITS,
        description="Largest grant, reservation, charge or adjustment, in credits.",
    )
    max_skills_per_grant: int = Field(default=64, ge=1, le=1000, description="Skill entitlements one grant may name.")
    max_reason_chars: int = Field(
        default=500,
        ge=1,
        le=SCHEMA_MAX_TEXT_CHARS,
        description="Longest reason on a settlement, adjustment, reconcile or key revocation.",
    )
    max_job_id_chars: int = Field(
        default=200, ge=16, le=SCHEMA_MAX_ID_CHARS, description="Longest job id a reservation may carry."
    )
    max_fingerprint_chars: int = Field(
        default=200, ge=16, le=SCHEMA_MAX_ID_CHARS, description="Longest request fingerprint a reservation may carry."
    )
    max_idempotency_key_chars: int = Field(
        default=200, ge=8, le=SCHEMA_MAX_ID_CHARS, description="Longest idempotency key of a grant."
    )
    default_max_parallel: int = Field(
        default=8,
        ge=1,
        le=SCHEMA_MAX_PARALLEL,
        description="Open reservations a new customer may hold at once, until `customers set` or a grant changes "
        "its max_parallel.",
    )
    default_priority: int = Field(
        default=100,
        ge=0,
        le=SCHEMA_MAX_PRIORITY,
        description="Priority of a lot whose grant names none. Lower priorities are drawn down first.",
    )
    max_expire_lots_per_call: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description="Lots one expiry sweep handles in one transaction; run it again for the rest.",
    )
    max_rows_per_listing: int = Field(
        default=1000, ge=1, le=100_000, description="Most rows one listing (history, reservations) returns."
    )
    max_usage_days: int = Field(
        default=366,
        ge=1,
        le=3660,
        description="Longest period one usage read (`credits usage`, tasks by outcome) covers, in days.",
    )
    max_operations_per_batch: int = Field(
        default=32,
        ge=1,
        le=SCHEMA_MAX_OPERATIONS_PER_BATCH,
        description=(
            "Concurrent own-transaction reserves and settles of one customer that one transaction (one lock, "
            "one commit) may carry; 1 runs every call alone."
        ),
    )
    verify_database_url: str | None = Field(
        default=None,
        description=(
            "PostgreSQL URL `specialists ledger verify` reads from, e.g. a read replica (a hot standby serves "
            "its snapshot). Unset: the service's database (DATABASE_URL)."
        ),
    )
    verify_customers_per_chunk: int = Field(
        default=100,
        ge=1,
        le=100_000,
        description=(
            "Accounts the whole-ledger `ledger verify` checks per statement, inside its one snapshot; it "
            "reports progress after each."
        ),
    )

    @field_validator("verify_database_url")
    @classmethod
    def _verify_url_is_postgresql(cls, value: str | None) -> str | None:
        if not value:  # set but empty: as unset, like DATABASE_URL
            return None
        if value.split("://", 1)[0].split("+", 1)[0] not in ("postgres", "postgresql"):
            raise ValueError("must be a postgresql:// URL (or unset, to verify the service's database)")
        return value


class HealthSettings(Section):
    """What `specialists health`, the console's health page and the service's gauges call unhealthy (ops/health.py,
    taskstate/reads.py ``service_facts``)."""

    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_HEALTH_")

    worker_live_s: float = Field(
        default=60.0,
        ge=0.1,
        le=3600.0,
        description="A worker whose last beat is older than this is dead: a specialist none of whose workers beat "
        "within it has no live worker, and health says so within this bound of the last worker's death.",
    )
    max_job_wait_s: float = Field(
        default=300.0,
        ge=1.0,
        le=7 * 86_400.0,
        description="A job no worker has taken for longer than this makes health fail (its age is shown either way).",
    )
    max_push_wait_s: float = Field(
        default=300.0,
        ge=1.0,
        le=7 * 86_400.0,
        description="A push notification due for longer than this without a delivery attempt makes health fail "
        "(the deliverers are down or behind; one waiting for its retry's time is not counted).",
    )
    failures_window_s: float = Field(
        default=3600.0,
        ge=1.0,
        le=30 * 86_400.0,
        description="How far back health counts push notifications that finally failed (shown, never a failure "
        "of the service: a customer's webhook may be down).",
    )


class Settings(BaseModel):
    """The service's settings: one section per room, each read from the environment when not given."""

    model_config = ConfigDict(extra="forbid")

    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    keys: KeySettings = Field(default_factory=KeySettings)
    edge: EdgeSettings = Field(default_factory=EdgeSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    dispatch: DispatchSettings = Field(default_factory=DispatchSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    serve: ServeSettings = Field(default_factory=ServeSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    hosted: HostedSettings = Field(default_factory=HostedSettings)
    drill: DrillSettings = Field(default_factory=DrillSettings)
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    push: PushSettings = Field(default_factory=PushSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)

    @model_validator(mode="after")
    def _sections_consistent(self) -> "Settings":
        dispatch, worker = self.dispatch, self.worker
        if worker.beat_s * 2 > self.health.worker_live_s:
            raise ValueError(
                f"worker_beat_s ({worker.beat_s:g}) must be at most half of health_worker_live_s "
                f"({self.health.worker_live_s:g}), or one late beat makes a live worker look dead; lower "
                "SPECIALISTS_WORKER_BEAT_S or raise SPECIALISTS_HEALTH_WORKER_LIVE_S"
            )
        if dispatch.job_deadline_s + worker.cancel_grace_s >= dispatch.deadline_s:
            raise ValueError(
                f"dispatch_job_deadline_s ({dispatch.job_deadline_s:g}) plus worker_cancel_grace_s "
                f"({worker.cancel_grace_s:g}) must stay below dispatch_deadline_s ({dispatch.deadline_s}): "
                "a delivery must outlive its job; lower SPECIALISTS_DISPATCH_JOB_DEADLINE_S or raise "
                "SPECIALISTS_DISPATCH_DEADLINE_S"
            )
        # A delivery's signed body is accepted for worker_job_max_age_s after it was signed, and Cloud Tasks may
        # start one up to then and hold it a dispatch deadline: the records a late delivery is answered from must
        # outlive that (the claim path refuses a job whose outbox row is gone besides, docs/OPERATIONS.md).
        delivery_lifetime_s = worker.job_max_age_s + dispatch.deadline_s
        for field, days in (("outbox_retention_days", dispatch.outbox_retention_days),
                            ("job_claims_retention_days", dispatch.job_claims_retention_days)):
            if days * 86_400 <= delivery_lifetime_s:
                raise ValueError(
                    f"{DispatchSettings.env_name(field)} ({days:g} days = {days * 86_400:.0f} s) must exceed "
                    f"SPECIALISTS_WORKER_JOB_MAX_AGE_S + SPECIALISTS_DISPATCH_DEADLINE_S ({worker.job_max_age_s} + "
                    f"{dispatch.deadline_s} = {delivery_lifetime_s} s), the longest a delivery of a finished job "
                    f"can still arrive: raise {DispatchSettings.env_name(field)} or lower "
                    "SPECIALISTS_WORKER_JOB_MAX_AGE_S"
                )
        if dispatch.backend == "cloud_tasks" and not worker.oidc_verify and not dispatch.cloud_tasks_emulator_host:
            raise ValueError(
                "SPECIALISTS_WORKER_OIDC_VERIFY=false is only allowed on one machine (embedded dispatch or "
                "the local emulator); with real Cloud Tasks the OIDC token must be checked"
            )
        if self.push.allow_loopback and self.keys.environment == "live":
            raise ValueError(
                "SPECIALISTS_PUSH_ALLOW_LOOPBACK=true is only for local development; with "
                "SPECIALISTS_KEY_ENVIRONMENT=live webhooks must be https on public addresses"
            )
        return self

    @property
    def scripted_routes_allowed(self) -> bool:
        return self.database.embedded or self.hosted.model_routes_allow_scripted


SECTIONS: dict[str, type[Section]] = {
    name: field.annotation for name, field in Settings.model_fields.items()  # type: ignore[misc]
}


_SECTION_BY_CLASS = {section.__name__: section for section in SECTIONS.values()}


def describe_invalid(invalid: ValidationError) -> str:
    """A ValidationError of the settings as '<VARIABLE>: <problem>; ...', naming the variable to change."""
    section = _SECTION_BY_CLASS.get(invalid.title)
    problems = []
    for error in invalid.errors(include_input=False):
        loc = [str(part) for part in error["loc"]]
        owner = section
        if owner is None and loc and loc[0] in SECTIONS:  # an error of Settings itself: (section, field, ...)
            owner = SECTIONS[loc.pop(0)]
        if owner is not None and loc and loc[0] in owner.model_fields:
            loc[0] = owner.env_name(loc[0])
        where = ".".join(loc)
        message = error["msg"].removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)
