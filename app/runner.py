"""The in-process runner: claims dispatch outbox rows for built-in executors and runs them.

This is the seam the dispatch issue replaces with workers. A runner
  - claims pending ``dispatch_outbox`` rows of the executors it knows with
    ``FOR UPDATE SKIP LOCKED`` (any number of processes may run one);
  - runs each through the a2a-sdk's own ``ActiveTask`` machinery on the shared
    ``VersionedDatabaseTaskStore``, so every status and artifact is a versioned
    write plus a ``task_events`` row that any instance streams;
  - stops a task promptly when someone else cancels it (it watches the
    task's event stream for a CANCELED status written by another writer);
  - marks the row ``done`` when the run ends.
It settles nothing: the specs it runs are tariff 0 (``core.specs`` enforces it).
A claimed row whose process dies stays ``claimed`` and its task stays WORKING;
leases, fencing and unknown outcomes are the dispatch issue's (the row keeps
``claimed_by`` and ``claimed_at`` for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from dataclasses import dataclass

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.agent_execution.active_task import TERMINAL_TASK_STATES
from a2a.server.agent_execution.active_task_registry import ActiveTaskRegistry
from a2a.server.cluster import TaskVersion, VersionedDatabaseTaskStore
from a2a.server.context import ServerCallContext
from a2a.types.a2a_pb2 import (
    Message,
    SendMessageRequest,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app import taskrows
from app.events import NotifiedEventStream
from app.identity import OwnerUser
from app.notify import DISPATCH, Listener, Notifier
from app.observability import Metrics

log = logging.getLogger(__name__)

# A run that ends asking for input leaves an idle ActiveTask in memory; release it soon.
# The follow-up may arrive on any instance, which rebuilds it from the store.
RELEASE_INTERRUPTED_AFTER_S = 1.0


@dataclass(frozen=True)
class Claim:
    dispatch_id: int
    task_id: str
    executor: str
    owner: str
    context_id: str
    message: Message


class InProcessRunner:
    def __init__(
        self,
        *,
        engine: AsyncEngine,
        store: VersionedDatabaseTaskStore,
        events: NotifiedEventStream,
        listener: Listener,
        notifier: Notifier,
        executors: dict[str, AgentExecutor],
        concurrency: int,
        poll_interval_s: float,
        drain_s: float,
        metrics: Metrics,
    ) -> None:
        self.engine = engine
        self.store = store
        self.events = events
        self.listener = listener
        self.notifier = notifier
        self.concurrency = concurrency
        self.poll_interval_s = poll_interval_s
        self.drain_s = drain_s
        self.metrics = metrics
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        # The store writes every event row; the stream's publish() wakes the other instances after it.
        self._registries = {
            name: ActiveTaskRegistry(
                agent_executor=executor,
                task_store=store,
                event_stream=events,
                interrupted_task_timeout=RELEASE_INTERRUPTED_AFTER_S,
            )
            for name, executor in executors.items()
        }
        self._running: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._slot_freed = asyncio.Event()

    def start(self) -> None:
        if self._registries and self._loop_task is None:
            self._loop_task = asyncio.create_task(self._loop(), name="edge-runner")

    async def stop(self) -> None:
        """Stop claiming; give running tasks ``drain_s`` to finish, then stop them."""
        self._stopping.set()
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        if self._running:
            done, pending = await asyncio.wait(set(self._running), timeout=self.drain_s)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("runner stopped %d task(s) still running; they stay claimed", len(pending))
                await asyncio.gather(*pending, return_exceptions=True)
        for registry in self._registries.values():
            await registry.aclose()

    async def _loop(self) -> None:
        # Woken only by outbox rows for executors this runner has (the payload is the executor).
        woken = asyncio.Event()
        for name in self._registries:
            self.listener.watch(DISPATCH, name, woken)
        try:
            while not self._stopping.is_set():
                free = self.concurrency - len(self._running)
                claims: list[Claim] = []
                if free > 0:
                    woken.clear()
                    try:
                        claims = await self._claim(free)
                    except Exception:
                        log.exception("runner could not claim work; retrying")
                for claim in claims:
                    task = asyncio.create_task(self._run(claim), name=f"run:{claim.task_id}")
                    self._running.add(task)
                    task.add_done_callback(self._finished)
                if claims and len(claims) == free:
                    continue  # there may be more
                self._slot_freed.clear()
                waits = [asyncio.ensure_future(woken.wait()), asyncio.ensure_future(self._slot_freed.wait())]
                try:
                    await asyncio.wait(waits, timeout=self.poll_interval_s, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waits:
                        waiter.cancel()
        finally:
            for name in self._registries:
                self.listener.unwatch(DISPATCH, name, woken)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._slot_freed.set()

    async def _claim(self, limit: int) -> list[Claim]:
        async with self.engine.begin() as conn:
            return await conn.run_sync(self._claim_sync, limit)

    def _claim_sync(self, conn: Connection, limit: int) -> list[Claim]:
        rows = conn.execute(
            text(
                "UPDATE dispatch_outbox SET status = 'claimed', claimed_at = now(), claimed_by = :me "
                "WHERE dispatch_id IN (SELECT dispatch_id FROM dispatch_outbox "
                "  WHERE status = 'pending' AND executor = ANY(:executors) "
                "  ORDER BY dispatch_id FOR UPDATE SKIP LOCKED LIMIT :n) "
                "RETURNING dispatch_id, task_id, executor, owner, context_id, message"
            ),
            {"me": self.name, "executors": list(self._registries), "n": limit},
        ).all()
        if rows:
            conn.execute(
                text(
                    "UPDATE edge_tasks SET first_claimed_at = now() "
                    "WHERE task_id = ANY(:ids) AND first_claimed_at IS NULL"
                ),
                {"ids": [row.task_id for row in rows]},
            )
        return [
            Claim(
                dispatch_id=row.dispatch_id,
                task_id=row.task_id,
                executor=row.executor,
                owner=row.owner,
                context_id=row.context_id,
                message=Message.FromString(bytes(row.message)),
            )
            for row in sorted(rows, key=lambda r: r.dispatch_id)
        ]

    async def _run(self, claim: Claim) -> None:
        self.metrics.runner_active.inc()
        call_context = ServerCallContext(user=OwnerUser(claim.owner))
        request = RequestContext(
            call_context,
            request=SendMessageRequest(message=claim.message),
            task_id=claim.task_id,
            context_id=claim.context_id,
        )
        registry = self._registries[claim.executor]
        watcher: asyncio.Task[None] | None = None
        try:
            active = await registry.get_or_create(
                claim.task_id, call_context=call_context, context_id=claim.context_id
            )
            stored = await self.store.get(claim.task_id, call_context)
            start_version = stored.version if stored else TaskVersion.MISSING
            watcher = asyncio.create_task(self._stop_when_canceled(claim, active, start_version))
            async for event in active.subscribe(request=request):
                if isinstance(event, Message):
                    await self._record_reply(claim, event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The SDK has already written FAILED for an executor error; log what it was.
            log.warning("run of task %s ended with %s: %s", claim.task_id, type(exc).__name__, exc)
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await watcher
            self.metrics.runner_active.dec()
            with contextlib.suppress(Exception):
                await self._mark_done(claim)
            with contextlib.suppress(Exception):
                final = await self.store.get(claim.task_id, call_context)
                state = TaskState.Name(final.task.status.state) if final else "missing"
                self.metrics.runner_runs.labels(state=state).inc()

    async def _stop_when_canceled(self, claim: Claim, active: object, after: TaskVersion) -> None:
        """A cancel from any instance writes CANCELED; stop the executor instead of letting it run on."""
        async for versioned in self.events.subscribe(claim.task_id, after=after):
            event = versioned.event
            if isinstance(event, TaskStatusUpdateEvent) and event.status.state == TaskState.TASK_STATE_CANCELED:
                log.info("task %s was canceled; stopping its run", claim.task_id, extra={"task_id": claim.task_id})
                await active.aclose()  # type: ignore[attr-defined]
                return
            if isinstance(event, TaskStatusUpdateEvent) and event.status.state in TERMINAL_TASK_STATES:
                return

    async def _record_reply(self, claim: Claim, reply: Message) -> None:
        """A direct Message answer: the task completes with it, and the Message is the event streams see."""
        async with self.engine.begin() as conn:
            await conn.run_sync(self._record_reply_sync, claim, reply)
        await self.notifier.task_event(claim.task_id)

    @staticmethod
    def _record_reply_sync(conn: Connection, claim: Claim, reply: Message) -> None:
        loaded = taskrows.load_locked(conn, claim.task_id, claim.owner)
        if loaded is None:
            return
        task, version = loaded
        if task.status.state in TERMINAL_TASK_STATES:
            return
        if task.status.HasField("message"):
            task.history.append(task.status.message)
        task.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_COMPLETED, message=reply))
        taskrows.stamp(task)
        taskrows.write(conn, task, claim.owner, version, reply)

    async def _mark_done(self, claim: Claim) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE dispatch_outbox SET status = 'done', finished_at = now() "
                    "WHERE dispatch_id = :d AND status = 'claimed'"
                ),
                {"d": claim.dispatch_id},
            )
