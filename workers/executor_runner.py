"""Running an a2a-sdk ``AgentExecutor`` on a worker, as a ``Runner`` (the conformance specialist is one).

The executor is the SDK's usual contract: ``execute(RequestContext, EventQueue)``
enqueuing Tasks, status updates, artifact updates or a direct Message. Here the
queue does not feed an in-memory ``ActiveTask``: each event becomes a fenced task
event (``ctx.report("a2a", ...)``) the moment it is enqueued, and the event that
ends the run (a terminal or input-asking status, or a Message) becomes the
job's outcome, written with the claim's finish and the settlement in one
transaction. The executor runs in its own event loop in the runner's thread; a
cancel, the deadline or a lost lease cancels it (checked every
``CANCEL_POLL_S``), and the job finishes as the worker decides.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from a2a.auth.user import User
from a2a.helpers.proto_helpers import get_message_text
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.agent_execution.active_task import INTERRUPTED_TASK_STATES, TERMINAL_TASK_STATES
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event, EventQueue
from a2a.types.a2a_pb2 import Message, SendMessageRequest, Task, TaskArtifactUpdateEvent, TaskState, TaskStatusUpdateEvent

from workers.runs import RunContext, RunOutcome
from taskstate.updates import TaskEvents

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.05
_STATES = {
    TaskState.TASK_STATE_COMPLETED: "completed",
    TaskState.TASK_STATE_FAILED: "failed",
    TaskState.TASK_STATE_CANCELED: "canceled",
    TaskState.TASK_STATE_REJECTED: "rejected",
    TaskState.TASK_STATE_INPUT_REQUIRED: "input_required",
    # A2A's other interruption; this service has no separate outcome for it.
    TaskState.TASK_STATE_AUTH_REQUIRED: "input_required",
}


class OwnerUser(User):
    """A user that is only an owner scope (the task store's filter, ``<customer>:<specialist>``): the call
    context's user of an executor writing its task's events. The edge's callers are ``app.identity.EdgeUser``."""

    def __init__(self, owner: str) -> None:
        self._owner = owner

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self._owner


class _ReportingQueue(EventQueue):
    """The executor's queue: progress is reported as it comes, the final event is kept."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.final: TaskStatusUpdateEvent | Message | None = None

    async def enqueue_event(self, event: Event) -> None:
        if self.final is not None or isinstance(event, Task):
            return  # nothing after the end; the task itself already exists (admission stored it)
        if isinstance(event, Message):
            self.final = event
        elif isinstance(event, TaskStatusUpdateEvent) and (
            event.status.state in TERMINAL_TASK_STATES or event.status.state in INTERRUPTED_TASK_STATES
        ):
            self.final = event
        elif isinstance(event, TaskStatusUpdateEvent | TaskArtifactUpdateEvent):
            await asyncio.to_thread(self.ctx.report, "a2a", {"event": event})


class ExecutorRunner:
    def __init__(self, executor: AgentExecutor, tasks: TaskEvents) -> None:
        self.executor = executor
        self.tasks = tasks

    def run(self, ctx: RunContext) -> RunOutcome:
        return asyncio.run(self._run(ctx))

    async def _run(self, ctx: RunContext) -> RunOutcome:
        given = await asyncio.to_thread(self.tasks.load, ctx.job)
        ref = given.ref
        request = RequestContext(
            ServerCallContext(user=OwnerUser(ref.owner)),
            request=SendMessageRequest(message=given.message),
            task_id=ref.task_id,
            context_id=ref.context_id,
            task=given.task,
        )
        queue = _ReportingQueue(ctx)
        execution = asyncio.create_task(self.executor.execute(request, queue))
        while not execution.done():
            await asyncio.wait({execution}, timeout=CANCEL_POLL_S)
            if ctx.cancelled() and not execution.done():
                execution.cancel()
                try:
                    await execution
                except asyncio.CancelledError:
                    pass
                return RunOutcome("canceled", "stopped on request", final_event=queue.final)
        error = execution.exception()
        if error is not None:
            raise error
        return self._outcome(queue.final)

    @staticmethod
    def _outcome(final: Any) -> RunOutcome:
        if isinstance(final, Message):
            return RunOutcome("completed", get_message_text(final), final_event=final)
        if isinstance(final, TaskStatusUpdateEvent):
            state = _STATES.get(final.status.state)
            if state is not None:
                text = get_message_text(final.status.message) if final.status.HasField("message") else ""
                return RunOutcome(state, text, final_event=final)
        return RunOutcome("failed", "the specialist stopped without reaching a final state")
