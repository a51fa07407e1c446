"""The database refuses exactly the job ids the service refuses (migration 0296's CHECK on ``job_claims`` and
``specialist_runs``), and stepping back over 0296 gives back 0020's and 0070's CHECK."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from sqlalchemy import Engine, text

from workers.dispatch.base import JOB_ID_RE

pytestmark = pytest.mark.timeout(120)

_CLASS = "AZaz09_.:-"
# Ids near the 200-character bound, made of the class and of what is next to it: a space, a slash, a newline (which
# a `$` in other regex dialects matches before), a letter outside ASCII, a NUL-free control character.
job_ids = st.one_of(
    st.text(alphabet=st.sampled_from(_CLASS + " /\n\té\x7f"), max_size=205),
    st.integers(min_value=0, max_value=205).map(lambda n: "a" * n),
    st.integers(min_value=195, max_value=205).flatmap(
        lambda n: st.text(alphabet=st.sampled_from(_CLASS + "\n"), min_size=n, max_size=n)),
)


def _stored(conn, table: str, job_id: str) -> bool:
    """Whether ``table``'s CHECK lets a row with this id in (in a savepoint, rolled back)."""
    insert = {
        "job_claims": "INSERT INTO job_claims (job_id, state, fencing_token, claims, lease_expires_at) "
                      "VALUES (:j, 'running', 1, 1, now())",
        "specialist_runs": "INSERT INTO specialist_runs (job_id, specialist_id, route, pricing, tariff_credits, "
                           "session_id) VALUES (:j, 's', 'r', 'fixed', 1, 'session')",
    }[table]
    savepoint = conn.begin_nested()
    try:
        conn.execute(text(insert), {"j": job_id})
    except Exception as refused:
        savepoint.rollback()
        assert "job_id_check" in str(refused), refused
        return False
    savepoint.rollback()
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job_id=job_ids)
def test_the_database_stores_a_job_id_exactly_when_the_service_accepts_it(engine: Engine, job_id: str) -> None:
    accepted = JOB_ID_RE.fullmatch(job_id) is not None
    with engine.connect() as conn:
        for table in ("job_claims", "specialist_runs"):
            assert _stored(conn, table, job_id) == accepted, (table, job_id)


def test_stepping_back_over_0296_restores_the_bounded_checks(server_url: str) -> None:
    from alembic import command
    from sqlalchemy import create_engine

    from core import db
    from tests.conftest import empty_database

    checks = text("SELECT conrelid::regclass::text, pg_get_constraintdef(oid), convalidated FROM pg_constraint "
                  "WHERE conname IN ('job_claims_job_id_check', 'specialist_runs_job_id_check') ORDER BY 1")
    with empty_database(server_url, "specialists_job_id_check_migration") as url:
        probe = create_engine(url)
        try:
            db.upgrade(url, "0295")
            with probe.connect() as conn:
                before = conn.execute(checks).all()
            assert [table for table, _, _ in before] == ["job_claims", "specialist_runs"]
            db.upgrade(url, "0296")
            with probe.connect() as conn:
                after = conn.execute(checks).all()
            assert all("{1,200}" not in definition and valid for _, definition, valid in after)
            command.downgrade(db.alembic_config(url), "0295")
            with probe.connect() as conn:
                assert conn.execute(checks).all() == before
        finally:
            probe.dispose()
