"""core.db.driver_rows: the edge's hot statements on the pooled psycopg connection itself, failing as SQLAlchemy's
``conn.execute`` would (the admission reads its fallback's SQLSTATE, the pool discards a broken connection)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from core import db
from tests.rlm.holds import wait_until

pytestmark = [pytest.mark.timeout(30), pytest.mark.anyio]

RAISES_SPADM = "DO $$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = 'SPADM'; END $$"


@pytest.fixture
async def autocommit(database_url, settings):
    engine = db.make_async_engine(database_url, settings)
    yield engine.execution_options(isolation_level="AUTOCOMMIT")
    await engine.dispose()


async def test_a_statement_sent_on_the_driver_answers_its_rows_as_tuples(autocommit):
    async with autocommit.connect() as conn:
        assert await db.driver_rows(conn, "SELECT %(a)s::int, %(b)s::text", {"a": 1, "b": "x"}) == [(1, "x")]


async def test_a_raised_sqlstate_is_sqlalchemys_error_and_the_connection_stays_usable(autocommit):
    async with autocommit.connect() as conn:
        with pytest.raises(DBAPIError) as raised:
            await db.driver_rows(conn, RAISES_SPADM, {})
        assert raised.value.orig.sqlstate == "SPADM"
        assert not raised.value.connection_invalidated
        assert await db.driver_rows(conn, "SELECT 1", {}) == [(1,)]


async def test_a_connection_the_server_ended_fails_as_invalidated_and_is_discarded(autocommit, engine: Engine):
    async with autocommit.connect() as conn:
        [(pid,)] = await db.driver_rows(conn, "SELECT pg_backend_pid()", {})
        with engine.connect() as other:
            assert other.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()

        def gone() -> bool:
            with engine.connect() as other:
                return other.execute(text("SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = :p)"),
                                     {"p": pid}).scalar_one()

        wait_until(gone, f"backend {pid} to end")
        with pytest.raises(DBAPIError) as raised:
            await db.driver_rows(conn, "SELECT 1", {})
        assert raised.value.connection_invalidated
        assert conn.invalidated
