"""A job's writes to the A2A task it serves: its input, its progress events, its final state, unknown.

A job dispatched from the outbox names its task in its signed payload
(``taskstate.ids.TaskRef``); a job without one (a test's raw job) has no task
and every call here leaves it alone. The job's message itself stays in its
outbox row.

Every write goes through the task tables' owner (``taskstate.rows``, the a2a-sdk
cluster store's format), so every API instance reads and streams what a worker
wrote. After each commit a notification (``taskstate.notify``) wakes their
streams at once (they also poll).

* Progress and artifacts (``TaskEvents.emit``) are **fenced**: each write first
  takes a share lock on the job's claim (``claims.hold_fence``) and checks that it
  is still this worker's running claim with a live lease, so a stale worker
  writes nothing, and a finish or a lease expiry cannot slip in between the check
  and the write.
* The final state (``TaskEvents.finish``) and the unknown mark
  (``TaskEvents.mark_unknown``) run inside the caller's transaction: the claim's
  finish and the ledger move with them (``workers.settlement``).
* A task the customer already cancelled keeps its CANCELED state: nothing a
  worker reports afterwards overwrites it.

Lock order, everywhere a job and its task meet: claim row, outbox row, task rows,
ledger. The edge's cancel and the operator's reconcile take them in the same order.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from a2a.server.agent_execution.active_task import TERMINAL_TASK_STATES
from a2a.server.tasks.task_manager import append_artifact_to_task
from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from sqlalchemy import Connection, Engine

from core import db
from taskstate import admitted, claims, notify, outbox, push, rows
from taskstate.ids import TaskRef


class Job(Protocol):
    """A verified job, as the worker holds it (``workers.auth.VerifiedJob``)."""

    @property
    def job_id(self) -> str: ...

    @property
    def payload(self) -> Mapping[str, Any]: ...


class Outcome(Protocol):
    """How a run ended, as the runner says it (``workers.runs.RunOutcome``)."""

    @property
    def state(self) -> str: ...

    @property
    def message(self) -> str: ...

    @property
    def final_event(self) -> Any: ...

    @property
    def events(self) -> tuple[Any, ...]: ...


log = logging.getLogger(__name__)

UNDER_RECONCILIATION = (
    "The outcome of this task could not be established (the worker running it stopped answering); "
    "it is under reconciliation by the operator and will be finished when they resolve it."
)
UNKNOWN_KEY = "outcomeUnderReconciliation"  # in the status message's metadata, for clients that read it
OUTCOME_STATES: dict[str, int] = {
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "canceled": TaskState.TASK_STATE_CANCELED,
    "rejected": TaskState.TASK_STATE_REJECTED,
    "input_required": TaskState.TASK_STATE_INPUT_REQUIRED,
}


class _NotRead:
    """The task was not read by the caller's statement: ``TaskEvents._write`` locks and reads it."""


NOT_READ = _NotRead()


@dataclass(frozen=True)
class FinalWrite:
    """What ``TaskEvents.finish`` did: whether the final event was written, and the row of the statement run beside
    it (``rows.Beside``; None when none was given, or the event was not written, so it did not run)."""

    written: bool
    beside: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class TaskInput:
    ref: TaskRef
    message: Message  # the message this job processes (the first one, or a follow-up)
    task: Task | None  # the task as stored when the run starts


def _claimed_message(job: Job) -> Message | None:
    """The job's message as the worker's claim read it (``workers.auth.VerifiedJob.message``), if it did."""
    claimed = getattr(job, "message", None)
    return None if claimed is None else Message.FromString(claimed)


def agent_message(text_: str, ref: TaskRef) -> Message:
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_AGENT,
        parts=[Part(text=text_)],
        task_id=ref.task_id,
        context_id=ref.context_id,
    )


def _shows_unknown(task: Task) -> bool:
    message = task.status.message
    return task.status.HasField("message") and UNKNOWN_KEY in message.metadata.fields


def _apply(task: Task, event: TaskStatusUpdateEvent | TaskArtifactUpdateEvent) -> None:
    """What the a2a-sdk's TaskManager does with an event, on a task we hold locked."""
    if isinstance(event, TaskStatusUpdateEvent):
        if task.status.HasField("message"):
            task.history.append(task.status.message)
        if event.metadata.fields:
            task.metadata.MergeFrom(event.metadata)
        task.status.CopyFrom(event.status)
        if not task.status.HasField("timestamp"):
            rows.stamp(task)
    else:
        append_artifact_to_task(task, event)


class TaskEvents:
    """Writes a job's task: fenced progress (the runners' ``EventSink``), the final state, unknown."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        # Tasks whose written event was a push notification, until ``notify`` wakes the deliverers for them.
        # An entry a rolled-back write left costs one spurious wake-up at the task's next notify.
        self._pushed: set[str] = set()
        self._pushed_lock = threading.Lock()

    # --- input ----------------------------------------------------------------------

    def load(self, job: Job) -> TaskInput:
        """The job's message and its task as stored (an executor that continues the task needs both).
        Reads in autocommit: one statement each, no BEGIN or ROLLBACK around them."""
        ref = self._ref(job)
        claimed = _claimed_message(job)
        with self._autocommit.connect() as conn:
            message = claimed if claimed is not None else self._message(conn, job, ref)
            return TaskInput(ref=ref, message=message, task=rows.read(conn, ref.task_id, ref.owner))

    def message(self, job: Job) -> Message:
        """The job's message alone: what a runner that starts afresh needs. The worker's claim read it
        (``VerifiedJob.message``); otherwise one read of its outbox row, in autocommit."""
        ref = self._ref(job)
        claimed = _claimed_message(job)
        if claimed is not None:
            return claimed
        with self._autocommit.connect() as conn:
            return self._message(conn, job, ref)

    @staticmethod
    def _ref(job: Job) -> TaskRef:
        ref = TaskRef.of_payload(job.payload)
        if ref is None:
            raise LookupError(f"job {job.job_id} names no A2A task")
        return ref

    @staticmethod
    def _message(conn: Connection, job: Job, ref: TaskRef) -> Message:
        message = outbox.message_of(conn, ref)
        if message is None:
            raise LookupError(f"job {job.job_id}: outbox row {ref.dispatch_id} of task {ref.task_id} is gone")
        return Message.FromString(message)

    # --- progress (EventSink) ---------------------------------------------------------

    def emit(self, job: Job, fencing_token: int, kind: str, data: dict[str, Any]) -> None:
        ref = TaskRef.of_payload(job.payload)
        if ref is None:
            log.info("job %s (claim %s) %s %s", job.job_id, fencing_token, kind, data)
            return
        event = self._event(ref, kind, data)
        if event is None:
            log.warning("job %s: progress of kind %r is not an A2A event; dropped", job.job_id, kind)
            return
        # A connection found dead (no ping on checkout): once more on a new one (a write cut off at its COMMIT
        # may have landed, so the event may then be written twice: a repeated progress message, never money).
        if db.retrying_once(lambda: self._write_fenced(job, fencing_token, ref, kind, event)):
            self.notify(ref.task_id)

    def _write_fenced(self, job: Job, fencing_token: int, ref: TaskRef, kind: str, event: Any) -> bool:
        with self.engine.begin() as conn:
            if not claims.hold_fence(conn, job.job_id, fencing_token):
                log.info("job %s: claim %s is no longer current; its %s event is dropped", job.job_id, fencing_token, kind)
                return False
            return self._write(conn, ref, event) is not None

    def _event(
        self, ref: TaskRef, kind: str, data: dict[str, Any]
    ) -> TaskStatusUpdateEvent | TaskArtifactUpdateEvent | None:
        if kind == "a2a":
            event = data.get("event")
            if isinstance(event, TaskStatusUpdateEvent | TaskArtifactUpdateEvent):
                event.task_id, event.context_id = ref.task_id, ref.context_id
                return event
            return None
        if kind == "progress":
            status = TaskStatus(state=TaskState.TASK_STATE_WORKING, message=agent_message(str(data.get("text", "")), ref))
            return TaskStatusUpdateEvent(task_id=ref.task_id, context_id=ref.context_id, status=status)
        if kind == "artifact":
            artifact = Artifact(artifact_id=str(data.get("id") or data.get("name")), name=str(data.get("name", "")),
                                parts=[Part(text=str(data.get("text", "")))])
            return TaskArtifactUpdateEvent(task_id=ref.task_id, context_id=ref.context_id, artifact=artifact)
        return None

    def _write(self, conn: Connection, ref: TaskRef, event: Any, *, unless_unknown: bool = False,
               locked: rows.Locked | None | _NotRead = NOT_READ, beside: rows.Beside | None = None) -> rows.Locked | None:
        """Write ``event`` on the task, locked here unless the caller's statement ``locked`` it already (None: no
        task of the owner); ``beside`` runs in the event's statement (``rows.write_event``). The task as written,
        or None: nothing was written (and ``beside`` did not run)."""
        if isinstance(locked, _NotRead):
            locked = rows.lock(conn, ref.task_id, ref.owner, with_artifacts=isinstance(event, TaskArtifactUpdateEvent))
        if locked is None:
            return None
        task = locked.task  # without its history: what it appends (rows.Locked)
        if task.status.state in TERMINAL_TASK_STATES:
            return None  # cancelled by the customer (or finished): nothing overwrites it
        if unless_unknown and _shows_unknown(task):
            return None
        if isinstance(event, Message):  # a direct reply: the task completes with it as its status message
            admitted.record_message_reply(conn, ref.task_id)  # a resend is answered with it too
            if task.status.HasField("message"):
                task.history.append(task.status.message)
            task.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_COMPLETED, message=event))
            rows.stamp(task)
        else:
            try:
                _apply(task, event)
            except Exception as exc:  # an agent protocol violation (e.g. appending to no artifact)
                log.warning("task %s: event dropped: %s", ref.task_id, exc)
                return None
        rows.write_event(conn, locked, event, pushed_sql=push.configured_sql(), beside=beside)
        if locked.pushed:
            with self._pushed_lock:
                self._pushed.add(ref.task_id)
        return locked

    # --- in the finish / claim / reconcile transactions ------------------------------------

    def finish(self, conn: Connection, ref: TaskRef, outcome: Outcome, *, metadata: dict[str, Any] | None = None,
               locked: rows.Locked | None | _NotRead = NOT_READ, beside: rows.Beside | None = None) -> FinalWrite:
        """Write the job's final state (the caller's transaction); not written if the task was already final.
        ``metadata`` is merged into the final event's (and so the task's) metadata. The outcome's ``events`` (a
        run's artifacts) are written first, in the same transaction: the customer sees them with the final state,
        in one commit and one wake-up, instead of a fenced transaction and a wake-up each before it.
        ``locked``: the task as the caller's statement locked it (a job's finish, ``workers.settlement``), used when
        the final event is the first write. ``beside``: run in the final event's statement, only if it is written."""
        for event in outcome.events:
            event.task_id, event.context_id = ref.task_id, ref.context_id
            self._write(conn, ref, event)
            locked = NOT_READ  # the task moved on: the final event locks and reads it again
        final = outcome.final_event
        if isinstance(final, Message) or (
                isinstance(final, TaskStatusUpdateEvent) and final.status.state == OUTCOME_STATES[outcome.state]):
            final.task_id, final.context_id = ref.task_id, ref.context_id
        else:
            status = TaskStatus(state=OUTCOME_STATES[outcome.state])
            if outcome.message:
                status.message.CopyFrom(agent_message(outcome.message, ref))
            final = TaskStatusUpdateEvent(task_id=ref.task_id, context_id=ref.context_id, status=status)
        if metadata:
            final.metadata.update(metadata)
        written = self._write(conn, ref, final, locked=locked, beside=beside)
        return FinalWrite(written=written is not None, beside=None if written is None else written.beside)

    def mark_unknown(self, conn: Connection, ref: TaskRef) -> bool:
        """Not finished, and saying why: WORKING with the reconciliation message (the caller's transaction)."""
        status = TaskStatus(state=TaskState.TASK_STATE_WORKING, message=agent_message(UNDER_RECONCILIATION, ref))
        status.message.metadata.update({UNKNOWN_KEY: True})
        event = TaskStatusUpdateEvent(task_id=ref.task_id, context_id=ref.context_id, status=status)
        return self._write(conn, ref, event, unless_unknown=True) is not None

    def resolve(self, conn: Connection, ref: TaskRef, state: str) -> bool:
        """An operator's verdict on an unknown job becomes the task's final state (the caller's transaction)."""
        status = TaskStatus(
            state=OUTCOME_STATES[state],
            message=agent_message(f"The operator reconciled this task's outcome: {state}.", ref),
        )
        event = TaskStatusUpdateEvent(task_id=ref.task_id, context_id=ref.context_id, status=status)
        return self._write(conn, ref, event) is not None

    def commit_then_notify(self, conn: Connection, task_id: str) -> bool:
        """Commit the caller's transaction on ``conn`` and then ``notify``, in one round trip
        (``notify.commit_then_notify``). False, with nothing done: the caller commits, then calls ``notify``."""
        with self._pushed_lock:
            push = task_id in self._pushed
        if not notify.commit_then_notify(conn, task_id, push=push):
            return False
        if push:
            with self._pushed_lock:
                self._pushed.discard(task_id)
        return True

    def notify(self, task_id: str) -> None:
        """Wake every API instance's streams of the task, and the push deliverers when an event written for it
        since the last wake-up was a notification (after the commit; best effort: they also poll)."""
        with self._pushed_lock:
            push = task_id in self._pushed
            self._pushed.discard(task_id)
        notify.task_event_now(self._autocommit, task_id, push=push)
