"""The task event stream every instance reads: the a2a-sdk's database stream, woken by NOTIFY.

``DatabaseTaskEventStream`` polls the shared ``task_events`` table every
``poll_interval_s``. This subclass keeps its table, cursor and decoding but
waits on a PostgreSQL notification for the task instead of sleeping, so an
event written by any instance (a runner, a worker, a cancel) reaches every
subscriber within milliseconds; the poll interval remains as the safety net.
``publish`` (a no-op in the SDK's class, called after each committed event)
sends that notification.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator

from a2a.server.cluster import DatabaseTaskEventStream, TaskVersion, VersionedEvent
from a2a.server.cluster.database_event_stream import stream_response_to_event
from a2a.types.a2a_pb2 import StreamResponse
from sqlalchemy import and_, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from taskstate.notify import TASK_EVENTS, Listener, Notifier

log = logging.getLogger(__name__)


class NotifiedEventStream(DatabaseTaskEventStream):
    def __init__(self, engine: AsyncEngine, listener: Listener, notifier: Notifier, poll_interval_s: float) -> None:
        # create_table=False: migration 0010 owns the table.
        super().__init__(engine, create_table=False, poll_interval_s=poll_interval_s)
        self._listener = listener
        self._notifier = notifier

    async def publish(self, task_id: str, event: VersionedEvent) -> None:
        """The SDK calls this after the store committed the event: wake every instance's subscribers."""
        await self._notifier.task_event(task_id)

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
