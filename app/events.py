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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Iterator

from a2a.server.cluster import DatabaseTaskEventStream, TaskVersion, VersionedEvent
from a2a.server.cluster.database_event_stream import stream_response_to_event
from a2a.types.a2a_pb2 import StreamResponse, Task
from sqlalchemy import and_, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from taskstate import rows
from taskstate.notify import TASK_EVENTS, Listener, Notifier

log = logging.getLogger(__name__)


class NotifiedEventStream(DatabaseTaskEventStream):
    def __init__(self, engine: AsyncEngine, listener: Listener, notifier: Notifier, poll_interval_s: float) -> None:
        # create_table=False: migration 0010 owns the table.
        super().__init__(engine, create_table=False, poll_interval_s=poll_interval_s)
        self._listener = listener
        self._notifier = notifier
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

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
                       read_first: bool) -> tuple[Task, int]:
        """The task and its version once its state is one of ``states`` (a blocking send's wait; the caller bounds
        it with the request's deadline).

        It reads only when woken (``woken``, from ``watching``), one statement that brings the task back only in
        one of ``states``, and without a transaction around it: a task that works and then completes costs two
        reads. ``read_first``: events may have been written before ``watching`` began (a resend of a task
        admitted earlier), so it reads before it waits. A notification lost with the listener's connection costs
        at most the poll interval, which stays the safety net."""
        while True:
            if read_first:
                woken.clear()  # before reading: a notification that lands during the read is not lost
                try:
                    async with self._autocommit.connect() as conn:
                        found = await conn.run_sync(rows.load_if_in, task_id, owner, states)
                except OperationalError:
                    log.debug("transient error reading task %s; retrying", task_id, exc_info=True)
                    found = None
                if found is not None:
                    return found
            read_first = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), timeout=self._poll_interval_s)

    async def subscribe(  # type: ignore[override]
        self, task_id: str, *, after: TaskVersion
    ) -> AsyncGenerator[VersionedEvent, None]:
        woken = self._listener.watch(TASK_EVENTS, task_id)
        try:
            async with self._session_maker() as session:
                cursor = await self._seq_at_or_before_version(session, task_id, after)
            model = self._event_model
            while True:
                woken.clear()  # before reading: a notification that lands during the read is not lost
                try:
                    async with self._session_maker() as session:
                        rows = (
                            await session.execute(
                                select(model.seq, model.task_version, model.event_data)
                                .where(and_(model.task_id == task_id, model.seq > cursor))
                                .order_by(model.seq.asc())
                            )
                        ).all()
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
                if not rows:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(woken.wait(), timeout=self._poll_interval_s)
        finally:
            self._listener.unwatch(TASK_EVENTS, task_id, woken)
