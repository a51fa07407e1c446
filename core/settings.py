"""The service's one settings object, read from the environment, with a section per room.

Nothing else in the service reads ``os.environ``. Every limit is a named field
with a default that works on one machine, validated when the settings load.
Each section is a pydantic-settings class (``core.settings_base.Section``) that
reads its own variables (the names are in docs/SETTINGS.md, rendered from these
classes by core/settings_doc.py), and lives beside the room that reads it:

- here: ``database`` (core/db.py), ``log``, ``telemetry`` (core/telemetry.py);
- ``ledger/settings.py``: ``keys``, ``ledger`` and the schema's ceilings (``SCHEMA_MAX_*``);
- ``app/settings.py``: ``edge``;
- ``taskstate/settings.py``: ``push``, ``health``;
- ``workers/settings.py``: ``dispatch``, ``worker``;
- ``workers/hosted_rlm/settings.py``: ``hosted``;
- ``ops/settings.py``: ``serve``, ``drill``; ``ops/console/settings.py``: ``console``.

Those modules import only core/settings_base.py, so this one gathers them without
a cycle (the one import of core into the rooms, ``tests/test_architecture.py``).
``Settings`` holds one of each and checks the rules that span two sections; every
section class is importable from here too.

In tests, give a section as a dict of its fields: ``Settings(database={"url": url})``
reads the rest of that section, and every other section, from the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import SettingsConfigDict

from app.settings import EdgeSettings
from core.settings_base import PROJECT_ROOT, SecretList, Section
from ledger.settings import (
    SCHEMA_MAX_CREDITS,
    SCHEMA_MAX_ID_CHARS,
    SCHEMA_MAX_OPERATIONS_PER_BATCH,
    SCHEMA_MAX_PARALLEL,
    SCHEMA_MAX_PRIORITY,
    SCHEMA_MAX_TEXT_CHARS,
    KeySettings,
    LedgerSettings,
)
from ops.console.settings import ConsoleSettings
from ops.settings import DrillSettings, ServeSettings
from taskstate.settings import HealthSettings, PushSettings
from workers.hosted_rlm.settings import CheckpointSync, HostedSettings
from workers.settings import MIN_JOB_MEMORY_BYTES, DispatchSettings, WorkerSettings

__all__ = [
    "MIN_JOB_MEMORY_BYTES",
    "PROJECT_ROOT",
    "SCHEMA_MAX_CREDITS",
    "SCHEMA_MAX_ID_CHARS",
    "SCHEMA_MAX_OPERATIONS_PER_BATCH",
    "SCHEMA_MAX_PARALLEL",
    "SCHEMA_MAX_PRIORITY",
    "SCHEMA_MAX_TEXT_CHARS",
    "SECTIONS",
    "CheckpointSync",
    "ConsoleSettings",
    "DatabaseSettings",
    "DispatchSettings",
    "DrillSettings",
    "EdgeSettings",
    "HealthSettings",
    "HostedSettings",
    "KeySettings",
    "LedgerSettings",
    "LogSettings",
    "PushSettings",
    "SecretList",
    "Section",
    "ServeSettings",
    "Settings",
    "TelemetrySettings",
    "WorkerSettings",
    "describe_invalid",
]


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
        capacity = self.dispatch_capacity
        if capacity > 1 and dispatch.reserved_slots >= capacity:
            raise ValueError(
                f"SPECIALISTS_DISPATCH_RESERVED_SLOTS ({dispatch.reserved_slots}) must be below the worker slots the "
                f"dispatcher knows ({capacity}: {self._capacity_source}), or no customer could take a job; lower "
                "SPECIALISTS_DISPATCH_RESERVED_SLOTS (0 turns the reserve off)"
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
    def dispatch_capacity(self) -> int:
        """The worker slots the dispatcher knows: what SPECIALISTS_DISPATCH_RESERVED_SLOTS is kept free out of."""
        if self.dispatch.backend == "cloud_tasks":
            return self.dispatch.relay_max_in_flight
        return self.worker.max_concurrent_jobs * len(self.dispatch.worker_urls)

    @property
    def _capacity_source(self) -> str:
        if self.dispatch.backend == "cloud_tasks":
            return "SPECIALISTS_DISPATCH_RELAY_MAX_IN_FLIGHT"
        return (f"SPECIALISTS_WORKER_MAX_CONCURRENT_JOBS {self.worker.max_concurrent_jobs} x "
                f"{len(self.dispatch.worker_urls)} SPECIALISTS_DISPATCH_WORKER_URL")

    @property
    def customer_max_slots(self) -> int | None:
        """The most slots one customer's jobs may hold (None: no cap): the capacity less the reserve, which is off
        at 0 and when the capacity is 1 (a cap of 0 would start nothing)."""
        capacity, reserved = self.dispatch_capacity, self.dispatch.reserved_slots
        return capacity - reserved if reserved and capacity > 1 else None

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
