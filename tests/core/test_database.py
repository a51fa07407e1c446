"""The schema is owned by Alembic, and the service refuses a schema that is not at head."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from core import db
from core.settings import PROJECT_ROOT
from tests import http_calls
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


# --- a schema ahead of the code: a release migrates before its code takes traffic -------------------------

HEAD = db.head_revision()


def test_the_schema_verdict_follows_what_each_later_migration_declared():
    expand = {"9990": (HEAD, True), "9991": ("9990", True)}
    assert db.schema_problem(HEAD, HEAD, {}) is None
    assert db.schema_problem("9991", HEAD, expand) is None  # two expand-only migrations past this code
    contract = {**expand, "9992": ("9991", False)}
    assert "9992, which older code cannot run on" in db.schema_problem("9992", HEAD, contract)
    assert "specialists db upgrade" in db.schema_problem("0070", HEAD, expand)  # behind: upgrade it
    assert "specialists db upgrade" in db.schema_problem("0999", HEAD, expand)  # unknown: nothing declared
    assert "empty" in db.schema_problem(None, HEAD, expand)
    looping = {"9990": ("9991", True), "9991": ("9990", True)}
    assert db.schema_problem("9990", HEAD, looping) is not None  # a corrupt chain never passes


def test_code_keeps_serving_and_starting_on_a_schema_migrated_past_it_only_while_every_step_serves_it(
    server_url, tmp_path
):
    from tests.app.conftest import start_edge, stop_edge
    from tests.workers.system import drop_database, fresh_database

    url = fresh_database(server_url)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:  # what the next release's expand-only migration leaves
            conn.execute(text("INSERT INTO schema_compatibility VALUES ('9990', :h, true, 'adds a column', now())"),
                         {"h": HEAD})
            conn.execute(text("UPDATE alembic_version SET version_num = '9990'"))
        db.require_schema_at_head(engine)
        edge = start_edge(url, PROJECT_ROOT / "specs", tmp_path, "previous-revision")  # a new instance starts
        try:
            assert http_calls.get(f"{edge.url}/readyz").json() == {"status": "ready", "schema": "9990"}
            with engine.begin() as conn:  # then a contracting one
                conn.execute(text("INSERT INTO schema_compatibility VALUES ('9991', '9990', false, 'drops a column', "
                                  "now())"))
                conn.execute(text("UPDATE alembic_version SET version_num = '9991'"))
            ready = http_calls.get(f"{edge.url}/readyz")
            assert ready.status_code == 503 and ready.json()["reason"] == "schema_not_at_head"
        finally:
            stop_edge(edge)
        with pytest.raises(db.SchemaNotAtHead) as refused:
            db.require_schema_at_head(engine)
        assert "deploy the code of the schema's revision" in str(refused.value)
    finally:
        engine.dispose()
        drop_database(server_url, url)


def test_an_index_a_failed_online_build_left_invalid_is_built_again_when_the_migration_reruns(server_url):
    """CREATE INDEX CONCURRENTLY that fails half-way leaves an INVALID index of its name; rerunning the revision
    (migrations.compat.create_index_online) must build the real one, not keep the broken one as "exists"."""
    from alembic import command

    from tests.workers.system import drop_database, fresh_database

    url = fresh_database(server_url)
    engine = create_engine(url)
    try:
        command.downgrade(db.alembic_config(url), "0190")  # before 0200, which builds ledger_settlements_customer
        with engine.begin() as conn:  # what a build that failed leaves: an invalid index of that name
            conn.execute(text("CREATE INDEX ledger_settlements_customer ON ledger_settlements (job_id)"))
            conn.execute(text("UPDATE pg_index SET indisvalid = false "
                              "WHERE indexrelid = 'ledger_settlements_customer'::regclass"))
        db.upgrade(url, "0200")  # the rerun (0298 drops this index again: a copy of ledger_settlements_customer_at's)
        with engine.connect() as conn:
            valid, definition = conn.execute(text(
                "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i "
                "WHERE i.indexrelid = 'ledger_settlements_customer'::regclass")).one()
        assert valid and definition.endswith("(customer_id)"), definition
        db.upgrade(url)
    finally:
        engine.dispose()
        drop_database(server_url, url)


def test_the_large_columns_are_compressed_with_lz4_where_the_server_has_it_and_keep_pglz_where_not(engine):
    """Migration 0294 (issue 44): a hosted review's message, its task's history and events, and a run's checkpoints
    and calls are written with lz4 (inserting a 328 KiB message: 2.1 ms against pglz's 10.0). A server built
    without lz4 (the embedded PostgreSQL's build) keeps pglz, and the migration still reached head."""
    import importlib

    import psycopg

    columns = importlib.import_module("migrations.versions.0294_lz4_large_columns").COLUMNS
    with engine.connect() as conn:
        try:
            with conn.begin_nested():
                conn.execute(text("CREATE TEMPORARY TABLE lz4_probe (value bytea COMPRESSION lz4)"))
            has_lz4 = True
        except Exception as exc:  # noqa: BLE001 - the server's own refusal, checked just below
            assert isinstance(getattr(exc, "orig", None), psycopg.errors.FeatureNotSupported), exc
            has_lz4 = False
        found = {(table, column): method for table, column, method in conn.execute(text(
            "SELECT c.relname, a.attname, a.attcompression FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "WHERE c.relnamespace = 'public'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped"))}
    assert set(columns) <= set(found), "a column 0294 names is not in the schema"
    assert {found[column] for column in columns} == {"l" if has_lz4 else ""}
