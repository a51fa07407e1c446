"""The service's one settings object, read from the environment.

Nothing else in the service reads ``os.environ``. Every limit is a named field
with a default that works on one machine, validated when the settings load.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from typing import Annotated, Literal

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_", extra="ignore")

    # --- database -----------------------------------------------------------
    database_url: str | None = Field(
        default=None,
        validation_alias="DATABASE_URL",
        description="PostgreSQL URL. Unset: start the embedded PostgreSQL in data_dir.",
    )
    data_dir: Path = Field(
        default=PROJECT_ROOT / ".data",
        description="Project-local folder for the embedded database and local secrets.",
    )
    db_pool_size: int = Field(default=10, ge=1, le=200, description="Connections each process keeps open to PostgreSQL.")
    db_max_overflow: int = Field(
        default=20, ge=0, le=500, description="Extra connections a process may open under load, above the pool."
    )
    db_connect_timeout_s: int = Field(
        default=10, ge=1, le=120, description="Seconds to wait for a new database connection before failing."
    )

    # --- customer keys ------------------------------------------------------
    key_min_secret_chars: int = Field(
        default=32, ge=16, le=1024, description="Shortest key-signing secret accepted at start-up."
    )
    key_signing_secrets: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated key-signing secrets, newest first. The newest signs, all verify.",
    )
    key_environment: str = Field(
        default="test", pattern="^(live|test)$", description="Key prefix this service issues and accepts: live or test."
    )
    key_default_ttl_days: int = Field(
        default=365, ge=1, le=3650, description="Lifetime of a new key unless `keys issue --ttl-days` says otherwise."
    )
    revocation_cache_s: float = Field(
        default=5.0,
        ge=0.0,
        le=300.0,
        description="How long an instance may trust a key's revocation status: the revocation bound.",
    )

    # --- A2A edge -------------------------------------------------------------
    # Every bound the edge enforces. docs/A2A_EDGE.md lists them for customers.
    edge_host: str = Field(default="127.0.0.1", description="Interface the edge listens on.")
    edge_port: int = Field(default=8080, ge=1, le=65535, description="TCP port the edge listens on.")
    edge_public_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/]+(/[^\s]*)?$",
        description="Base URL customers reach the edge at (put in Agent Cards). Unset: http://edge_host:edge_port.",
    )
    specs_dir: Path = Field(
        default=PROJECT_ROOT / "specs", description="Folder of specialist specs (one YAML file each)."
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
    metrics_token: SecretStr | None = Field(
        default=None,
        description="When set, GET /metrics answers only a request with `Authorization: Bearer <this>` (the "
        "scraper's); unset, anyone who reaches the edge reads the counts (fine on one machine, not on a public API).",
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
    conformance_hold_working_s: float = Field(
        default=4.0,
        ge=0.0,
        le=60.0,
        description="How long the conformance specialist keeps `test-resubscribe-message-id` tasks working.",
    )
    log_level: str = Field(
        default="INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$", description="Lowest level of the JSON logs written."
    )

    @property
    def public_url(self) -> str:
        return (self.edge_public_url or f"http://{self.edge_host}:{self.edge_port}").rstrip("/")

    @field_validator("key_signing_secrets", mode="before")
    @classmethod
    def _split_secrets(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("key_signing_secrets")
    @classmethod
    def _secrets_long_enough(cls, value: list[SecretStr], info) -> list[SecretStr]:
        minimum = info.data.get("key_min_secret_chars", 32)
        for index, secret in enumerate(value):
            if len(secret.get_secret_value()) < minimum:
                raise ValueError(
                    f"key-signing secret #{index + 1} has {len(secret.get_secret_value())} characters; "
                    f"at least {minimum} are required (SPECIALISTS_KEY_MIN_SECRET_CHARS)"
                )
        return value

    # --- dispatch and workers -------------------------------------------------
    # Owned by workers/ (docs/WORKERS.md explains each bound).
    dispatch_backend: Literal["embedded", "cloud_tasks"] = Field(
        default="embedded",
        description="How admitted jobs reach a worker: the embedded PostgreSQL queue or Cloud Tasks.",
    )
    dispatch_deadline_s: int = Field(
        default=600,
        ge=15,
        le=1800,
        description="Cloud Tasks dispatch deadline: how long one delivery may hold the worker request. "
        "Must exceed every specialist deadline plus worker_cancel_grace_s.",
    )
    dispatch_max_body_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=100_000,
        description="Largest signed job body a dispatcher sends and a worker reads "
        "(the Cloud Tasks API caps a task at 100 KB; the job's input lives in PostgreSQL).",
    )
    dispatch_enqueue_timeout_s: float = Field(
        default=10.0, ge=1.0, le=60.0, description="How long one enqueue to Cloud Tasks may take, retries included."
    )
    dispatch_worker_url: str = Field(
        default="http://127.0.0.1:8081/jobs",
        description="The private worker endpoint that dispatched jobs are delivered to. The embedded "
        "dispatcher accepts several, comma-separated, and spreads deliveries over them.",
    )
    dispatch_job_deadline_s: float = Field(
        default=300.0,
        ge=1.0,
        le=1800.0,
        description="The deadline a worker gives every job (until specs carry their own).",
    )
    dispatch_poll_interval_s: float = Field(
        default=1.0,
        ge=0.05,
        le=60.0,
        description="How often a dispatcher looks at the outbox when no notification woke it.",
    )
    dispatch_batch_size: int = Field(default=32, ge=1, le=1000, description="Outbox rows one dispatcher round takes.")
    dispatch_delivery_lease_s: float = Field(
        default=30.0,
        ge=1.0,
        le=3600.0,
        description="Embedded: how long a row being delivered is held by its dispatcher (renewed while the "
        "delivery lasts); a dispatcher that dies releases its rows after this long.",
    )
    dispatch_retry_base_s: float = Field(default=0.5, ge=0.01, le=60.0, description="First retry delay of a delivery.")
    dispatch_retry_max_s: float = Field(
        default=60.0, ge=0.1, le=3600.0, description="Longest delay between two deliveries (or enqueues) of one job."
    )
    dispatch_max_attempts: int = Field(
        default=50,
        ge=1,
        le=10_000,
        description="Deliveries (or enqueues) of a job that no worker claimed before it is failed as undeliverable.",
    )
    dispatch_sweep_interval_s: float = Field(
        default=5.0,
        ge=0.1,
        le=600.0,
        description="How often a dispatcher records running jobs whose lease passed as unknown.",
    )
    task_events_retention_days: float = Field(
        default=14.0,
        ge=0.01,
        le=3650.0,
        description="Events of a task finished this long ago are deleted (a finished task cannot be streamed; "
        "GetTask still answers from the task itself). Dispatchers prune every task_events_prune_interval_s.",
    )
    task_events_prune_batch: int = Field(
        default=5000, ge=100, le=1_000_000, description="Events deleted at most per prune round (one transaction)."
    )
    task_events_prune_interval_s: float = Field(
        default=300.0, ge=1.0, le=86_400.0, description="How often a dispatcher prunes the events of finished tasks."
    )
    dispatch_crash_point: Literal["none", "before_enqueue", "after_enqueue"] = Field(
        default="none",
        description="Recovery drills only: the dispatcher exits abruptly at this point (after taking rows and "
        "before handing them over, or after handing them over and before recording it).",
    )
    dispatch_service_account: str | None = Field(
        default=None,
        description="Service account whose OIDC token Cloud Tasks attaches, and the only one workers accept.",
    )
    cloud_tasks_project: str | None = Field(default=None, description="Google Cloud project of the Cloud Tasks queue.")
    cloud_tasks_location: str | None = Field(default=None, description="Region of the Cloud Tasks queue.")
    cloud_tasks_queue: str | None = Field(default=None, description="Name of the Cloud Tasks queue jobs are enqueued to.")
    cloud_tasks_emulator_host: str | None = Field(
        default=None,
        description="host:port of a local Cloud Tasks emulator (insecure gRPC). Unset: Google's API.",
    )

    worker_audience: str = Field(
        default="specialists-worker",
        min_length=1,
        max_length=500,
        description="The worker service's audience (its Cloud Run URL in production); "
        "both the OIDC token and the signed job body are bound to it.",
    )
    worker_job_min_secret_chars: int = Field(
        default=32, ge=16, le=1024, description="Shortest job-body signing secret accepted at start-up."
    )
    worker_job_secrets: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated secrets that sign job bodies, newest first. None: workers refuse every job.",
    )
    worker_job_max_age_s: int = Field(
        default=3600,
        ge=60,
        le=30 * 24 * 3600,
        description="Oldest signed job body a worker accepts; must cover the queue's retry window.",
    )
    worker_oidc_verify: bool = Field(
        default=True,
        description="Check the Cloud Tasks OIDC token. Turn off only on one machine (embedded dispatch or emulator).",
    )
    worker_oidc_certs_url: str = Field(
        default="https://www.googleapis.com/oauth2/v1/certs",
        description="Where the public keys that sign Cloud Tasks OIDC tokens are published.",
    )
    worker_oidc_certs_cache_s: float = Field(
        default=300.0, ge=0.0, le=86400.0, description="How long a worker keeps the OIDC public keys before fetching again."
    )
    worker_oidc_clock_skew_s: int = Field(
        default=10, ge=0, le=300, description="Clock difference tolerated on an OIDC token's issue and expiry times."
    )
    worker_lease_s: float = Field(
        default=30.0,
        ge=1.0,
        le=600.0,
        description="How long a claim stays live without a heartbeat; past it a running job becomes unknown.",
    )
    worker_heartbeat_s: float = Field(
        default=5.0,
        ge=0.05,
        le=200.0,
        description="Lease renewal interval, at most a third of worker_lease_s; also the cancellation bound.",
    )
    worker_cancel_grace_s: float = Field(
        default=5.0,
        ge=0.0,
        le=300.0,
        description="How long a runner may take to stop after a cancel or its deadline before the job is finished without it.",
    )
    worker_max_concurrent_jobs: int = Field(
        default=4, ge=1, le=256, description="Jobs one worker runs at once; also what the embedded dispatcher "
        "sends one worker endpoint at once."
    )
    worker_finish_attempts: int = Field(
        default=3, ge=1, le=20, description="Tries to record a job's finish and settlement before giving it to the sweeper."
    )
    worker_drain_s: float = Field(
        default=10.0,
        ge=0.0,
        le=3600.0,
        description="On shutdown, how long running jobs may finish; jobs still running then become unknown "
        "after their lease.",
    )
    worker_host: str = Field(default="127.0.0.1", description="Interface `specialists worker` listens on.")
    worker_port: int = Field(default=8081, ge=1, le=65535, description="TCP port `specialists worker` listens on.")

    # --- one command for one machine ---------------------------------------
    serve_worker: bool = Field(
        default=True, description="`specialists serve` also starts a worker (a child process)."
    )
    serve_dispatcher: bool = Field(
        default=True, description="`specialists serve` also starts a dispatcher (a child process)."
    )

    @field_validator("worker_job_secrets", mode="before")
    @classmethod
    def _split_worker_secrets(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _dispatch_and_workers_consistent(self) -> "Settings":
        for index, secret in enumerate(self.worker_job_secrets):
            if len(secret.get_secret_value()) < self.worker_job_min_secret_chars:
                raise ValueError(
                    f"worker job secret #{index + 1} has {len(secret.get_secret_value())} characters; at least "
                    f"{self.worker_job_min_secret_chars} are required (SPECIALISTS_WORKER_JOB_SECRETS)"
                )
        if self.worker_heartbeat_s * 3 > self.worker_lease_s:
            raise ValueError(
                f"worker_heartbeat_s ({self.worker_heartbeat_s}) must be at most a third of worker_lease_s "
                f"({self.worker_lease_s}) so that two lost heartbeats do not lose the lease; lower "
                "SPECIALISTS_WORKER_HEARTBEAT_S or raise SPECIALISTS_WORKER_LEASE_S"
            )
        urls = self.dispatch_worker_urls
        if not urls or not all(url.startswith(("http://", "https://")) for url in urls):
            raise ValueError(
                f"SPECIALISTS_DISPATCH_WORKER_URL must be one or more comma-separated http(s) URLs, got "
                f"{self.dispatch_worker_url!r}"
            )
        if self.dispatch_job_deadline_s + self.worker_cancel_grace_s >= self.dispatch_deadline_s:
            raise ValueError(
                f"dispatch_job_deadline_s ({self.dispatch_job_deadline_s:g}) plus worker_cancel_grace_s "
                f"({self.worker_cancel_grace_s:g}) must stay below dispatch_deadline_s ({self.dispatch_deadline_s}): "
                "a delivery must outlive its job; lower SPECIALISTS_DISPATCH_JOB_DEADLINE_S or raise "
                "SPECIALISTS_DISPATCH_DEADLINE_S"
            )
        if self.dispatch_retry_base_s > self.dispatch_retry_max_s:
            raise ValueError(
                "SPECIALISTS_DISPATCH_RETRY_BASE_S must not exceed SPECIALISTS_DISPATCH_RETRY_MAX_S"
            )
        if self.dispatch_backend == "cloud_tasks":
            if len(urls) != 1:
                raise ValueError(
                    "with dispatch_backend cloud_tasks, SPECIALISTS_DISPATCH_WORKER_URL names exactly one worker "
                    "endpoint (the worker service's URL; Cloud Run spreads the load)"
                )
            missing = [
                name
                for name in ("cloud_tasks_project", "cloud_tasks_location", "cloud_tasks_queue", "dispatch_service_account")
                if not getattr(self, name)
            ]
            if missing:
                raise ValueError(
                    "dispatch_backend is cloud_tasks but "
                    + ", ".join(f"SPECIALISTS_{name.upper()}" for name in missing)
                    + " is not set"
                )
            if not self.worker_oidc_verify and not self.cloud_tasks_emulator_host:
                raise ValueError(
                    "SPECIALISTS_WORKER_OIDC_VERIFY=false is only allowed on one machine (embedded dispatch or "
                    "the local emulator); with real Cloud Tasks the OIDC token must be checked"
                )
        return self

    # --- hosted RLM specialists (issue 7) -------------------------------------------
    # Owned by workers/specialist (docs/SPECIALISTS.md). Spec limits live in specs/*.yaml.
    model_routes_file: Path = Field(
        default=PROJECT_ROOT / "specs" / "demo" / "routes.toml",
        description="Model routes (TOML, JSON or YAML): named OpenAI-compatible endpoints with the NAME of the "
        "variable holding each key, or scripted routes. The default holds the scripted demo routes.",
    )
    model_routes_allow_scripted: bool = Field(
        default=False,
        description="Serve scripted (canned) model routes with an external database too; on one machine "
        "(embedded database) they are always allowed.",
    )
    specialist_checkpoint_key_min_chars: int = Field(
        default=32, ge=16, le=1024, description="Shortest checkpoint-signing key accepted at start-up."
    )
    specialist_checkpoint_key: SecretStr | None = Field(
        default=None,
        description="HMAC key that signs Monty checkpoints in PostgreSQL; a worker refuses to run rlm "
        "specialists without it. Changing it makes checkpoints of running jobs unusable: their resume fails, "
        "charged nothing.",
    )
    specialist_max_resumes: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Times one job may be resumed from its checkpoint after the worker running it died; "
        "past it (or without a checkpoint) the job is unknown.",
    )
    specialist_resume_window_s: float = Field(
        default=300.0,
        ge=1.0,
        le=86_400.0,
        description="How long after a dead worker's lease expired a later delivery may still resume its job; "
        "until then the lease sweeper leaves it, after it the job is recorded unknown.",
    )

    # --- drills (`specialists drill`, docs/OPERATIONS.md) ----------------------------------
    drill_restart_api_hook: str | None = Field(
        default=None,
        max_length=4000,
        description="`drill --target`: a shell command that restarts the API instances (say, a new revision "
        "with the same image) while a drill task runs; DRILL_API_URL names the instance. Unset: skipped.",
    )
    drill_roll_api_hook: str | None = Field(
        default=None,
        max_length=4000,
        description="`drill --target`: a shell command that rolls the API to a new revision mid-task. Unset: skipped.",
    )
    drill_restart_worker_hook: str | None = Field(
        default=None,
        max_length=4000,
        description="`drill --target`: a shell command that restarts the workers gracefully while DRILL_JOB_ID "
        "runs. Unset: skipped.",
    )
    drill_kill_worker_hook: str | None = Field(
        default=None,
        max_length=4000,
        description="`drill --target`: a shell command that kills the worker running DRILL_JOB_ID without "
        "warning (the retained unknown scenario). Unset: skipped.",
    )
    drill_hook_timeout_s: float = Field(
        default=600.0, ge=1.0, le=3600.0, description="How long a drill hook may run, and the API then take to be ready."
    )
    drill_slack_s: float = Field(
        default=2.0,
        ge=0.0,
        le=120.0,
        description="Time a drill allows above a stated bound (cancel, unknown, revocation) for network and "
        "load before it calls the bound broken.",
    )
    drill_credits: int = Field(
        default=200, ge=20, le=100_000, description="Credits granted to each customer a drill creates."
    )

    @field_validator("specialist_checkpoint_key")
    @classmethod
    def _checkpoint_key_long_enough(cls, value: SecretStr | None, info) -> SecretStr | None:
        minimum = info.data.get("specialist_checkpoint_key_min_chars", 32)
        if value is not None and len(value.get_secret_value()) < minimum:
            raise ValueError(
                f"the checkpoint key has {len(value.get_secret_value())} characters; at least {minimum} are "
                "required (SPECIALISTS_SPECIALIST_CHECKPOINT_KEY)"
            )
        return value

    @property
    def scripted_routes_allowed(self) -> bool:
        return self.embedded or self.model_routes_allow_scripted

    @property
    def embedded(self) -> bool:
        return self.database_url is None

    @property
    def dispatch_worker_urls(self) -> list[str]:
        return [url.strip() for url in self.dispatch_worker_url.split(",") if url.strip()]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
