"""The A2A gRPC binding through the whole hosted pipeline, with the a2a-sdk's own gRPC client.

Two real edges (`specialists serve --grpc-port`), a worker and a dispatcher on a
database of their own (tests/workers/system.py). The client finds the gRPC
interface on the card, with the specialist as its tenant, and sends the key as
``authorization`` metadata; refusals come back as the gRPC statuses of the
edge's one catalogue (app/errors.py), with the stable code in ``ErrorInfo``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import timedelta

import anyio
import grpc
import grpc.aio
import httpx
import pytest
from a2a.client import ClientCallContext, ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.client.client import Client
from a2a.types import a2a_pb2_grpc
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskState,
)
from a2a.utils.grpc_status import status_from_call
from google.protobuf.json_format import ParseDict
from google.rpc import error_details_pb2
from sqlalchemy import text

from core.settings import Settings
from ledger import keys
from ledger.client import Ledger
from tests import http_calls
from tests.conftest import TEST_SECRET
from tests.workers.system import SCRIPTED_TARIFF, System, system_on_its_own_database

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow, pytest.mark.anyio]

SCRIPTED = "scripted"
CONFORMANCE = "conformance"
# A conformance task whose messageId starts so stays WORKING this long (SPECIALISTS_CONFORMANCE_HOLD_WORKING_S):
# longer than any test here waits, so only a cancel ends it early.
HOLD_S = 60


@pytest.fixture(scope="module")
def system(server_url: str, engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    engine.dispose()
    with system_on_its_own_database(server_url, tmp_path_factory.mktemp("grpc"), workers=1, edges=("api-a", "api-b"),
                                    settings={"conformance_hold_working_s": str(HOLD_S)}) as running:
        yield running


def new_customer(system: System, credits: int = 30) -> tuple[str, str]:
    """A customer entitled to the scripted specialist: its id and key."""
    customer_id = f"c-{uuid.uuid4().hex[:12]}"
    issued = keys.issue_key(system.engine, keys.KeySigner([TEST_SECRET], "test"), customer_id=customer_id,
                            ttl=timedelta(days=1))
    Ledger(system.engine).grant(customer_id, credits, operator="tests", skills=[SCRIPTED], reason="grpc tests")
    return customer_id, issued.token


def calling_as(key: str | None) -> ClientCallContext:
    return ClientCallContext(service_parameters={"authorization": f"Bearer {key}"} if key else {}, timeout=30)


async def card_of(system: System, edge: int, specialist: str) -> AgentCard:
    async with httpx.AsyncClient(timeout=30) as http:
        return await A2ACardResolver(http, system.edges[edge].specialist(specialist)).get_agent_card()


async def grpc_client(system: System, edge: int, specialist: str = SCRIPTED, *, streaming: bool = False) -> Client:
    """The SDK's client as a customer builds it: from the card, choosing the GRPC interface."""
    config = ClientConfig(
        streaming=streaming, supported_protocol_bindings=["GRPC"], grpc_channel_factory=grpc.aio.insecure_channel
    )
    return ClientFactory(config).create(await card_of(system, edge, specialist))


def scripted(steps: list[dict], **configuration: object) -> SendMessageRequest:
    return ParseDict(
        {
            "message": {"messageId": f"m-{uuid.uuid4()}", "role": "ROLE_USER",
                        "parts": [{"data": {"script": {"steps": steps}}}]},
            "configuration": configuration,
        },
        SendMessageRequest(),
    )


async def only(events: AsyncIterator) -> object:
    answers = [event async for event in events]
    assert len(answers) == 1, answers
    return answers[0]


def refusal(error: BaseException) -> tuple[grpc.StatusCode, str, str]:
    """The gRPC status, ErrorInfo code and message of a refused call (the SDK client's error wraps the call's)."""
    call = error if isinstance(error, grpc.aio.AioRpcError) else error.__cause__
    assert isinstance(call, grpc.aio.AioRpcError), repr(error)
    status = status_from_call(call)
    infos = []
    for detail in status.details if status else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            infos.append(info)
    return call.code(), (infos[0].metadata.get("code", infos[0].reason) if infos else ""), call.details()


def settlements(system: System, task_id: str) -> list[tuple[str, int]]:
    """The journal's settlement entries for the task's reservation: (kind, credits charged)."""
    with system.engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                text("SELECT kind::text, charged FROM ledger_settlements WHERE job_id = :j"), {"j": task_id}
            )
        ]


# --- the card ---------------------------------------------------------------------------------------


async def test_every_card_lists_the_shared_grpc_interface_with_the_specialist_as_its_tenant(system):
    own = {CONFORMANCE: [(system.edges[0].conformance_grpc_address, "", "1.0")], SCRIPTED: []}  # its own listener
    for specialist in (SCRIPTED, CONFORMANCE):
        card = await card_of(system, 0, specialist)
        grpc_interfaces = [i for i in card.supported_interfaces if i.protocol_binding == "GRPC"]
        assert [(i.url, i.tenant, i.protocol_version) for i in grpc_interfaces] == [
            *own[specialist], (system.edges[0].grpc_address, specialist, "1.0")
        ]


# --- the path ------------------------------------------------------------------------------------------


async def test_a_blocking_send_over_grpc_runs_on_a_worker_and_answers_the_finished_task_settled_once(system):
    customer_id, key = new_customer(system)
    client = await grpc_client(system, 0)
    answer = await only(client.send_message(
        scripted([{"op": "artifact", "text": "the report"}, {"op": "complete", "text": "done"}]),
        context=calling_as(key),
    ))
    task = answer.task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
    assert [a.parts[0].text for a in task.artifacts] == ["the report"]
    fetched = await grpc_client(system, 1)
    again = await fetched.get_task(GetTaskRequest(id=task.id), context=calling_as(key))
    assert again.status.state == TaskState.TASK_STATE_COMPLETED
    assert settlements(system, task.id) == [("settle", SCRIPTED_TARIFF)]
    assert Ledger(system.engine).verify(customer_id) == []


async def test_a_task_created_over_grpc_on_one_instance_is_cancelled_over_grpc_on_the_other(system):
    customer_id, key = new_customer(system)
    request = scripted([{"op": "progress", "text": "started"}, {"op": "sleep", "seconds": 60}], returnImmediately=True)
    created = await only((await grpc_client(system, 0)).send_message(request, context=calling_as(key)))
    task_id = created.task.id
    other = await grpc_client(system, 1)
    system.wait_for("the task to work", lambda: http_state(system, key, task_id) == "TASK_STATE_WORKING")
    cancelled = await other.cancel_task(CancelTaskRequest(id=task_id), context=calling_as(key))
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    fetched = await other.get_task(GetTaskRequest(id=task_id), context=calling_as(key))
    assert fetched.status.state == TaskState.TASK_STATE_CANCELED
    system.wait_for("the reservation to be resolved",
                    lambda: Ledger(system.engine).reservation(task_id).state != "held")
    assert Ledger(system.engine).verify(customer_id) == []


def http_state(system: System, key: str, task_id: str) -> str:
    answer = http_calls.get(f"{system.edges[1].specialist(SCRIPTED)}/tasks/{task_id}",
                            headers={"Authorization": f"Bearer {key}", "A2A-Version": "1.0"})
    return answer.json()["status"]["state"]


async def test_a_streaming_send_over_grpc_relays_progress_artifacts_and_the_end(system):
    _, key = new_customer(system)
    client = await grpc_client(system, 1, streaming=True)
    events = [event async for event in client.send_message(
        scripted([{"op": "progress", "text": "reading"}, {"op": "artifact", "text": "the report"},
                  {"op": "complete", "text": "all good"}]),
        context=calling_as(key),
    )]
    kinds = [event.WhichOneof("payload") for event in events]
    assert kinds[0] == "task" and "artifact_update" in kinds
    artifacts = [e.artifact_update.artifact.parts[0].text for e in events
                 if e.WhichOneof("payload") == "artifact_update"]
    assert artifacts == ["the report"]
    last = events[-1].status_update.status
    assert last.state == TaskState.TASK_STATE_COMPLETED and last.message.parts[0].text == "all good"


async def test_a_held_conformance_task_is_cancelled_over_grpc(system):
    _, key = new_customer(system)
    client = await grpc_client(system, 0, CONFORMANCE)
    message = Message(message_id=f"test-resubscribe-message-id-{uuid.uuid4()}", role=Role.ROLE_USER,
                      parts=[Part(text="hold")])
    request = SendMessageRequest(message=message, configuration=SendMessageConfiguration(return_immediately=True))
    created = await only(client.send_message(request, context=calling_as(key)))
    task_id = created.task.id
    other = await grpc_client(system, 1, CONFORMANCE)

    async def state() -> int:
        return (await other.get_task(GetTaskRequest(id=task_id), context=calling_as(key))).status.state

    await wait_async(state, TaskState.TASK_STATE_WORKING)
    cancelled = await other.cancel_task(CancelTaskRequest(id=task_id), context=calling_as(key))
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    assert await state() == TaskState.TASK_STATE_CANCELED


async def wait_async(read: Callable[[], Awaitable[object]], wanted: object, timeout_s: float = 30.0) -> None:
    """Poll ``read()`` until it equals ``wanted``, under a deadline (the task's state is the observable fact)."""
    with anyio.fail_after(timeout_s):
        while await read() != wanted:
            await anyio.sleep(0.05)


# --- refusals --------------------------------------------------------------------------------------------


async def test_a_call_without_a_key_or_with_a_bad_one_is_unauthenticated(system):
    _, key = new_customer(system)
    tampered = key[:-2] + ("A" if key[-2] != "A" else "B") + key[-1]
    client = await grpc_client(system, 0)
    for context, code in ((calling_as(None), "key_required"), (calling_as("sk_test_nope"), "key_malformed"),
                          (calling_as(tampered), "key_tampered"),
                          (ClientCallContext(service_parameters={"authorization": "Basic abc"}), "key_malformed")):
        with pytest.raises(Exception) as refused:
            await only(client.send_message(scripted([{"op": "complete", "text": "x"}]), context=context))
        status, reason, message = refusal(refused.value)
        assert status == grpc.StatusCode.UNAUTHENTICATED, (status, message)
        assert reason == code, (reason, message)
        assert "key" in message.lower()


async def test_another_customers_task_is_not_found_over_grpc(system):
    _, owner_key = new_customer(system)
    _, other_key = new_customer(system)
    client = await grpc_client(system, 0)
    created = await only(client.send_message(
        scripted([{"op": "complete", "text": "mine"}], returnImmediately=True), context=calling_as(owner_key)
    ))
    for call in (lambda: client.get_task(GetTaskRequest(id=created.task.id), context=calling_as(other_key)),
                 lambda: client.cancel_task(CancelTaskRequest(id=created.task.id), context=calling_as(other_key))):
        with pytest.raises(Exception) as refused:
            await call()
        assert refusal(refused.value)[0] == grpc.StatusCode.NOT_FOUND


async def test_an_unknown_or_missing_tenant_is_not_found_with_a_message_that_says_what_to_set(system):
    _, key = new_customer(system)
    async with grpc.aio.insecure_channel(system.edges[0].grpc_address) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)
        for tenant in ("no-such-specialist", ""):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetTask(GetTaskRequest(id="t-1", tenant=tenant),
                                   metadata=(("authorization", f"Bearer {key}"),), timeout=30)
            status, code, message = refusal(refused.value)
            assert (status, code) == (grpc.StatusCode.NOT_FOUND, "specialist_not_found")
            assert "tenant" in message and (tenant in message)


async def test_a_message_over_the_body_limit_or_a_field_over_its_cap_is_refused_before_admission(system):
    customer_id, key = new_customer(system)
    client = await grpc_client(system, 0)
    limit = Settings().edge.max_request_body_bytes
    huge = Message(message_id=f"m-{uuid.uuid4()}", role=Role.ROLE_USER, parts=[Part(text="x" * (limit + 1))])
    with pytest.raises(Exception) as refused:
        await only(client.send_message(SendMessageRequest(message=huge), context=calling_as(key)))
    status, code, message = refusal(refused.value)
    assert code == "payload_too_large" and "SPECIALISTS_MAX_REQUEST_BODY_BYTES" in message, (status, message)
    long_name = Message(message_id=f"m-{uuid.uuid4()}", role=Role.ROLE_USER,
                        parts=[Part(text="x", filename="f" * (Settings().edge.max_name_chars + 1))])
    with pytest.raises(Exception) as refused:
        await only(client.send_message(SendMessageRequest(message=long_name), context=calling_as(key)))
    status, _, message = refusal(refused.value)
    assert status == grpc.StatusCode.INVALID_ARGUMENT and "SPECIALISTS_MAX_NAME_CHARS" in message, message
    assert Ledger(system.engine).verify(customer_id) == []


async def test_a_request_of_too_many_values_or_a_non_finite_number_is_refused_as_over_http(system):
    customer_id, key = new_customer(system)
    client = await grpc_client(system, 0)
    limit = Settings().edge.max_body_elements
    many = Message(message_id=f"m-{uuid.uuid4()}", role=Role.ROLE_USER, parts=[Part(text="x")] * (limit + 1))
    with pytest.raises(Exception) as refused:
        await only(client.send_message(SendMessageRequest(message=many), context=calling_as(key)))
    _, code, message = refusal(refused.value)
    assert code == "body_elements_over_limit" and "SPECIALISTS_MAX_BODY_ELEMENTS" in message, message
    not_a_number = Message(message_id=f"m-{uuid.uuid4()}", role=Role.ROLE_USER, parts=[Part(text="x")])
    not_a_number.metadata.update({"score": float("nan")})
    with pytest.raises(Exception) as refused:
        await only(client.send_message(SendMessageRequest(message=not_a_number), context=calling_as(key)))
    status, code, message = refusal(refused.value)
    assert (status, code) == (grpc.StatusCode.INVALID_ARGUMENT, "number_not_finite"), message
    assert "message.metadata.score" in message
    assert Ledger(system.engine).verify(customer_id) == []


# --- Idempotency-Key as metadata ------------------------------------------------------------------------


def with_key(key: str, idempotency_key: str) -> ClientCallContext:
    return ClientCallContext(
        service_parameters={"authorization": f"Bearer {key}", "idempotency-key": idempotency_key}, timeout=30
    )


def reservations_of(system: System, customer_id: str) -> int:
    with system.engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM ledger_reservations WHERE customer_id = :c"), {"c": customer_id}
        ).scalar_one()


async def test_an_idempotency_key_in_metadata_replays_across_instances_and_refuses_other_content(system):
    customer_id, key = new_customer(system)
    idempotency_key = f"retry-{uuid.uuid4()}"
    first = await only((await grpc_client(system, 0)).send_message(
        scripted([{"op": "complete", "text": "once"}]), context=with_key(key, idempotency_key)))
    # A resend after a lost answer: a new messageId (as SDK clients make), the same key and content, the other
    # instance. It replays the first task: no second task, no second reservation.
    replayed = await only((await grpc_client(system, 1)).send_message(
        scripted([{"op": "complete", "text": "once"}]), context=with_key(key, idempotency_key)))
    assert replayed.task.id == first.task.id
    assert replayed.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert reservations_of(system, customer_id) == 1
    with pytest.raises(Exception) as refused:
        await only((await grpc_client(system, 1)).send_message(
            scripted([{"op": "complete", "text": "other content"}]), context=with_key(key, idempotency_key)))
    status, code, message = refusal(refused.value)
    assert (status, code) == (grpc.StatusCode.ALREADY_EXISTS, "idempotency_key_conflict"), message
    assert reservations_of(system, customer_id) == 1
    assert Ledger(system.engine).verify(customer_id) == []


async def test_a_conformance_task_whose_text_says_slow_works_until_it_is_cancelled_over_grpc(system):
    # A foreign SDK sends random messageIds; the first word of the text chooses the scenario.
    _, key = new_customer(system)
    client = await grpc_client(system, 1, CONFORMANCE)
    message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text="slow please")])
    request = SendMessageRequest(message=message, configuration=SendMessageConfiguration(return_immediately=True))
    task_id = (await only(client.send_message(request, context=calling_as(key)))).task.id

    async def state() -> int:
        return (await client.get_task(GetTaskRequest(id=task_id), context=calling_as(key))).status.state

    await wait_async(state, TaskState.TASK_STATE_WORKING)
    cancelled = await client.cancel_task(CancelTaskRequest(id=task_id), context=calling_as(key))
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
