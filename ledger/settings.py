"""The ledger's sections of the settings (``settings.keys``, ``settings.ledger``) and the schema's ceilings.

Customer keys (ledger/keys.py) and every bound a ledger caller can hit, up to the ceilings the ledger's schema
enforces (``SCHEMA_MAX_*``); ``ledger/limits.py`` gives both to the ledger. Part of the one ``Settings`` object
(core/settings.py); this module imports only core/settings_base.py.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from core.settings_base import SecretList, Section

# Ceilings the ledger's schema enforces with CHECK constraints (migrations/versions/0002_ledger.py);
# the ledger section's bounds stop at them. ledger/limits.py gives them to the ledger, and
# tests/ledger/test_schema_limits.py checks them against the live schema.
SCHEMA_MAX_CREDITS = 10**15
SCHEMA_MAX_PRIORITY = 1000
SCHEMA_MAX_PARALLEL = 100_000
SCHEMA_MAX_TEXT_CHARS = 500
SCHEMA_MAX_ID_CHARS = 200
SCHEMA_MAX_OPERATIONS_PER_BATCH = 1000  # ledger_batch refuses more (migration 0150)


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
