"""The credit ledger's limits: its section of the settings, and the ceilings its schema enforces.

Every bound a caller can hit is a field of ``LedgerSettings`` (``settings.ledger``, read from
``SPECIALISTS_LEDGER_*``; defined in ledger/settings.py, part of the one settings object). The errors that
enforce them name the variable to change. The hard ceilings that the database schema itself
enforces with CHECK constraints are the ``SCHEMA_MAX_*`` constants; they are defined beside the
section, whose bounds stop at them, and tests/ledger/test_schema_limits.py checks each one against
the live schema.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import lru_cache

from core.settings import (
    SCHEMA_MAX_CREDITS,
    SCHEMA_MAX_ID_CHARS,
    SCHEMA_MAX_OPERATIONS_PER_BATCH,
    SCHEMA_MAX_PARALLEL,
    SCHEMA_MAX_PRIORITY,
    SCHEMA_MAX_TEXT_CHARS,
    LedgerSettings,
)
from ledger.errors import LedgerInputInvalid

__all__ = [
    "SCHEMA_MAX_CREDITS",
    "SCHEMA_MAX_ID_CHARS",
    "SCHEMA_MAX_OPERATIONS_PER_BATCH",
    "SCHEMA_MAX_PARALLEL",
    "SCHEMA_MAX_PRIORITY",
    "SCHEMA_MAX_TEXT_CHARS",
    "LedgerSettings",
    "check_period",
    "default_limits",
    "env_name",
]


@lru_cache(maxsize=1)
def default_limits() -> LedgerSettings:
    """The ledger's section read from the environment, for callers that pass none (``settings.ledger``)."""
    return LedgerSettings()


def env_name(field: str) -> str:
    """The environment variable that sets a limit, for error messages."""
    return LedgerSettings.env_name(field)


def check_period(since: datetime, until: datetime, limits: LedgerSettings) -> None:
    """A usage period (credits charged, tasks by outcome): instants with a zone, ``since`` before ``until``, at most
    ``max_usage_days`` long (``LedgerInputInvalid`` naming SPECIALISTS_LEDGER_MAX_USAGE_DAYS)."""
    if since.tzinfo is None or until.tzinfo is None:
        raise LedgerInputInvalid("a usage period's instants carry a time zone")
    if not since < until:
        raise LedgerInputInvalid(f"a usage period ends after it starts; got {since.isoformat()} to {until.isoformat()}")
    if until - since > timedelta(days=limits.max_usage_days):
        raise LedgerInputInvalid(
            f"the period is {(until - since) / timedelta(days=1):g} days; a usage read covers at most "
            f"{limits.max_usage_days} ({env_name('max_usage_days')})"
        )
