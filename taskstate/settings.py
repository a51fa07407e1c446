"""The sections of the settings that taskstate's shared reads and tables serve: push (``settings.push``) and
health (``settings.health``).

Push notifications are configured at the edge and delivered by the dispatchers (taskstate/push.py owns their
tables); health's thresholds judge ``taskstate/reads.py``'s ``service_facts`` for the edge's gauges, the
dispatchers' and `specialists health`. Part of the one ``Settings`` object (core/settings.py); this module imports
only core/settings_base.py.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from core.settings_base import SecretList, Section

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
