"""The schema is owned by Alembic, and the service refuses a schema that is not at head."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from core import db
from tests.conftest import _with_database


def test_a_migrated_database_is_accepted(engine):
    db.require_schema_at_head(engine)


def test_an_empty_database_is_refused_with_the_command_to_run(server_url):
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text('DROP DATABASE IF EXISTS "specialists_empty_check" WITH (FORCE)'))
        conn.execute(text('CREATE DATABASE "specialists_empty_check"'))
    empty = create_engine(_with_database(server_url, "specialists_empty_check"))
    try:
        with pytest.raises(db.SchemaNotAtHead) as refused:
            db.require_schema_at_head(empty)
        assert "specialists db upgrade" in str(refused.value)
        assert refused.value.code == "schema_not_at_head"
    finally:
        empty.dispose()
        with admin.connect() as conn:
            conn.execute(text('DROP DATABASE "specialists_empty_check" WITH (FORCE)'))
        admin.dispose()


def test_an_unreachable_database_names_the_setting(settings):
    broken = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/nothing", connect_args={"connect_timeout": 2})
    with pytest.raises(db.DatabaseUnavailable) as refused:
        db.require_schema_at_head(broken)
    assert "DATABASE_URL" in str(refused.value)


def test_a_password_never_reaches_printed_urls():
    assert "hunter2" not in db.redact_url("postgresql://app:hunter2@10.0.0.5:5432/ledger")
