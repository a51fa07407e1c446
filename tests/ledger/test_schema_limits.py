"""Every limit is named once: the CHECK constraints of the live schema hold the Python constants' numbers.

The schema (migrated to head by the suite's fixtures) is read back from pg_constraint, so changing a
bound in a migration without its constant, or the constant without a migration, fails here.
"""

from __future__ import annotations

import re

import pytest
from sqlalchemy import text

from ledger import keys, statements
from taskstate import outbox
from ledger.limits import (
    SCHEMA_MAX_CREDITS,
    SCHEMA_MAX_ID_CHARS,
    SCHEMA_MAX_PARALLEL,
    SCHEMA_MAX_PRIORITY,
    SCHEMA_MAX_TEXT_CHARS,
)

# (table, column, the constant its upper bound must equal). The column's CHECK is found by what it names.
UPPER_BOUNDS = [
    ("ledger_grants", "credits", SCHEMA_MAX_CREDITS),
    ("ledger_grants", "priority", SCHEMA_MAX_PRIORITY),
    ("ledger_grants", "max_parallel", SCHEMA_MAX_PARALLEL),
    ("ledger_grants", "length(idempotency_key)", SCHEMA_MAX_ID_CHARS),
    ("ledger_grants", "length(operator)", SCHEMA_MAX_ID_CHARS),
    ("ledger_grants", "length(reason)", SCHEMA_MAX_TEXT_CHARS),
    ("ledger_accounts", "max_parallel", SCHEMA_MAX_PARALLEL),
    ("api_keys", "length(label)", keys.MAX_LABEL_CHARS),
    ("api_keys", "length(revoked_reason)", SCHEMA_MAX_TEXT_CHARS),
    ("dispatch_outbox", "length(trace_parent)", outbox.MAX_TRACE_PARENT_CHARS),
]
# (table, the Python pattern its CHECK must use word for word)
PATTERNS = [
    ("customers", keys.CUSTOMER_RE.pattern),
    ("api_keys", keys.TIER_RE.pattern),
    ("ledger_entitlements", statements.SKILL_RE.pattern),
]


def check_constraints(engine, table: str) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                    "WHERE contype = 'c' AND conrelid = CAST(:t AS regclass)"
                ),
                {"t": table},
            ).scalars()
        )


def upper_bounds(definitions: list[str], expression: str) -> set[int]:
    """Every number the CHECKs compare ``expression`` to from above (``<= n``, or the top of ``BETWEEN``)."""
    found = set()
    subject = re.escape(expression)
    number = r"'?(\d+)'?(?:::\w+)?"
    for definition in definitions:
        found |= {int(n) for n in re.findall(rf"\(?{subject}\)?\s*<=\s*\(?{number}", definition)}
        found |= {int(n) for n in re.findall(rf"{number}\)?\s*>=\s*\(?{subject}\)?", definition)}
    return found


@pytest.mark.parametrize(("table", "expression", "constant"), UPPER_BOUNDS)
def test_each_check_bound_equals_its_python_constant(engine, table, expression, constant):
    bounds = upper_bounds(check_constraints(engine, table), expression)
    assert bounds == {constant}, (
        f"{table}: the CHECK on {expression} allows at most {sorted(bounds)}; the Python constant says {constant}"
    )


@pytest.mark.parametrize(("table", "pattern"), PATTERNS)
def test_each_check_pattern_equals_its_python_pattern(engine, table, pattern):
    definitions = check_constraints(engine, table)
    assert any(pattern in definition for definition in definitions), (table, pattern, definitions)


def test_the_ledger_settings_stop_at_the_schema_ceilings():
    from core.settings import LedgerSettings

    ceilings = {  # every number of the section has a ceiling (the verify database's URL is not a number)
        name: next(meta.le for meta in field.metadata if getattr(meta, "le", None) is not None)
        for name, field in LedgerSettings.model_fields.items()
        if field.annotation is int
    }
    assert ceilings["max_credits_per_operation"] == SCHEMA_MAX_CREDITS
    assert ceilings["max_reason_chars"] == SCHEMA_MAX_TEXT_CHARS
    assert ceilings["max_job_id_chars"] == ceilings["max_fingerprint_chars"] == SCHEMA_MAX_ID_CHARS
    assert ceilings["max_idempotency_key_chars"] == SCHEMA_MAX_ID_CHARS
    assert ceilings["default_max_parallel"] == SCHEMA_MAX_PARALLEL
    assert ceilings["default_priority"] == SCHEMA_MAX_PRIORITY
