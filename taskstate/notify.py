"""PostgreSQL LISTEN/NOTIFY: wake event streams and dispatchers on any instance at once; the channels' one owner.

Writers notify after they commit (``Notifier``): ``edge_task_events`` with the
task id when a task event was written, ``edge_dispatch`` with the executor when
an outbox row was, ``edge_push`` when the event was of a task with push
configurations (``rows.write_event`` tells: the dispatchers' push deliverers
claim only then, not on every event). Not from a trigger inside the writing transaction: NOTIFY
takes a database-wide lock held through commit, which serializes every
notifying transaction behind the previous one's WAL flush. A notification on
its own autocommit statement writes no WAL and holds that lock for microseconds.

One dedicated connection per process listens; waiters register an
``asyncio.Event`` per key. A lost connection is retried with backoff; meanwhile
(and always, as a safety net) every waiter also polls on its own interval, so a
missed notification only costs latency, never an event.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict

import psycopg
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from core import db

log = logging.getLogger(__name__)

TASK_EVENTS = "edge_task_events"
DISPATCH = "edge_dispatch"
PUSH = "edge_push"  # an event of a task with push configurations was written: the push deliverers claim
ANY = ""  # key for waiters that want every notification on a channel
MAX_BACKOFF_S = 5.0


def libpq_url(sqlalchemy_url: str) -> str:
    """``postgresql+psycopg://...`` -> a URL libpq (psycopg.connect) accepts."""
    return make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(hide_password=False)


class Listener:
    def __init__(
        self,
        sqlalchemy_url: str,
        connect_timeout_s: int = 10,
        channels: tuple[str, ...] = (TASK_EVENTS, DISPATCH),
        application_name: str = "specialists-edge-listener",
    ) -> None:
        self._conninfo = libpq_url(sqlalchemy_url)
        self._connect_timeout_s = connect_timeout_s
        self.application_name = application_name  # how operators tell this connection apart
        self._channels = channels
        self._waiters: dict[tuple[str, str], set[asyncio.Event]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    def watch(self, channel: str, key: str = ANY, event: asyncio.Event | None = None) -> asyncio.Event:
        """An event set on every notification of ``channel`` with payload ``key`` (pass one to share it)."""
        event = event or asyncio.Event()
        self._waiters[(channel, key)].add(event)
        return event

    def unwatch(self, channel: str, key: str, event: asyncio.Event) -> None:
        waiters = self._waiters.get((channel, key))
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                del self._waiters[(channel, key)]

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="edge-listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def _wake(self, channel: str, key: str) -> None:
        for event in self._waiters.get((channel, key), ()):
            event.set()
        if key != ANY:
            for event in self._waiters.get((channel, ANY), ()):
                event.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()

    async def _run(self) -> None:
        backoff_s = 0.1
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._conninfo,
                    autocommit=True,
                    connect_timeout=self._connect_timeout_s,
                    application_name=self.application_name,
                ) as conn:
                    for channel in self._channels:
                        await conn.execute(f"LISTEN {channel}")
                    self.connected.set()
                    backoff_s = 0.1
                    # Anything may have happened while we were not listening: let every waiter re-read.
                    self._wake_all()
                    async for notice in conn.notifies():
                        self._wake(notice.channel, notice.payload)
            except asyncio.CancelledError:
                self.connected.clear()
                raise
            except Exception as exc:  # the database went away: keep polling, reconnect later
                self.connected.clear()
                log.warning("notification listener lost its connection (%s); retrying", type(exc).__name__)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, MAX_BACKOFF_S)


# Many wake-ups in one statement: channels and payloads as two parallel arrays.
_NOTIFY = text("SELECT pg_notify(c, p) FROM unnest(CAST(:channels AS text[]), CAST(:payloads AS text[])) AS n(c, p)")
_NOTIFY_SQL = db.compiled_for_psycopg(_NOTIFY)
# At most one wake-up statement goes out within this long: under load, one round trip carries many.
NOTIFY_COALESCE_S = 0.005
# A wake-up asked for this long after the one before goes out at once; within it, after the window, as before.
NOTIFY_QUIET_S = 0.05


class Notifier:
    """Sends wake-ups after commits: at most one statement every ``coalesce_s``; after a quiet spell, at once.

    A wake-up asked for ``quiet_s`` or more after the one before goes out at once, in its asker's own round trip
    (awaited): the dispatcher takes a lone job while the edge still answers the customer (issue 44: every wake-up
    waited out the window, then for the edge's loop to finish the answer it was writing, 5-24 ms of admission ->
    claim). Under steady traffic each waits for the window, off its asker's path, and those of the window go out
    together, as all of them did before: sent at once under load, every wake-up a take of its own, the closed loop
    of bench/dispatch.py ran 8-27 jobs/s slower in five alternating pairs, at up to 3.6 ms more CPU a job.
    Best effort: a lost wake-up costs a poll interval of latency."""

    def __init__(self, engine: AsyncEngine, *, coalesce_s: float = NOTIFY_COALESCE_S,
                 quiet_s: float = NOTIFY_QUIET_S) -> None:
        assert coalesce_s >= 0 and quiet_s >= 0, (coalesce_s, quiet_s)
        # An engine in autocommit from its connections' start (the edge's, ``core.db.make_async_engine``): the
        # statement runs on the driver, with no switch into autocommit and back at each checkout (issue 44).
        self._on_driver = db.in_autocommit(engine)
        self.engine = engine if self._on_driver else engine.execution_options(isolation_level="AUTOCOMMIT")
        self.coalesce_s = coalesce_s
        self.quiet_s = quiet_s
        self._last_asked = -math.inf  # the loop's time of the last wake-up asked for
        self._pending: set[tuple[str, str]] = set()
        self._sending = False  # an asker's own round trip is in flight: what is asked for meanwhile waits its turn
        self._next_at = -math.inf  # the loop's time before which no further statement goes out
        self._flusher: asyncio.Task[None] | None = None  # the turn after the window, asleep or sending
        self._closing = asyncio.Event()  # shutdown: the turn after the window goes now

    async def task_event(self, task_id: str) -> None:
        await self._request(TASK_EVENTS, task_id)

    async def dispatch(self, executor: str) -> None:
        await self._request(DISPATCH, executor)

    async def push(self) -> None:
        await self._request(PUSH, "")

    async def _request(self, channel: str, payload: str) -> None:
        self._pending.add((channel, payload))
        now = asyncio.get_running_loop().time()
        quiet, self._last_asked = now - self._last_asked >= self.quiet_s, now
        if self._sending or (self._flusher is not None and not self._flusher.done()):
            return  # the round trip in flight, or the turn after the window, takes this one
        if quiet and now >= self._next_at:
            try:
                await self._send_pending()  # a lone wake-up: at once
            finally:
                self._schedule()  # what was asked for during the round trip
        else:
            self._next_at = max(self._next_at, now + self.coalesce_s)  # steady traffic: after the window
            self._schedule()

    def _schedule(self) -> None:
        if self._pending and (self._flusher is None or self._flusher.done()):
            self._flusher = asyncio.create_task(self._flush(), name="edge-notifier")

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            wait_s = self._next_at - loop.time()
            if wait_s > 0 and not self._closing.is_set():
                try:
                    await asyncio.wait_for(self._closing.wait(), wait_s)
                except TimeoutError:
                    pass
            await self._send_pending()

    async def _send_pending(self) -> None:
        batch, self._pending = sorted(self._pending), set()
        self._sending = True
        self._next_at = asyncio.get_running_loop().time() + self.coalesce_s
        try:
            params = {"channels": [c for c, _ in batch], "payloads": [p for _, p in batch]}
            if self._on_driver:
                await db.autocommit_rows(self.engine, _NOTIFY_SQL, params)
            else:
                async with self.engine.connect() as conn:
                    await conn.execute(_NOTIFY, params)
        except Exception as exc:
            log.debug("could not send %d wake-up(s) (%s); listeners will poll", len(batch), type(exc).__name__)
        finally:
            self._sending = False

    async def close(self) -> None:
        """Send what is pending at once (shutdown)."""
        self._closing.set()
        if self._flusher is not None and not self._flusher.done():
            await self._flusher
        if self._pending:
            await self._send_pending()


_NOTIFY_ONE = text("SELECT pg_notify(:channel, :payload)")
_NOTIFY_ONE_SQL = db.compiled_for_psycopg(_NOTIFY_ONE)


def task_event_now(autocommit_engine: Engine, task_id: str, *, push: bool = False) -> None:
    """From synchronous code (a worker, a dispatcher, an operator's command), after its commit: wake the task's
    streams on every instance, and with ``push`` the push deliverers, in one statement. Best effort: they also poll."""
    try:
        with autocommit_engine.connect() as conn:  # every job's: on the driver (core.db.hot_rows)
            if push:
                db.hot_rows(conn, _NOTIFY, {"channels": [TASK_EVENTS, PUSH], "payloads": [task_id, ""]})
            else:
                db.hot_rows(conn, _NOTIFY_ONE, {"channel": TASK_EVENTS, "payload": task_id})
    except Exception as exc:
        log.debug("could not notify task %s (%s); streams will poll", task_id, type(exc).__name__)


_COMMITTED = psycopg.pq.ExecStatus.COMMAND_OK


def commit_then_notify(conn: Connection, task_id: str, *, push: bool = False) -> bool:
    """Commit the caller's transaction on ``conn``, then wake the task's streams (and with ``push`` the push
    deliverers) as ``task_event_now`` does, in one round trip on the same connection (issue 44: the wake-up took a
    checkout of its own, into autocommit and back, and a round trip). The two statements go in one pipeline: the
    COMMIT, then the notification, which runs in a transaction of its own that the pipeline's sync commits, after
    the caller's committed, so the NOTIFY's database-wide lock is never held through the caller's commit. Once the
    COMMIT has answered, SQLAlchemy's own commit of the transaction sends nothing (psycopg's, on an idle
    connection), and its commit hooks run.

    False, with nothing sent: ``conn``'s statements go through SQLAlchemy (something watches them, ``core.db``'s
    ``hot_rows``): the caller commits, then calls ``task_event_now``. A failed COMMIT raises as SQLAlchemy's
    would (``connection_invalidated`` when the connection broke, which is discarded): the transaction may or may not
    have committed, as for any commit. A failed notification after a COMMIT that succeeded is logged and dropped
    (best effort: the readers also poll)."""
    driver = db.hot_driver(conn)  # core.db's own test for a hot statement: on the driver, or not at all
    if driver is None or driver.autocommit or not conn.in_transaction():
        return False
    if push:
        sql, params = _NOTIFY_SQL, {"channels": [TASK_EVENTS, PUSH], "payloads": [task_id, ""]}
    else:
        sql, params = _NOTIFY_ONE_SQL, {"channel": TASK_EVENTS, "payload": task_id}
    committing = driver.cursor()
    try:
        with driver.pipeline():
            committing.execute(b"COMMIT", prepare=False)
            # Not in a transaction of psycopg's: the COMMIT has not answered yet, so it sends no BEGIN for this.
            assert driver.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
            driver.cursor().execute(sql, params)
    except psycopg.Error as failed:
        if committing.pgresult is None or committing.pgresult.status != _COMMITTED:  # the COMMIT failed
            broken = driver.broken
            if broken:
                conn.invalidate(failed)
            raise DBAPIError.instance("COMMIT", {}, failed, psycopg.Error, connection_invalidated=broken) from failed
        log.debug("could not notify task %s after its commit (%s); streams will poll", task_id, type(failed).__name__)
    return True

