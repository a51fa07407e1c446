"""The task state's bounds on the text it writes are the schema's CHECK bounds (read back from pg_constraint)."""

from __future__ import annotations

import pytest

from taskstate import claims, outbox
from tests.ledger.test_schema_limits import check_constraints, upper_bounds

UPPER_BOUNDS = [
    ("job_claims", "length(worker_id)", claims.MAX_WORKER_ID_CHARS),
    ("job_claims", "length(cancel_reason)", claims.MAX_REASON_CHARS),
    ("dispatch_outbox", "length(last_error)", outbox.MAX_LAST_ERROR_CHARS),
    ("dispatch_weights", "weight", outbox.MAX_WEIGHT),
    ("dispatch_weights", "length(reason)", outbox.MAX_WEIGHT_REASON_CHARS),
    ("dispatch_weights", "length(changed_by)", outbox.MAX_CHANGED_BY_CHARS),
]


@pytest.mark.parametrize(("table", "expression", "constant"), UPPER_BOUNDS)
def test_each_check_bound_equals_its_python_constant(engine, table, expression, constant):
    bounds = upper_bounds(check_constraints(engine, table), expression)
    assert bounds == {constant}, (
        f"{table}: the CHECK on {expression} allows at most {sorted(bounds)}; the Python constant says {constant}"
    )
