"""The credit ledger's named limits, read from the environment (``SPECIALISTS_LEDGER_*``) and validated at load.

Every bound a caller can hit is here with a default that works on one machine; the
errors that enforce them name the variable to change. Hard ceilings that the
database schema itself enforces are the module constants below.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# Ceilings the schema enforces with CHECK constraints (see migrations/versions/0002_ledger.py).
SCHEMA_MAX_CREDITS = 10**15
SCHEMA_MAX_PRIORITY = 1000
SCHEMA_MAX_PARALLEL = 100_000
SCHEMA_MAX_TEXT_CHARS = 500
SCHEMA_MAX_ID_CHARS = 200


class LedgerLimits(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECIALISTS_LEDGER_", extra="ignore")

    max_credits_per_operation: int = Field(
        default=10**12,
        ge=1,
        le=SCHEMA_MAX_CREDITS,
        description="Largest grant, reservation, charge or adjustment, in credits.",
    )
    max_skills_per_grant: int = Field(default=64, ge=1, le=1000, description="Skill entitlements one grant may name.")
    max_reason_chars: int = Field(
        default=500, ge=1, le=SCHEMA_MAX_TEXT_CHARS, description="Longest reason on a settlement, adjustment or reconcile."
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
        ge=0,
        le=SCHEMA_MAX_PARALLEL,
        description="Open reservations a new customer may hold at once, until a grant sets max_parallel.",
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


@lru_cache(maxsize=1)
def default_limits() -> LedgerLimits:
    return LedgerLimits()


def env_name(field: str) -> str:
    """The environment variable that sets a limit, for error messages."""
    return "SPECIALISTS_LEDGER_" + field.upper()
