"""A foreign client reaches every conformance scenario by the first word of its text, with random message ids.

The official a2a-sdk client on JSON-RPC and on HTTP+JSON (and gRPC where a test says so), through the whole
hosted pipeline (edge, admission, dispatcher, worker claim, executor): the
message ids are plain UUIDs, as every real SDK sends them, so only the text
chooses. A ``slow`` task works long enough to be canceled.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import grpc.aio
import httpx
import pytest
from a2a.client import ClientCallContext, ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.types.a2a_pb2 import CancelTaskRequest, GetTaskRequest, Message, Part, Role, SendMessageRequest, TaskState
from google.protobuf.json_format import MessageToDict

from tests.app.test_two_instances import wait_for_state
from workers.conformance import DATA_ARTIFACT, FAILED_TEXT, FILE_URL, KEYWORDS, TEXT_ARTIFACT

pytestmark = [pytest.mark.timeout(60, func_only=True), pytest.mark.anyio]
CONFORMANCE = "conformance"
BINDINGS = ["JSONRPC", "HTTP+JSON"]
S = TaskState

# keyword -> (final state, the status message's text or None, the one artifact's parts or None)
ANSWERS = {
    "complete": (S.TASK_STATE_COMPLETED, "Hello from TCK", None),
    "input-required": (S.TASK_STATE_INPUT_REQUIRED, "Please provide input", None),
    "reject": (S.TASK_STATE_REJECTED, "rejected", None),
    "fail": (S.TASK_STATE_FAILED, FAILED_TEXT, None),
    "artifact-text": (S.TASK_STATE_COMPLETED, None, [{"text": TEXT_ARTIFACT}]),
    "artifact-file": (S.TASK_STATE_COMPLETED, None,
                      [{"raw": "dGNr", "mediaType": "text/plain", "filename": "output.txt"}]),
    "artifact-file-url": (S.TASK_STATE_COMPLETED, None,
                          [{"url": FILE_URL, "mediaType": "text/plain", "filename": "output.txt"}]),
    "artifact-data": (S.TASK_STATE_COMPLETED, None, [{"data": DATA_ARTIFACT}]),
}
# keyword -> the events a streaming client sees (the task, then status and artifact updates)
STREAMS = {
    "stream-001": ["task", "WORKING", "artifact:Stream hello from TCK", "COMPLETED"],
    "stream-002": ["task", "COMPLETED"],
    "stream-003": ["task", "WORKING", "artifact:Stream task lifecycle", "COMPLETED"],
    "stream-ordering-001": ["task", "WORKING", "artifact:Ordered output", "COMPLETED"],
    "stream-artifact-text": ["task", "WORKING", "artifact:Streamed text content", "COMPLETED"],
    "stream-artifact-file": ["task", "WORKING", "artifact:file output.txt", "COMPLETED"],
    "stream-artifact-chunked": ["task", "WORKING", "artifact:chunk-1 ", "artifact:chunk-2", "COMPLETED"],
}


def test_every_keyword_is_tested_here() -> None:
    assert set(KEYWORDS) == set(ANSWERS) | set(STREAMS) | {"message", "slow"}


def random_message(text: str) -> Message:
    return Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)])


@asynccontextmanager
async def sdk_client(edge, customer, binding: str, *, streaming: bool = False) -> AsyncIterator:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {customer.key}"}, timeout=30) as http:
        card = await A2ACardResolver(http, edge.specialist(CONFORMANCE)).get_agent_card()
        config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding], streaming=streaming,
                              grpc_channel_factory=grpc.aio.insecure_channel)
        client = ClientFactory(config).create(card)
        try:
            yield client
        finally:
            await client.close()  # its gRPC channel: one left open outlives the test's event loop, and a late
            # event of it was scheduled on that closed loop during a later test (RuntimeError: Event loop is closed)


def key_of(customer) -> ClientCallContext:
    """The key as gRPC metadata (the HTTP bindings carry it in the httpx client's headers)."""
    return ClientCallContext(service_parameters={"authorization": f"Bearer {customer.key}"}, timeout=30)


async def send_once(client, request: SendMessageRequest):
    events = [event async for event in client.send_message(request)]
    assert len(events) == 1, events
    return events[0]


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("keyword", sorted(ANSWERS))
async def test_the_first_word_chooses_the_scenario(edge_a, make_customer, keyword, binding):
    state, status_text, artifact_parts = ANSWERS[keyword]
    async with sdk_client(edge_a, make_customer(), binding) as client:
        task = (await send_once(client, SendMessageRequest(message=random_message(f"{keyword} please")))).task
    assert task.status.state == state, TaskState.Name(task.status.state)
    if status_text is not None:
        assert [p.text for p in task.status.message.parts] == [status_text]
    if artifact_parts is not None:
        assert [MessageToDict(a)["parts"] for a in task.artifacts] == [artifact_parts]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_message_answers_with_a_direct_message_and_no_task(edge_a, make_customer, binding):
    async with sdk_client(edge_a, make_customer(), binding) as client:
        answer = await send_once(client, SendMessageRequest(message=random_message("Message: just say something")))
    assert answer.WhichOneof("payload") == "message"
    assert [p.text for p in answer.message.parts] == ["Direct message response"]


@pytest.mark.parametrize("binding, message_id, text", [
    ("JSONRPC", None, "message"),
    ("HTTP+JSON", None, "message"),
    ("GRPC", None, "message"),
    ("GRPC", "tck-message-response-x1", "hello"),  # the kit's way: the messageId chooses
])
async def test_a_streamed_send_answered_with_a_direct_message_streams_that_message_alone(
    edge_a, make_customer, binding, message_id, text
):
    """Spec 3.1.2: a stream whose answer is a Message is exactly that Message, then closed: no task before it."""
    customer = make_customer()
    request = SendMessageRequest(message=random_message(text))
    if message_id:
        request.message.message_id = f"{message_id}-{uuid.uuid4().hex[:8]}"
    async with sdk_client(edge_a, customer, binding, streaming=True) as client:
        events = [event async for event in client.send_message(request, context=key_of(customer))]
    assert [step(e) for e in events] == ["message"]
    assert [p.text for p in events[0].message.parts] == ["Direct message response"]


def step(event) -> str:
    kind = event.WhichOneof("payload")
    if kind == "status_update":
        return TaskState.Name(event.status_update.status.state).removeprefix("TASK_STATE_")
    if kind == "artifact_update":
        part = event.artifact_update.artifact.parts[0]
        return f"artifact:{part.text}" if part.WhichOneof("content") == "text" else f"artifact:file {part.filename}"
    return kind


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("keyword", sorted(STREAMS))
async def test_the_first_word_chooses_the_streamed_scenario(edge_a, make_customer, keyword, binding):
    async with sdk_client(edge_a, make_customer(), binding, streaming=True) as client:
        request = SendMessageRequest(message=random_message(keyword))
        events = [event async for event in client.send_message(request)]
    assert [step(e) for e in events] == STREAMS[keyword]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_slow_task_works_long_enough_to_be_canceled(edge_a, make_customer, binding):
    async with sdk_client(edge_a, make_customer(), binding) as client:
        request = SendMessageRequest(message=random_message("slow review of nothing in particular"))
        request.configuration.return_immediately = True
        task_id = (await send_once(client, request)).task.id
        await wait_for_state(client, task_id, S.TASK_STATE_WORKING)
        canceled = await client.cancel_task(CancelTaskRequest(id=task_id))
        assert canceled.status.state == S.TASK_STATE_CANCELED
        assert (await client.get_task(GetTaskRequest(id=task_id))).status.state == S.TASK_STATE_CANCELED
