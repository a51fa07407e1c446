"""The credit ledger's limits: its section of the settings, and the ceilings its schema enforces.

Every bound a caller can hit is a field of ``LedgerSettings`` (``settings.ledger``, read from
``SPECIALISTS_LEDGER_*``; it lives in core/settings.py with the other sections). The errors that
enforce them name the variable to change. The hard ceilings that the database schema itself
enforces with CHECK constraints are the ``SCHEMA_MAX_*`` constants; they are defined beside the
section, whose bounds stop at them, and tests/ledger/test_schema_limits.py checks each one against
the live schema.
"""

from __future__ import annotations

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

__all__ = [
    "SCHEMA_MAX_CREDITS",
    "SCHEMA_MAX_ID_CHARS",
    "SCHEMA_MAX_OPERATIONS_PER_BATCH",
    "SCHEMA_MAX_PARALLEL",
    "SCHEMA_MAX_PRIORITY",
    "SCHEMA_MAX_TEXT_CHARS",
    "LedgerSettings",
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
