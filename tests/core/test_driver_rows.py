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


# Statements whose answer on the driver (``core.db.hot_driver_sql_rows``) is told by the result's status, each with
# what SQLAlchemy's own execution answers: rows with their names, no row, a row of no column, and no rows at all.
_ANSWERS = [
    ("SELECT %(a)s::int AS first, 'x' AS second", [{"first": 1, "second": "x"}]),
    ("SELECT %(a)s::int AS n FROM generate_series(1, 0)", []),  # rows of a SELECT, none of them
    ("SELECT FROM generate_series(1, %(a)s)", [{}]),  # one row of no column: still rows
    ("UPDATE hot_answers SET n = n + %(a)s", []),  # COMMAND_OK: no rows
    ("UPDATE hot_answers SET n = n + %(a)s RETURNING n AS after", [{"after": 11}]),
    ("DO $$ BEGIN PERFORM 1; END $$", []),
]


@pytest.mark.parametrize(("sql", "rows"), _ANSWERS)
def test_a_hot_statement_answers_the_rows_and_names_sqlalchemy_answers(engine: Engine, sql: str, rows) -> None:
    """``_driver_execute`` reads rows when the result's status says it has them (issue 44: not by building
    ``cursor.description``): the same rows and names as ``conn.exec_driver_sql``, and none for a statement that
    returns none."""
    from tests.statements import Statements

    with engine.connect() as conn:
        conn.execute(text("CREATE TEMPORARY TABLE hot_answers (n int)"))
        conn.execute(text("INSERT INTO hot_answers VALUES (10)"))
        with Statements(engine) as seen:
            on_driver = db.hot_driver_sql_rows(conn, sql, {"a": 1})
        assert seen.executed == []  # it ran on the driver, not through SQLAlchemy
        conn.rollback()
        conn.execute(text("CREATE TEMPORARY TABLE hot_answers (n int)"))
        conn.execute(text("INSERT INTO hot_answers VALUES (10)"))
        result = conn.exec_driver_sql(sql, {"a": 1})
        by_sqlalchemy = [dict(row) for row in result.mappings()] if result.returns_rows else []
        conn.rollback()
    assert [dict(row) for row in on_driver] == by_sqlalchemy == rows
    assert all(list(row) == list(expected) for row, expected in zip(on_driver, rows))  # names in their order


def test_a_failed_hot_statement_raises_sqlalchemys_error_and_its_transaction_goes_on_after_a_rollback(
        engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))  # in SQLAlchemy's transaction: the driver is used
        with pytest.raises(DBAPIError) as raised:
            db.hot_driver_sql_rows(conn, RAISES_SPADM, {})
        assert raised.value.orig.sqlstate == "SPADM" and not raised.value.connection_invalidated
        conn.rollback()
        conn.execute(text("SELECT 1"))
        assert db.hot_driver_sql_rows(conn, "SELECT %(a)s::int AS a", {"a": 2}) == [{"a": 2}]
