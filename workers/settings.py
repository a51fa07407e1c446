"""The workers' sections of the settings: dispatch (``settings.dispatch``) and the worker (``settings.worker``).

docs/WORKERS.md explains each bound. Part of the one ``Settings`` object (core/settings.py), whose root checks the
rules that span these and other sections; this module imports only core/settings_base.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from core.settings_base import SecretList, Section

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
    default_weight: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="A customer's weight in the fair order of worker slots when an operator set none (`specialists "
        "customers set --weight`): while customers wait, one of weight w holds w slots for each slot of a weight-1 "
        "customer.",
    )
    relay_max_in_flight: int = Field(
        default=40,
        ge=1,
        le=100_000,
        description="Cloud Tasks: jobs the relay keeps enqueued or running at most (the workers' slots: workers x "
        "SPECIALISTS_WORKER_MAX_CONCURRENT_JOBS); the rest wait in the outbox, where the fair order picks the next.",
    )
    reserved_slots: int = Field(
        default=1,
        ge=0,
        le=100_000,
        description="Worker slots no single customer may fill: one customer holds at most the slots the dispatcher "
        "knows (embedded: workers x SPECIALISTS_WORKER_MAX_CONCURRENT_JOBS; Cloud Tasks: "
        "SPECIALISTS_DISPATCH_RELAY_MAX_IN_FLIGHT) minus this many, so the next customer's job starts at once; "
        "0 turns it off; must be below that capacity, and is off when the capacity is 1.",
    )
    served_refresh_s: float = Field(
        default=30.0,
        ge=1.0,
        le=3600.0,
        description="Embedded: how often a dispatcher asks its workers (their /readyz) which specialists they serve; "
        "it takes only jobs of those (any, until a worker answered).",
    )
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
        description="On shutdown (SIGTERM, SIGINT), how long running jobs may finish; jobs still running then are "
        "recorded unknown as the worker stops, not after their lease.",
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
    job_cpu_share: Literal["auto", "nice", "off"] = Field(
        default="auto",
        description="How a job's processes share the worker's CPU, process isolation only (workers/cpu_share.py): "
        "a customer's jobs on the worker together weigh what one job does. `auto` puts each job in a cgroup of its "
        "own inside its customer's (v2, else v1) where the worker may create one, else uses scheduling priority "
        "(nice: n jobs of one customer at nice k, 1.25^k ~= n); `nice` always uses priority; `off` leaves jobs as "
        "the worker is.",
    )
    job_cpu_weight: int = Field(
        default=100, ge=1, le=10_000,
        description="A job's cgroup CPU weight (cgroup v2 cpu.weight; v1 cpu.shares is 10.24 times it) until it "
        "has used SPECIALISTS_WORKER_JOB_CPU_DEMOTE_AFTER_S: every job the same share, however many processes it runs. "
        "Also one customer's: its group weighs the least of this and its jobs' weights together.",
    )
    job_cpu_demote_after_s: float = Field(
        default=1.0, ge=0.0, le=3600.0,
        description="CPU seconds (the job's processes together) after which a job's share is lowered to "
        "SPECIALISTS_WORKER_JOB_CPU_DEMOTED_WEIGHT (cgroup) or SPECIALISTS_WORKER_JOB_CPU_DEMOTED_NICE, so that a "
        "spinning job yields to another customer's short one.",
    )
    job_cpu_demoted_weight: int = Field(
        default=1, ge=1, le=10_000, description="A job's cgroup CPU weight once it is past its demotion threshold."
    )
    job_cpu_demoted_nice: int = Field(
        default=19, ge=0, le=19,
        description="The nice value of a job's processes once it is past its demotion threshold, where no cgroup "
        "can be made (SPECIALISTS_WORKER_JOB_CPU_SHARE=nice, or auto without cgroups); its customer's value for its "
        "count of jobs if that is higher.",
    )
    job_max_cpu_s: float = Field(
        default=120.0, ge=0.0, le=86_400.0,
        description="CPU seconds one job's processes may use together when its spec states no limits.max_cpu_s; "
        "0: no cap. A job past it fails with job_cpu_exceeded, and the worker and its other jobs go on.",
    )
    job_cpu_poll_s: float = Field(
        default=0.25, ge=0.01, le=10.0,
        description="How often a job's CPU meter reads its processes' CPU time (shorter near the cap): with the "
        "worker's cores, the bound of how far past its cap a job can go.",
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
        default=2.0,
        ge=0.05,
        le=600.0,
        description="How often a worker writes that it is alive, with the specialists it serves (worker_beats); "
        "at most half of SPECIALISTS_HEALTH_WORKER_LIVE_S. Every worker and dispatcher of a deployment runs with "
        "the same value: the dispatchers judge a worker dead by it (SPECIALISTS_WORKER_DEAD_AFTER_BEATS).",
    )
    dead_after_beats: int = Field(
        default=5,
        ge=0,
        le=1000,
        description="A worker whose last beat is older than this many SPECIALISTS_WORKER_BEAT_S died without a word "
        "(SIGKILL, a lost machine): the dispatchers' sweeper records its running jobs unknown at once instead of "
        "after their leases (SPECIALISTS_WORKER_LEASE_S). At least 3, so two late beats never cost a live worker "
        "its jobs; 0: off, a dead worker's jobs wait for their leases.",
    )

    @property
    def dead_after_s(self) -> float | None:
        """How old a worker's last beat is when the sweeper takes it for dead; None when that is off."""
        return self.dead_after_beats * self.beat_s if self.dead_after_beats else None

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
        if self.job_cpu_demoted_weight > self.job_cpu_weight:
            raise ValueError(
                f"worker_job_cpu_demoted_weight ({self.job_cpu_demoted_weight}) must be at most worker_job_cpu_weight "
                f"({self.job_cpu_weight}), or a job that spins past SPECIALISTS_WORKER_JOB_CPU_DEMOTE_AFTER_S gets a "
                "larger share of the CPU, not a smaller one; lower SPECIALISTS_WORKER_JOB_CPU_DEMOTED_WEIGHT or raise "
                "SPECIALISTS_WORKER_JOB_CPU_WEIGHT"
            )
        if 0 < self.dead_after_beats < 3:
            raise ValueError(
                f"worker_dead_after_beats ({self.dead_after_beats}) must be 0 (off) or at least 3, or one or two "
                "late beats of a live worker cost it its running jobs; raise SPECIALISTS_WORKER_DEAD_AFTER_BEATS"
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
