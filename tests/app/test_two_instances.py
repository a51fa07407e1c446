"""Two service processes on one database behave as one service, through the a2a-sdk client and plain HTTP.

A task sent to instance A is read, listed, streamed and canceled through
instance B, over JSON-RPC and over HTTP+JSON. The conformance specialist does
the work (the in-process runner of whichever instance claims it).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from sqlalchemy import Engine, text

from tests.app.conftest import CONFORMANCE_HOLD_S, message
from taskstate.ids import job_id_sql

pytestmark = [pytest.mark.timeout(60, func_only=True), pytest.mark.anyio]
CONFORMANCE = "conformance"
# How long a test waits for something the service owes it (a state, the end of a run): generous, since only
# "never" is a failure; past the conformance hold, so that a runner left to itself has ended by then.
WAIT_TIMEOUT_S = CONFORMANCE_HOLD_S + 20


def new_message(prefix: str, **fields: str) -> Message:
    return Message(message_id=f"{prefix}-{uuid.uuid4()}", role=Role.ROLE_USER, parts=[Part(text="hello")], **fields)


async def sdk_client(edge, customer, binding: str, *, streaming: bool = False):
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {customer.key}"}, timeout=30)
    card = await A2ACardResolver(http, edge.specialist(CONFORMANCE)).get_agent_card()
    config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding], streaming=streaming)
    return ClientFactory(config).create(card), http


async def one(client, request: SendMessageRequest):
    events = [event async for event in client.send_message(request)]
    assert len(events) == 1
    return events[0]


async def wait_for_state(client, task_id: str, state: int, timeout_s: float = WAIT_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        task = await client.get_task(GetTaskRequest(id=task_id))
        if task.status.state == state:
            return task
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} never reached {TaskState.Name(state)} within {timeout_s:g} s")


async def wait_for_the_run_to_end(engine: Engine, task_id: str) -> None:
    """Until the task's job claim is no longer running: its runner can write nothing after that."""
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            ended = conn.execute(
                text("SELECT c.state FROM job_claims c "
                     f"JOIN dispatch_outbox o ON c.job_id = {job_id_sql('o')} "
                     "WHERE o.task_id = :t AND c.state IN ('finished', 'unknown')"),
                {"t": task_id},
            ).first()
        if ended is not None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the job of task {task_id} was still running after {WAIT_TIMEOUT_S:g} s")


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
async def test_a_task_sent_to_one_instance_is_read_and_listed_through_the_other(edge_a, edge_b, make_customer, binding):
    customer = make_customer()
    on_a, http_a = await sdk_client(edge_a, customer, binding)
    on_b, http_b = await sdk_client(edge_b, customer, binding)
    try:
        sent = await one(on_a, SendMessageRequest(message=new_message("tck-complete-task")))
        task = sent.task
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert task.status.message.parts[0].text == "Hello from TCK"
        fetched = await on_b.get_task(GetTaskRequest(id=task.id))
        assert fetched.id == task.id and fetched.status.state == TaskState.TASK_STATE_COMPLETED
        listed = await on_b.list_tasks(ListTasksRequest())
        assert task.id in [t.id for t in listed.tasks]
    finally:
        await on_a.close()  # their gRPC channels: a channel left open outlives the test's event loop
        await on_b.close()
        await http_a.aclose()
        await http_b.aclose()


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
async def test_a_task_started_on_one_instance_streams_to_a_subscriber_on_the_other(edge_a, edge_b, make_customer, binding):
    customer = make_customer()
    on_a, http_a = await sdk_client(edge_a, customer, binding)
    on_b, http_b = await sdk_client(edge_b, customer, binding, streaming=True)
    try:
        request = SendMessageRequest(message=new_message("test-resubscribe-message-id"))
        request.configuration.return_immediately = True
        task_id = (await one(on_a, request)).task.id
        await wait_for_state(on_a, task_id, TaskState.TASK_STATE_WORKING)
        seen = [event async for event in on_b.subscribe(SubscribeToTaskRequest(id=task_id))]
        assert seen[0].task.id == task_id
        assert seen[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    finally:
        await on_a.close()  # their gRPC channels: a channel left open outlives the test's event loop
        await on_b.close()
        await http_a.aclose()
        await http_b.aclose()


async def test_a_streamed_send_on_one_instance_relays_every_event(edge_a, make_customer):
    customer = make_customer()
    client, http = await sdk_client(edge_a, customer, "JSONRPC", streaming=True)
    try:
        events = [e async for e in client.send_message(SendMessageRequest(message=new_message("tck-stream-001")))]
    finally:
        await client.close()
        await http.aclose()
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds == ["task", "status_update", "artifact_update", "status_update"]
    assert events[1].status_update.status.state == TaskState.TASK_STATE_WORKING
    assert events[2].artifact_update.artifact.parts[0].text == "Stream hello from TCK"
    assert events[3].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_a_running_task_is_canceled_through_the_other_instance_and_stays_canceled(
    edge_a, edge_b, engine, make_customer
):
    customer = make_customer()
    on_a, http_a = await sdk_client(edge_a, customer, "JSONRPC")
    on_b, http_b = await sdk_client(edge_b, customer, "HTTP+JSON")
    try:
        request = SendMessageRequest(message=new_message("test-resubscribe-message-id"))
        request.configuration.return_immediately = True
        task_id = (await one(on_a, request)).task.id
        await wait_for_state(on_b, task_id, TaskState.TASK_STATE_WORKING)
        canceled = await on_b.cancel_task(CancelTaskRequest(id=task_id))
        assert canceled.status.state == TaskState.TASK_STATE_CANCELED
        await wait_for_the_run_to_end(engine, task_id)  # whatever the runner did, it did: it must not have completed it
        assert (await on_a.get_task(GetTaskRequest(id=task_id))).status.state == TaskState.TASK_STATE_CANCELED
    finally:
        await on_a.close()  # their gRPC channels: a channel left open outlives the test's event loop
        await on_b.close()
        await http_a.aclose()
        await http_b.aclose()


async def test_a_follow_up_carrying_only_the_task_id_continues_the_task_on_the_other_instance(
    edge_a, edge_b, make_customer
):
    customer = make_customer()
    on_a, http_a = await sdk_client(edge_a, customer, "JSONRPC")
    on_b, http_b = await sdk_client(edge_b, customer, "HTTP+JSON")
    try:
        first = (await one(on_a, SendMessageRequest(message=new_message("tck-input-required")))).task
        assert first.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        follow_up = new_message("answer", task_id=first.id)  # no contextId
        done = (await one(on_b, SendMessageRequest(message=follow_up))).task
        assert done.id == first.id
        assert done.context_id == first.context_id
        assert done.status.state == TaskState.TASK_STATE_COMPLETED
        assert [m.context_id for m in done.history] == [first.context_id] * len(done.history)
        assert done.history[-1].message_id == follow_up.message_id or any(
            m.message_id == follow_up.message_id for m in done.history
        )
    finally:
        await on_a.close()  # their gRPC channels: a channel left open outlives the test's event loop
        await on_b.close()
        await http_a.aclose()
        await http_b.aclose()


def test_a_plain_http_json_client_sends_gets_lists_and_cancels(edge_a, edge_b, make_customer):
    customer = make_customer()
    base_a, base_b = edge_a.specialist(CONFORMANCE), edge_b.specialist(CONFORMANCE)
    with httpx.Client(headers=customer.headers, timeout=30) as http:
        sent = http.post(f"{base_a}/message:send", json=message(f"tck-artifact-text-{uuid.uuid4()}"))
        assert sent.status_code == 200, sent.text
        assert sent.headers["content-type"].startswith("application/a2a+json")
        task = sent.json()["task"]
        assert task["artifacts"][0]["parts"][0]["text"] == "Generated text content"
        got = http.get(f"{base_b}/tasks/{task['id']}")
        assert got.json()["status"]["state"] == "TASK_STATE_COMPLETED"
        listed = http.get(f"{base_b}/tasks", params={"pageSize": 10})
        assert task["id"] in [t["id"] for t in listed.json()["tasks"]]
        waiting = http.post(
            f"{base_a}/message:send", json=message(f"tck-input-required-{uuid.uuid4()}")
        ).json()["task"]
        canceled = http.post(f"{base_b}/tasks/{waiting['id']}:cancel", json={})
        assert canceled.json()["status"]["state"] == "TASK_STATE_CANCELED"
