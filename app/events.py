"""The task event stream every instance reads: the a2a-sdk's database stream, woken by NOTIFY.

``DatabaseTaskEventStream`` polls the shared ``task_events`` table every
``poll_interval_s``. This subclass keeps its table, cursor and decoding but
waits on a PostgreSQL notification for the task instead of sleeping, so an
event written by any instance (a runner, a worker, a cancel) reaches every
subscriber within milliseconds; the poll interval remains as the safety net.
``publish`` (a no-op in the SDK's class, called after each committed event)
sends that notification.

A blocking SendMessage does not read the events at all (``watching``, ``until_in``):
it watches the task's notifications from before its admission commits, and on
each wake-up asks, in one statement outside any transaction, for the task only
if it has stopped; the task travels once, at the end (issue 44).

A stream (``subscribe``) reads the events the same way: each read, and the cursor
it starts from, is one statement in autocommit on the driver (``core.db.driver_rows``),
one round trip, and a read comes after a notification (or the poll), never straight
after a read that found events. The SDK's stream opened a session for each, three
round trips (BEGIN, the read, ROLLBACK), and read again at once after every event it
found: six round trips an event, on the way of every event to its customer, the last
one included (issue 44, "finished -> the customer has the final event").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Iterator

from a2a.server.cluster import DatabaseTaskEventStream, TaskVersion, VersionedEvent
from a2a.server.cluster.database_event_stream import stream_response_to_event
from a2a.server.models import TaskEventModel
from a2a.types.a2a_pb2 import StreamResponse, Task
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from core import db
from taskstate import rows
from taskstate.notify import TASK_EVENTS, Listener, Notifier

log = logging.getLogger(__name__)

# The SDK stream's two reads (``_seq_at_or_before_version`` and its poll) of its table, in psycopg's form for
# ``driver_rows``.
_EVENTS = TaskEventModel.__tablename__
_CURSOR_SQL = (f"SELECT seq FROM {_EVENTS} WHERE task_id = %(task_id)s AND task_version <= %(version)s "
               "ORDER BY seq DESC LIMIT 1")
_EVENTS_AFTER_SQL = (f"SELECT seq, task_version, event_data FROM {_EVENTS} WHERE task_id = %(task_id)s "
                     "AND seq > %(cursor)s ORDER BY seq")


class NotifiedEventStream(DatabaseTaskEventStream):
    def __init__(self, engine: AsyncEngine, autocommit: AsyncEngine, listener: Listener, notifier: Notifier,
                 poll_interval_s: float) -> None:
        # create_table=False: migration 0010 owns the table.
        super().__init__(engine, create_table=False, poll_interval_s=poll_interval_s)
        assert db.in_autocommit(autocommit), "the reads run outside any transaction: the edge's autocommit engine"
        self._listener = listener
        self._notifier = notifier
        self._autocommit = autocommit

    async def publish(self, task_id: str, event: VersionedEvent) -> None:
        """The SDK calls this after the store committed the event: wake every instance's subscribers."""
        await self._notifier.task_event(task_id)

    @contextlib.contextmanager
    def watching(self, task_id: str) -> Iterator[asyncio.Event]:
        """An event set on every notification of the task's events, from now until the block ends."""
        woken = self._listener.watch(TASK_EVENTS, task_id)
        try:
            yield woken
        finally:
            self._listener.unwatch(TASK_EVENTS, task_id, woken)

    async def until_in(self, task_id: str, owner: str, states: list[str], woken: asyncio.Event, *,
                       read_first: bool, with_history: bool = True) -> tuple[Task, int]:
        """The task and its version once its state is one of ``states`` (a blocking send's wait; the caller bounds
        it with the request's deadline).

        It reads only when woken (``woken``, from ``watching``), one statement that brings the task back only in
        one of ``states``, and without a transaction around it: a task that works and then completes costs two
        reads. ``read_first``: events may have been written before ``watching`` began (a resend of a task
        admitted earlier), so it reads before it waits. ``with_history``: False reads the task without its history
        (a caller that asked for none). A notification lost with the listener's connection costs at most the poll
        interval, which stays the safety net."""
        sql, params = rows.task_if_in_sql(tuple(states)), {"t": task_id, "o": owner, "with_history": with_history}
        while True:
            if read_first:
                woken.clear()  # before reading: a notification that lands during the read is not lost
                try:
                    found = await db.autocommit_rows(self._autocommit, sql, params)
                except OperationalError:
                    log.debug("transient error reading task %s; retrying", task_id, exc_info=True)
                    found = []
                if found:
                    return rows.task_if_in(found[0])
            read_first = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), timeout=self._poll_interval_s)

    async def subscribe(  # type: ignore[override]
        self, task_id: str, *, after: TaskVersion
    ) -> AsyncGenerator[VersionedEvent, None]:
        woken = self._listener.watch(TASK_EVENTS, task_id)
        try:
            cursor = await self._cursor(task_id, after)
            while True:
                woken.clear()  # before reading: a notification that lands during the read is not lost
                try:
                    rows = await db.autocommit_rows(self._autocommit, _EVENTS_AFTER_SQL,
                                                    {"task_id": task_id, "cursor": cursor})
                except OperationalError:
                    log.debug("transient error reading events of %s; retrying", task_id, exc_info=True)
                    rows = []
                for seq, task_version, event_data in rows:
                    cursor = seq
                    version = TaskVersion(task_version)
                    if not version.is_after(after):
                        continue
                    response = StreamResponse()
                    response.ParseFromString(event_data)
                    yield VersionedEvent(event=stream_response_to_event(response), version=version)
                # Whatever was committed after this read notifies after its commit, so the next read waits for a
                # notification (set meanwhile, it returns at once) even after a read that found events.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), timeout=self._poll_interval_s)
        finally:
            self._listener.unwatch(TASK_EVENTS, task_id, woken)

    async def _cursor(self, task_id: str, after: TaskVersion) -> int:
        """The seq of the task's last event at or before ``after`` (0: none, or no version): the SDK's
        ``_seq_at_or_before_version``, in one round trip."""
        if after.is_missing:
            return 0
        found = await db.autocommit_rows(self._autocommit, _CURSOR_SQL,
                                         {"task_id": task_id, "version": version_number(after)})
        return found[0][0] if found else 0


def version_number(version: TaskVersion) -> int:
    """The whole number a version of this store wraps (``taskstate.rows``: a task's version counts its events from 1),
    read through the SDK's public surface only: a ``TaskVersion`` hashes as its value and compares by it, and a
    whole number below 2**61 - 1 hashes as itself. Raises TypeError for a version that wraps anything else."""
    number = hash(version)
    if TaskVersion(number) != version:
        raise TypeError(f"{version!r} is not a version of this store (a whole number from 1)")
    return number
