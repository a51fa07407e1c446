"""The conformance specialist's executor: the A2A TCK's system-under-test contract, by messageId prefix.

Behaviour follows the TCK's reference SUT (a2a-tck ``sut/a2a-python``):
prefixes are tested longest-first where one is a prefix of another
(``tck-artifact-file-url`` before ``tck-artifact-file``). A message continuing
a task that asked for input completes it. The executor never creates the
task (admission already stored it) unless it runs without one.

It runs on workers like every specialist (``workers.executor_runner``), through
the same admission, dispatch, claim and settlement; the edge runs nothing.
"""

from __future__ import annotations

import asyncio

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events.event_queue import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types.a2a_pb2 import Part, Task, TaskState, TaskStatus
from google.protobuf.json_format import ParseDict
from google.protobuf.struct_pb2 import Value

TEXT_ARTIFACT = "Generated text content"
FILE_BYTES = b"tck"
FILE_URL = "https://example.com/output.txt"
DATA_ARTIFACT = {"key": "value", "count": 42}


def _file_part() -> Part:
    return Part(raw=FILE_BYTES, media_type="text/plain", filename="output.txt")


class ConformanceExecutor(AgentExecutor):
    def __init__(self, hold_working_s: float) -> None:
        self.hold_working_s = hold_working_s

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id, message = context.task_id, context.context_id, context.message
        if task_id is None or context_id is None or message is None:
            return
        if context.current_task is None:
            # Without a stored task the SDK requires a Task before any status update.
            await event_queue.enqueue_event(
                Task(
                    id=task_id,
                    context_id=context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[message],
                )
            )
        updater = TaskUpdater(event_queue, task_id, context_id)
        current = context.current_task
        if current is not None and current.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            await updater.complete(updater.new_agent_message([Part(text="Input received")]))
            return
        await self._scenario(message.message_id, updater, event_queue)

    async def _scenario(self, message_id: str, updater: TaskUpdater, event_queue: EventQueue) -> None:  # noqa: C901
        say = updater.new_agent_message
        if message_id.startswith("tck-stream-artifact-chunked"):
            await updater.start_work()
            await updater.add_artifact(parts=[Part(text="chunk-1 ")], artifact_id="chunked-artifact")
            await updater.add_artifact(
                parts=[Part(text="chunk-2")], artifact_id="chunked-artifact", append=True, last_chunk=True
            )
            await updater.complete()
        elif message_id.startswith("test-resubscribe-message-id"):
            await updater.start_work()
            await asyncio.sleep(self.hold_working_s)
            await updater.complete()
        elif message_id.startswith("tck-stream-artifact-text"):
            await updater.start_work()
            await updater.add_artifact(parts=[Part(text="Streamed text content")])
            await updater.complete()
        elif message_id.startswith("tck-stream-artifact-file"):
            await updater.start_work()
            await updater.add_artifact(parts=[_file_part()])
            await updater.complete()
        elif message_id.startswith("tck-stream-ordering-001"):
            await updater.start_work()
            await updater.add_artifact(parts=[Part(text="Ordered output")])
            await updater.complete()
        elif message_id.startswith("tck-artifact-file-url"):
            await updater.add_artifact(parts=[Part(url=FILE_URL, media_type="text/plain", filename="output.txt")])
            await updater.complete()
        elif message_id.startswith("tck-message-response"):
            await event_queue.enqueue_event(say([Part(text="Direct message response")]))
        elif message_id.startswith("tck-input-required"):
            await updater.requires_input(say([Part(text="Please provide input")]))
        elif message_id.startswith("tck-complete-task"):
            await updater.complete(say([Part(text="Hello from TCK")]))
        elif message_id.startswith("tck-artifact-text"):
            await updater.add_artifact(parts=[Part(text=TEXT_ARTIFACT)])
            await updater.complete()
        elif message_id.startswith("tck-artifact-file"):
            await updater.add_artifact(parts=[_file_part()])
            await updater.complete()
        elif message_id.startswith("tck-artifact-data"):
            await updater.add_artifact(parts=[Part(data=ParseDict(DATA_ARTIFACT, Value()))])
            await updater.complete()
        elif message_id.startswith("tck-reject-task"):
            await updater.reject(say([Part(text="rejected")]))
        elif message_id.startswith("tck-stream-001"):
            await updater.start_work()
            await updater.add_artifact(parts=[Part(text="Stream hello from TCK")])
            await updater.complete()
        elif message_id.startswith("tck-stream-002"):
            await updater.complete()
        elif message_id.startswith("tck-stream-003"):
            await updater.start_work()
            await updater.add_artifact(parts=[Part(text="Stream task lifecycle")])
            await updater.complete()
        else:
            await updater.complete(say([Part(text="Unhandled messageId prefix: " + message_id)]))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        if context.task_id is None or context.context_id is None:
            return
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()
