"""The edge's pool of single statements (``app.assembly.edge_engine(autocommit=True)``): its connections are in
autocommit from their start, a checkout sends nothing, and a statement psycopg prepared stays prepared from one
checkout to the next (psycopg forgets its prepared statements on a ROLLBACK; this pool never sends one). A single
statement keeps its connection for the next (``core.db.StatementPool``): up to the pool's size, each checked at
its use, all closed by the engine's ``dispose``."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
from sqlalchemy import event
from sqlalchemy.exc import DataError

from app.assembly import edge_engine
from core import db
from taskstate.notify import libpq_url
from tests.pg_wire import StatementCounter

pytestmark = [pytest.mark.timeout(60), pytest.mark.anyio]

# psycopg runs a statement unprepared this many times on a connection (``prepare_threshold``'s default), then
# prepares it and runs it prepared from then on.
UNPREPARED_USES = 5
_PROBE = "SELECT %(x)s::int AS probe"


async def test_a_statement_stays_prepared_from_one_checkout_of_the_autocommit_pool_to_the_next(database_url, settings):
    counter = StatementCounter(database_url)
    engine = edge_engine(counter.url, settings, autocommit=True)
    try:
        assert db.in_autocommit(engine)
        async with engine.connect() as conn:  # the pool's first connection, and the dialect's first questions
            backend = (await db.driver_rows(conn, "SELECT pg_backend_pid()", {}))[0][0]
        _, trips_before, _, _ = counter.snapshot()
        prepares_before = counter.prepares
        uses = UNPREPARED_USES + 3
        for use in range(uses):
            async with engine.connect() as conn:  # one connection, checked out and returned each time
                assert await db.driver_rows(conn, _PROBE, {"x": use}) == [(use,)]
        _, trips_after, _, _ = counter.snapshot()
        # One round trip a statement and one for its preparation, once: no SET, no BEGIN, no ROLLBACK at a checkout.
        assert (trips_after - trips_before, counter.prepares - prepares_before) == (uses + 1, 1)
        async with engine.connect() as conn:
            [(same_backend, generic_plans, custom_plans)] = await db.driver_rows(
                conn,
                "SELECT pg_backend_pid(), generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement = %(text)s",
                {"text": _PROBE.replace("%(x)s", "$1")},
            )
        assert same_backend == backend
        # Run prepared at every use after the first five, each in a checkout of its own.
        assert generic_plans + custom_plans == uses - UNPREPARED_USES, (generic_plans, custom_plans)
    finally:
        await engine.dispose()
        counter.close()


async def test_the_pool_of_transactions_is_not_in_autocommit(database_url, settings):
    engine = edge_engine(database_url, settings)
    try:
        assert not db.in_autocommit(engine)
        async with engine.connect() as conn:
            assert not (await conn.get_raw_connection()).driver_connection.autocommit
    finally:
        await engine.dispose()


async def test_a_connection_returned_in_a_transaction_is_discarded_not_handed_out_again(database_url, settings):
    engine = edge_engine(database_url, settings, autocommit=True)
    try:
        async with engine.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            first = (await db.driver_rows(conn, "SELECT pg_backend_pid()", {}))[0][0]
            await driver.execute("BEGIN")  # what no caller of this pool does: it holds single statements only
        async with engine.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver.info.transaction_status.name == "IDLE"
            second = (await db.driver_rows(conn, "SELECT pg_backend_pid()", {}))[0][0]
        assert second != first
    finally:
        await engine.dispose()


async def test_a_statement_checked_out_for_itself_alone_costs_one_round_trip_on_a_kept_connection(database_url, settings):
    """``core.db.autocommit_rows`` (the edge's hot statements): the pool's connection without SQLAlchemy's Connection,
    each statement one round trip on the same backend, prepared from its sixth use as through ``engine.connect``."""
    counter = StatementCounter(database_url)
    engine = edge_engine(counter.url, settings, autocommit=True)
    try:
        [(backend,)] = await db.autocommit_rows(engine, "SELECT pg_backend_pid()", {})
        _, trips_before, _, _ = counter.snapshot()
        prepares_before = counter.prepares
        uses = UNPREPARED_USES + 3
        for use in range(uses):
            assert await db.autocommit_rows(engine, _PROBE, {"x": use}) == [(use,)]
        _, trips_after, _, _ = counter.snapshot()
        assert (trips_after - trips_before, counter.prepares - prepares_before) == (uses + 1, 1)
        assert await db.autocommit_rows(engine, "SELECT pg_backend_pid()", {}) == [(backend,)]
    finally:
        await engine.dispose()
        counter.close()


async def test_a_failed_statement_raises_sqlalchemys_error_and_leaves_its_connection_usable(database_url, settings):
    engine = edge_engine(database_url, settings, autocommit=True)
    try:
        [(backend,)] = await db.autocommit_rows(engine, "SELECT pg_backend_pid()", {})
        with pytest.raises(DataError):
            await db.autocommit_rows(engine, "SELECT 1 / %(zero)s::int", {"zero": 0})
        assert await db.autocommit_rows(engine, "SELECT pg_backend_pid()", {}) == [(backend,)]
    finally:
        await engine.dispose()


async def test_a_statement_cancelled_in_flight_stops_on_the_server_and_its_connection_serves_again(
    database_url, settings
):
    engine = edge_engine(database_url, settings, autocommit=True)
    try:
        [(backend,)] = await db.autocommit_rows(engine, "SELECT pg_backend_pid()", {})
        sleeping = asyncio.create_task(db.autocommit_rows(engine, _SLEEP, {}))
        await _until_backend_is(engine, backend, "active")
        sleeping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sleeping
        # psycopg cancelled the statement on the server before the connection went back: nothing sleeps now, and
        # the pool hands the connection out again.
        assert await db.autocommit_rows(engine, _SLEEPING, {"q": _SLEEP}) == [(0,)]
        backends = {(await db.autocommit_rows(engine, "SELECT pg_backend_pid()", {}))[0][0] for _ in range(4)}
        assert backend in backends
    finally:
        await engine.dispose()


async def test_single_statements_keep_their_connection_and_skip_the_pools_checkout_and_return(database_url, settings):
    engine = edge_engine(database_url, settings, autocommit=True)
    pool = engine.sync_engine.pool
    moves = {"checkout": 0, "checkin": 0}
    for name in moves:
        event.listen(pool, name, lambda *_, name=name: moves.__setitem__(name, moves[name] + 1))
    try:
        backends = {(await db.autocommit_rows(engine, "SELECT pg_backend_pid()", {}))[0][0] for _ in range(8)}
        assert len(backends) == 1
        assert moves == {"checkout": 1, "checkin": 0}  # checked out once, then kept from one statement to the next
        assert len(pool.kept) == 1
    finally:
        await engine.dispose()
    assert moves["checkin"] == 1  # dispose returned the kept connection to the pool, which closed it


async def test_dispose_closes_the_connections_kept_for_single_statements(database_url, settings):
    engine = edge_engine(database_url, settings, autocommit=True)
    [(backend,)] = await db.autocommit_rows(engine, "SELECT pg_backend_pid()", {})
    await engine.dispose()
    with psycopg.connect(libpq_url(database_url), autocommit=True) as watching:
        _until(lambda: watching.execute(_ALIVE, {"pid": backend}).fetchone() == (0,), f"backend {backend} ended")


async def test_a_kept_connection_the_server_ended_is_discarded_and_the_statement_runs_on_a_new_one(
    database_url, settings
):
    engine = edge_engine(database_url, settings, autocommit=True)
    pool = engine.sync_engine.pool
    try:
        [(backend,)] = await db.autocommit_rows(engine, "SELECT pg_backend_pid()", {})
        [(kept, _)] = pool.kept
        with psycopg.connect(libpq_url(database_url), autocommit=True) as ending:
            ending.execute("SELECT pg_terminate_backend(%(pid)s)", {"pid": backend})
        _until(lambda: db._socket_reads(kept.driver_connection), "the kept connection's socket reads the server's end")
        [(new_backend,)] = await db.autocommit_rows(engine, "SELECT pg_backend_pid()", {})
        assert new_backend != backend
        assert [fairy for fairy, _ in pool.kept] != [kept]
    finally:
        await engine.dispose()


async def test_at_most_the_pools_size_is_kept_and_the_overflow_goes_back_to_the_pool(database_url, settings):
    small = settings.model_copy(update={"database": settings.database.model_copy(update={"pool_size": 2,
                                                                                          "max_overflow": 3})})
    engine = edge_engine(database_url, small, autocommit=True)
    pool = engine.sync_engine.pool
    lock_key = 4_4044
    try:
        with psycopg.connect(libpq_url(database_url), autocommit=True) as holding:
            holding.execute("SELECT pg_advisory_lock(%(k)s)", {"k": lock_key})
            waiting = [asyncio.create_task(db.autocommit_rows(engine, _SHARED_LOCK, {"k": lock_key})) for _ in range(5)]
            await _until_async(lambda: _waiters(holding, lock_key) == 5, "five statements wait on the lock at once")
            holding.execute("SELECT pg_advisory_unlock(%(k)s)", {"k": lock_key})
            await asyncio.gather(*waiting)
        assert len(pool.kept) == 2  # the pool's size
        assert pool.checkedout() == 2  # the three overflow connections went back, and the pool closed them
    finally:
        await engine.dispose()


def _waiters(conn: psycopg.Connection, key: int) -> int:
    return conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %(k)s AND NOT granted",
                        {"k": key}).fetchone()[0]


def _until(seen, what: str) -> None:
    """Wait until ``seen()``, read again every ``_STATE_POLL_S``, or fail within ``_STATE_WAIT_S`` saying what."""
    deadline = time.monotonic() + _STATE_WAIT_S
    while not seen():
        if time.monotonic() > deadline:
            raise AssertionError(f"never seen within {_STATE_WAIT_S:g} s: {what}")
        time.sleep(_STATE_POLL_S)


async def _until_async(seen, what: str) -> None:
    deadline = time.monotonic() + _STATE_WAIT_S
    while not seen():
        if time.monotonic() > deadline:
            raise AssertionError(f"never seen within {_STATE_WAIT_S:g} s: {what}")
        await asyncio.sleep(_STATE_POLL_S)


_SHARED_LOCK = "SELECT pg_advisory_xact_lock_shared(%(k)s::bigint)"
_ALIVE = "SELECT count(*) FROM pg_stat_activity WHERE pid = %(pid)s"
_SLEEP = "SELECT pg_sleep(30)"
_STATE = "SELECT state FROM pg_stat_activity WHERE pid = %(pid)s"
_SLEEPING = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = %(q)s "
             "AND state = 'active'")


async def _until_backend_is(engine, backend: int, state: str) -> None:
    """Wait, on another connection, until ``backend`` is in ``state`` (the server's own view of it, read again every
    ``_STATE_POLL_S``), or fail saying so within ``_STATE_WAIT_S`` (the statement it waits for sleeps 30 s)."""
    deadline = time.monotonic() + _STATE_WAIT_S
    while (seen := await db.autocommit_rows(engine, _STATE, {"pid": backend})) != [(state,)]:
        if time.monotonic() > deadline:
            raise AssertionError(f"backend {backend} never became {state!r} within {_STATE_WAIT_S:g} s (it is {seen})")
        await asyncio.sleep(_STATE_POLL_S)


_STATE_POLL_S = 0.01
_STATE_WAIT_S = 20.0
