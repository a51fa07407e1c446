"""The conformance specialist's executor: the A2A TCK's system-under-test contract, and the same scenarios by keyword.

Behaviour follows the TCK's reference SUT (a2a-tck ``sut/a2a-python``): a
``messageId`` prefix chooses the scenario, prefixes tested longest-first where
one is a prefix of another (``tck-artifact-file-url`` before
``tck-artifact-file``).

Every real A2A client (the a2a-sdk's, the JavaScript SDK's) sends random
message ids, so the same scenarios are also chosen by the first word of the
message's text (``KEYWORDS``: ``slow``, ``complete``, ``message``, ``reject``,
``fail``, ``input-required``, ``artifact-*``, ``stream-*``). A prefix wins over
a keyword, so the TCK's runs are unchanged. A message continuing a task that
asked for input completes it. The executor never creates the task (admission
already stored it) unless it runs without one.

It runs on workers like every specialist (``workers.executor_runner``), through
the same admission, dispatch, claim and settlement; the edge runs nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events.event_queue import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types.a2a_pb2 import Message, Part, Task, TaskState, TaskStatus
from google.protobuf.json_format import ParseDict
from google.protobuf.struct_pb2 import Value

TEXT_ARTIFACT = "Generated text content"
FILE_BYTES = b"tck"
FILE_URL = "https://example.com/output.txt"
DATA_ARTIFACT = {"key": "value", "count": 42}
FAILED_TEXT = "failed on request"  # the status message of the ``fail`` scenario
KEYWORD_PUNCTUATION = ":,.;!"  # stripped from the end of the first word ("slow: please" chooses slow)

# messageId prefix -> scenario, in the order they are tested (a longer prefix before its own prefix).
PREFIXES: tuple[tuple[str, str], ...] = (
    ("tck-stream-artifact-chunked", "stream-artifact-chunked"),
    ("test-resubscribe-message-id", "slow"),
    ("tck-stream-artifact-text", "stream-artifact-text"),
    ("tck-stream-artifact-file", "stream-artifact-file"),
    ("tck-stream-ordering-001", "stream-ordering-001"),
    ("tck-artifact-file-url", "artifact-file-url"),
    ("tck-message-response", "message"),
    ("tck-input-required", "input-required"),
    ("tck-complete-task", "complete"),
    ("tck-artifact-text", "artifact-text"),
    ("tck-artifact-file", "artifact-file"),
    ("tck-artifact-data", "artifact-data"),
    ("tck-reject-task", "reject"),
    ("tck-stream-001", "stream-001"),
    ("tck-stream-002", "stream-002"),
    ("tck-stream-003", "stream-003"),
)
# The first word of the text -> scenario: every scenario a prefix reaches, by its own name, plus ``fail``.
KEYWORDS: tuple[str, ...] = (
    "complete", "message", "input-required", "reject", "fail", "slow",
    "artifact-text", "artifact-file", "artifact-file-url", "artifact-data",
    "stream-001", "stream-002", "stream-003", "stream-ordering-001",
    "stream-artifact-text", "stream-artifact-file", "stream-artifact-chunked",
)

Scenario = Callable[[TaskUpdater, EventQueue], Awaitable[None]]


def _file_part() -> Part:
    return Part(raw=FILE_BYTES, media_type="text/plain", filename="output.txt")


def first_word(message: Message) -> str:
    """The first word of the message's text parts, lower case, trailing punctuation removed ('' if none)."""
    text = " ".join(p.text for p in message.parts if p.WhichOneof("content") == "text")
    words = text.split(maxsplit=1)
    return words[0].lower().rstrip(KEYWORD_PUNCTUATION) if words else ""


def choose_scenario(message: Message) -> str | None:
    """The scenario a message asks for: its messageId prefix (the TCK's contract), else its first word."""
    for prefix, scenario in PREFIXES:
        if message.message_id.startswith(prefix):
            return scenario
    word = first_word(message)
    return word if word in KEYWORDS else None


class ConformanceExecutor(AgentExecutor):
    def __init__(self, hold_working_s: float) -> None:
        self.hold_working_s = hold_working_s  # how long ``slow`` (the TCK's resubscribe scenario) works

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
        scenario = choose_scenario(message)
        if scenario is None:
            await updater.complete(updater.new_agent_message([Part(text=(
                "Unhandled messageId prefix: " + message.message_id
                + ". Start the text with one of: " + ", ".join(KEYWORDS)))]))
            return
        await self._scenarios()[scenario](updater, event_queue)

    def _scenarios(self) -> dict[str, Scenario]:
        return {
            "complete": _complete, "message": _message, "input-required": _input_required, "reject": _reject,
            "fail": _fail, "slow": self._slow,
            "artifact-text": _artifact(lambda: Part(text=TEXT_ARTIFACT)),
            "artifact-file": _artifact(_file_part),
            "artifact-file-url": _artifact(lambda: Part(url=FILE_URL, media_type="text/plain",
                                                        filename="output.txt")),
            "artifact-data": _artifact(lambda: Part(data=ParseDict(DATA_ARTIFACT, Value()))),
            "stream-001": _streamed(lambda: Part(text="Stream hello from TCK")),
            "stream-002": _stream_002,
            "stream-003": _streamed(lambda: Part(text="Stream task lifecycle")),
            "stream-ordering-001": _streamed(lambda: Part(text="Ordered output")),
            "stream-artifact-text": _streamed(lambda: Part(text="Streamed text content")),
            "stream-artifact-file": _streamed(_file_part),
            "stream-artifact-chunked": _stream_chunked,
        }

    async def _slow(self, updater: TaskUpdater, event_queue: EventQueue) -> None:
        await updater.start_work()
        await asyncio.sleep(self.hold_working_s)
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        if context.task_id is None or context.context_id is None:
            return
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


async def _complete(updater: TaskUpdater, event_queue: EventQueue) -> None:
    await updater.complete(updater.new_agent_message([Part(text="Hello from TCK")]))


async def _message(updater: TaskUpdater, event_queue: EventQueue) -> None:
    await event_queue.enqueue_event(updater.new_agent_message([Part(text="Direct message response")]))


async def _input_required(updater: TaskUpdater, event_queue: EventQueue) -> None:
    await updater.requires_input(updater.new_agent_message([Part(text="Please provide input")]))


async def _reject(updater: TaskUpdater, event_queue: EventQueue) -> None:
    await updater.reject(updater.new_agent_message([Part(text="rejected")]))


async def _fail(updater: TaskUpdater, event_queue: EventQueue) -> None:
    await updater.failed(updater.new_agent_message([Part(text=FAILED_TEXT)]))


def _artifact(part: Callable[[], Part]) -> Scenario:
    """Completes with one artifact holding ``part()``."""

    async def run(updater: TaskUpdater, event_queue: EventQueue) -> None:
        await updater.add_artifact(parts=[part()])
        await updater.complete()

    return run


def _streamed(part: Callable[[], Part]) -> Scenario:
    """Working, one artifact holding ``part()``, completed: what a streaming client sees step by step."""

    async def run(updater: TaskUpdater, event_queue: EventQueue) -> None:
        await updater.start_work()
        await updater.add_artifact(parts=[part()])
        await updater.complete()

    return run


async def _stream_002(updater: TaskUpdater, event_queue: EventQueue) -> None:
    await updater.complete()


async def _stream_chunked(updater: TaskUpdater, event_queue: EventQueue) -> None:
    await updater.start_work()
    await updater.add_artifact(parts=[Part(text="chunk-1 ")], artifact_id="chunked-artifact")
    await updater.add_artifact(parts=[Part(text="chunk-2")], artifact_id="chunked-artifact", append=True,
                               last_chunk=True)
    await updater.complete()
