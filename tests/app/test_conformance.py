"""The conformance specialist follows the A2A TCK's system-under-test contract, through admission and the store."""

from __future__ import annotations

import base64
import time
import uuid

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest, TaskState
from sqlalchemy import text

from tests import http_calls
from tests.app.conftest import CONFORMANCE_HOLD_S, message, rpc
from taskstate.ids import job_id_for

pytestmark = pytest.mark.timeout(60, func_only=True)
CONFORMANCE = "conformance"


def send(edge, customer, prefix: str) -> dict:
    answer = http_calls.post(
        f"{edge.specialist(CONFORMANCE)}/jsonrpc",
        json=rpc("SendMessage", message(f"{prefix}-{uuid.uuid4()}")),
        headers=customer.headers,
        timeout=30,
    )
    assert answer.status_code == 200
    body = answer.json()
    assert "result" in body, body
    return body["result"]


def test_complete_task_completes_with_the_tck_greeting(edge_a, make_customer):
    task = send(edge_a, make_customer(), "tck-complete-task")["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["status"]["message"]["parts"][0]["text"] == "Hello from TCK"
    assert task["status"]["message"]["role"] == "ROLE_AGENT"


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("tck-artifact-text", {"text": "Generated text content"}),
        (
            "tck-artifact-file",
            {"raw": base64.b64encode(b"tck").decode(), "mediaType": "text/plain", "filename": "output.txt"},
        ),
        ("tck-artifact-file-url", {"url": "https://example.com/output.txt", "mediaType": "text/plain", "filename": "output.txt"}),
        ("tck-artifact-data", {"data": {"key": "value", "count": 42}}),
    ],
)
def test_artifact_scenarios_complete_with_one_artifact_of_their_kind(edge_a, make_customer, prefix, expected):
    task = send(edge_a, make_customer(), prefix)["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert len(task["artifacts"]) == 1
    assert task["artifacts"][0]["parts"] == [expected]


def test_message_response_answers_with_a_direct_message_and_no_task(edge_b, make_customer):
    result = send(edge_b, make_customer(), "tck-message-response")
    assert "task" not in result
    assert result["message"]["parts"][0]["text"] == "Direct message response"
    assert result["message"]["role"] == "ROLE_AGENT"


def test_input_required_moves_the_task_to_input_required(edge_a, make_customer):
    assert send(edge_a, make_customer(), "tck-input-required")["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"


def test_reject_task_rejects_with_the_word_rejected(edge_a, make_customer):
    task = send(edge_a, make_customer(), "tck-reject-task")["task"]
    assert task["status"]["state"] == "TASK_STATE_REJECTED"
    assert task["status"]["message"]["parts"][0]["text"] == "rejected"


async def stream(edge, customer, prefix: str) -> list:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {customer.key}"}, timeout=30) as http:
        card = await A2ACardResolver(http, edge.specialist(CONFORMANCE)).get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)
        request = SendMessageRequest(
            message=Message(message_id=f"{prefix}-{uuid.uuid4()}", role=Role.ROLE_USER, parts=[Part(text="go")])
        )
        return [event async for event in client.send_message(request)]


def states(events: list) -> list[str]:
    out = []
    for event in events:
        kind = event.WhichOneof("payload")
        if kind == "task":
            out.append("task")
        elif kind == "status_update":
            out.append(TaskState.Name(event.status_update.status.state))
        else:
            out.append(kind)
    return out


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("prefix", "text"),
    [
        ("tck-stream-001", "Stream hello from TCK"),
        ("tck-stream-003", "Stream task lifecycle"),
        ("tck-stream-ordering-001", "Ordered output"),
        ("tck-stream-artifact-text", "Streamed text content"),
    ],
)
async def test_stream_scenarios_stream_working_one_text_artifact_then_completed(edge_b, make_customer, prefix, text):
    events = await stream(edge_b, make_customer(), prefix)
    assert states(events) == ["task", "TASK_STATE_WORKING", "artifact_update", "TASK_STATE_COMPLETED"]
    assert events[2].artifact_update.artifact.parts[0].text == text


@pytest.mark.anyio
async def test_stream_002_streams_straight_to_completed(edge_a, make_customer):
    assert states(await stream(edge_a, make_customer(), "tck-stream-002")) == ["task", "TASK_STATE_COMPLETED"]


@pytest.mark.anyio
async def test_stream_artifact_file_streams_a_file_artifact(edge_a, make_customer):
    events = await stream(edge_a, make_customer(), "tck-stream-artifact-file")
    part = events[2].artifact_update.artifact.parts[0]
    assert (part.raw, part.media_type, part.filename) == (b"tck", "text/plain", "output.txt")


@pytest.mark.anyio
async def test_stream_artifact_chunked_streams_two_chunks_of_one_artifact(edge_a, make_customer):
    events = await stream(edge_a, make_customer(), "tck-stream-artifact-chunked")
    chunks = [e.artifact_update for e in events if e.WhichOneof("payload") == "artifact_update"]
    assert [c.artifact.parts[0].text for c in chunks] == ["chunk-1 ", "chunk-2"]
    assert chunks[0].artifact.artifact_id == chunks[1].artifact.artifact_id
    assert (chunks[1].append, chunks[1].last_chunk) == (True, True)
    assert states(events)[-1] == "TASK_STATE_COMPLETED"


def test_the_resubscribe_scenario_stays_working_before_it_completes(edge_a, make_customer):
    customer = make_customer()
    base = edge_a.specialist(CONFORMANCE)
    task = http_calls.post(
        f"{base}/message:send",
        json=message(f"test-resubscribe-message-id-{uuid.uuid4()}", returnImmediately=True),
        headers=customer.headers,
    ).json()["task"]
    seen = set()
    # Generous, since only "never" is a failure; past the hold, which the task must sit out before it completes.
    deadline = time.monotonic() + CONFORMANCE_HOLD_S + 20
    while time.monotonic() < deadline:
        state = http_calls.get(f"{base}/tasks/{task['id']}", headers=customer.headers).json()["status"]["state"]
        seen.add(state)
        if state == "TASK_STATE_COMPLETED":
            break
        time.sleep(0.1)
    assert {"TASK_STATE_WORKING", "TASK_STATE_COMPLETED"} <= seen, f"states seen: {sorted(seen)}"


def test_conformance_work_flows_through_admission_the_outbox_and_a_worker_claim(edge_a, engine, make_customer):
    customer = make_customer()
    task = send(edge_a, customer, "tck-complete-task")["task"]
    with engine.connect() as conn:
        edge_task = conn.execute(
            text("SELECT tariff_credits, reservation_id FROM edge_tasks WHERE task_id = :t"), {"t": task["id"]}
        ).one()
        outbox = conn.execute(
            text("SELECT dispatch_id, status, executor FROM dispatch_outbox WHERE task_id = :t"), {"t": task["id"]}
        ).one()
        claim = conn.execute(
            text("SELECT state, outcome, fencing_token, worker_id FROM job_claims WHERE job_id = :j"),
            {"j": job_id_for(task["id"], outbox.dispatch_id)},
        ).one()
    assert edge_task.tariff_credits == 0 and edge_task.reservation_id is None
    assert (outbox.status, outbox.executor) == ("done", "conformance")
    assert (claim.state, claim.outcome, claim.fencing_token) == ("finished", "completed", 1)
    assert claim.worker_id  # a worker ran it; the edge runs nothing
