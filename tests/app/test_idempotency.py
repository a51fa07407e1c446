"""Explicit idempotency over the real edge: the Idempotency-Key header, each specialist's policy, the replay of a
direct Message, and the pruning of expired keys, through the official a2a-sdk client on both HTTP bindings."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest, TaskState
from sqlalchemy import Engine, text

from app.errors import register_with_sdk
from core.specs import SpecInvalid, load_spec
from tests import http_calls
from tests.app.conftest import PAID, PAID_SPEC, PAID_TARIFF, footprint, message, rpc
from workers.dispatch.pruner import prune_idempotency_keys

pytestmark = [pytest.mark.timeout(60, func_only=True), pytest.mark.anyio]
CONFORMANCE = "conformance"
BINDINGS = ["JSONRPC", "HTTP+JSON"]
IDEMPOTENCY_EXTENSION = "urn:specialists:extension:idempotency:v1"


async def sdk_client(edge, customer, specialist: str, binding: str, *, key: str | None = None,
                     streaming: bool = False):
    headers = {"Authorization": f"Bearer {customer.key}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    http = httpx.AsyncClient(headers=headers, timeout=30)
    card = await A2ACardResolver(http, edge.specialist(specialist)).get_agent_card()
    config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding], streaming=streaming)
    return ClientFactory(config).create(card), http


def request(message_id: str | None = None, text_: str = "hello", *, immediately: bool = False) -> SendMessageRequest:
    sent = SendMessageRequest(
        message=Message(message_id=message_id or f"m-{uuid.uuid4()}", role=Role.ROLE_USER, parts=[Part(text=text_)])
    )
    sent.configuration.return_immediately = immediately
    return sent


async def send(edge, customer, specialist: str, binding: str, sent: SendMessageRequest, *, key: str | None = None,
               streaming: bool = False) -> list:
    """Every event the SDK client yields for one send (one, for a blocking send)."""
    client, http = await sdk_client(edge, customer, specialist, binding, key=key, streaming=streaming)
    try:
        return [event async for event in client.send_message(sent)]
    finally:
        await client.close()  # its gRPC channel: a channel left open outlives the test's event loop
        await http.aclose()


def raw_send(edge, customer, specialist: str, binding: str, body: dict, key: str | bytes) -> httpx.Response:
    headers = {**customer.headers, "Idempotency-Key": key}
    if binding == "JSONRPC":
        return http_calls.post(f"{edge.specialist(specialist)}/jsonrpc", json=rpc("SendMessage", body),
                               headers=headers, timeout=30)
    return http_calls.post(f"{edge.specialist(specialist)}/message:send", json=body, headers=headers, timeout=30)


def error_of(answer: httpx.Response, binding: str) -> tuple[int, str]:
    """The refusal's JSON-RPC code (HTTP+JSON: its HTTP status) and its stable code."""
    error = answer.json()["error"]
    if binding == "JSONRPC":
        details = error["data"] if isinstance(error["data"], list) else [error["data"]]
        code = next(d["metadata"]["code"] if "metadata" in d else d["code"] for d in details)
        return error["code"], code
    return answer.status_code, error["details"][0]["metadata"]["code"]


def available(ledger, customer) -> int:
    return ledger.account(customer.customer_id).available


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_resend_with_the_same_key_replays_the_first_task_and_reserves_nothing_more(
    edge_a, engine, ledger, make_customer, binding
):
    customer = make_customer(credits=50)
    key = str(uuid.uuid4())
    # An agent that retries after a timeout may mint a new messageId: the key and the content make it a resend.
    first = await send(edge_a, customer, PAID, binding, request("first-try", immediately=True), key=key)
    again = await send(edge_a, customer, PAID, binding, request("second-try", immediately=True), key=key)
    assert first[0].task.id == again[0].task.id
    assert footprint(engine, customer.customer_id) == {
        "tasks": 1, "task_rows": 1, "outbox": 1, "messages": 1, "reservations": 1
    }
    assert available(ledger, customer) == 50 - PAID_TARIFF


@pytest.mark.parametrize("binding", BINDINGS)
async def test_the_same_key_with_other_content_is_refused_and_leaves_nothing(edge_a, engine, make_customer, binding):
    customer = make_customer(credits=50)
    key = str(uuid.uuid4())
    await send(edge_a, customer, PAID, binding, request(text_="one", immediately=True), key=key)
    before = footprint(engine, customer.customer_id)
    register_with_sdk()  # the HTTP+JSON client maps an ErrorInfo reason to a class through the SDK's table
    with pytest.raises(Exception, match="already used with other content"):
        await send(edge_a, customer, PAID, binding, request(text_="two", immediately=True), key=key)
    answer = raw_send(edge_a, customer, PAID, binding, message(text="two", returnImmediately=True), key)
    assert error_of(answer, binding) == ((-40905 if binding == "JSONRPC" else 409), "idempotency_key_conflict")
    assert "a new key" in answer.text  # what to do about it
    assert footprint(engine, customer.customer_id) == before


async def test_a_key_used_on_one_instance_replays_on_the_other_and_over_the_other_binding(
    edge_a, edge_b, engine, ledger, make_customer
):
    customer = make_customer(credits=50)
    key = str(uuid.uuid4())
    first = await send(edge_a, customer, PAID, "JSONRPC", request(immediately=True), key=key)
    again = await send(edge_b, customer, PAID, "HTTP+JSON", request(immediately=True), key=key)
    assert first[0].task.id == again[0].task.id
    assert footprint(engine, customer.customer_id)["reservations"] == 1
    assert available(ledger, customer) == 50 - PAID_TARIFF


@pytest.mark.parametrize("binding", BINDINGS)
async def test_the_key_only_specialist_answers_a_reused_message_id_with_a_new_task(edge_a, make_customer, binding):
    customer = make_customer()
    reused = f"tck-complete-task-{uuid.uuid4()}"  # the TCK reuses ids across tests that expect new tasks
    first = await send(edge_a, customer, CONFORMANCE, binding, request(reused))
    second = await send(edge_a, customer, CONFORMANCE, binding, request(reused))
    assert first[0].task.id != second[0].task.id
    assert second[0].task.status.state == TaskState.TASK_STATE_COMPLETED
    key = str(uuid.uuid4())
    keyed = await send(edge_a, customer, CONFORMANCE, binding, request(reused), key=key)
    replayed = await send(edge_a, customer, CONFORMANCE, binding, request(reused), key=key)
    assert keyed[0].task.id == replayed[0].task.id not in (first[0].task.id, second[0].task.id)


async def test_the_message_id_specialist_still_replays_a_reused_message_id_and_a_new_key_then_names_it(
    edge_a, engine, ledger, make_customer
):
    customer = make_customer(credits=50)
    reused = f"m-{uuid.uuid4()}"
    first = await send(edge_a, customer, PAID, "JSONRPC", request(reused, immediately=True))
    again = await send(edge_a, customer, PAID, "HTTP+JSON", request(reused, immediately=True))
    assert first[0].task.id == again[0].task.id
    # A key first seen on a resend of that messageId replays the same task, and keeps doing so under a new id.
    key = str(uuid.uuid4())
    keyed = await send(edge_a, customer, PAID, "JSONRPC", request(reused, immediately=True), key=key)
    by_key = await send(edge_a, customer, PAID, "JSONRPC", request(immediately=True), key=key)
    assert keyed[0].task.id == by_key[0].task.id == first[0].task.id
    with pytest.raises(Exception, match="already sent with other content"):
        await send(edge_a, customer, PAID, "JSONRPC", request(reused, "other", immediately=True))
    assert footprint(engine, customer.customer_id)["reservations"] == 1
    assert available(ledger, customer) == 50 - PAID_TARIFF


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_replay_of_a_direct_message_answer_is_that_message_on_blocking_and_streaming_sends(
    edge_b, make_customer, binding
):
    customer = make_customer()
    key = str(uuid.uuid4())
    first = await send(edge_b, customer, CONFORMANCE, binding, request(f"tck-message-response-{uuid.uuid4()}"),
                       key=key)
    assert first[0].WhichOneof("payload") == "message"
    assert first[0].message.parts[0].text == "Direct message response"
    replayed = await send(edge_b, customer, CONFORMANCE, binding, request(f"tck-message-response-{uuid.uuid4()}"),
                          key=key)
    assert [e.WhichOneof("payload") for e in replayed] == ["message"]
    assert replayed[0].message == first[0].message
    streamed = await send(edge_b, customer, CONFORMANCE, binding, request(f"tck-message-response-{uuid.uuid4()}"),
                          key=key, streaming=True)
    assert [e.WhichOneof("payload") for e in streamed] == ["message"]
    assert streamed[0].message == first[0].message


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize(
    ("key", "problem"),
    [("k" * 256, "256 characters"), ("", "is empty"), ("cl\xe9".encode("latin-1"), "not printable ASCII")],
    ids=["too-long", "empty", "not-ascii"],
)
async def test_a_bad_key_is_refused_with_a_stable_code_and_leaves_nothing(
    edge_a, engine, make_customer, binding, key, problem
):
    customer = make_customer(credits=50)
    answer = raw_send(edge_a, customer, PAID, binding, message(returnImmediately=True), key)
    assert error_of(answer, binding) == ((-32602 if binding == "JSONRPC" else 400), "idempotency_key_invalid")
    assert problem in answer.text
    assert footprint(engine, customer.customer_id)["tasks"] == 0


def key_rows(engine: Engine, customer_id: str) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(
            text("SELECT idempotency_key, task_id FROM edge_idempotency_keys WHERE customer_key = :c"),
            {"c": customer_id},
        ).all())


def expire(engine: Engine, customer_id: str, key: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE edge_idempotency_keys SET expires_at = now() - interval '1 second' "
                 "WHERE customer_key = :c AND idempotency_key = :k"),
            {"c": customer_id, "k": key},
        )


async def test_pruning_removes_expired_keys_only_and_an_expired_key_starts_a_new_task(edge_a, engine, make_customer):
    customer = make_customer(credits=50)
    old, live, lapsed = (f"{name}-{uuid.uuid4()}" for name in ("old", "live", "lapsed"))
    for key in (old, live, lapsed):
        await send(edge_a, customer, PAID, "HTTP+JSON", request(immediately=True), key=key)
    expire(engine, customer.customer_id, old)
    expire(engine, customer.customer_id, lapsed)
    # An expired key is gone for admission before any prune reaches it: its next use is a new task.
    before = key_rows(engine, customer.customer_id)
    renewed = await send(edge_a, customer, PAID, "HTTP+JSON", request(immediately=True), key=lapsed)
    assert renewed[0].task.id != before[lapsed]
    while prune_idempotency_keys(engine, batch=1000):  # the session's other expired keys go too
        pass
    assert key_rows(engine, customer.customer_id) == {live: before[live], lapsed: renewed[0].task.id}


def test_each_card_states_its_specialists_policy_after_the_tariff_extension(edge_a):
    for specialist, policy in ((CONFORMANCE, "key_only"), (PAID, "message_id")):
        card = http_calls.get(f"{edge_a.specialist(specialist)}/.well-known/agent-card.json").json()
        extensions = card["capabilities"]["extensions"]
        assert extensions[0]["uri"] == "urn:specialists:extension:tariff-and-limits:v1"
        assert extensions[1]["uri"] == IDEMPOTENCY_EXTENSION
        params = extensions[1]["params"]
        assert (params["policy"], params["header"], int(params["retentionSeconds"])) == (
            policy, "Idempotency-Key", 86_400
        )


def test_a_paid_spec_with_the_key_only_policy_is_refused_at_load(tmp_path: Path):
    path = tmp_path / f"{PAID}.yaml"
    path.write_text(PAID_SPEC + "idempotency: key_only\n")
    with pytest.raises(SpecInvalid, match="key_only is refused for a paid specialist"):
        load_spec(path)


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_resent_follow_up_with_its_key_replays_instead_of_continuing_the_task_twice(
    edge_a, engine, make_customer, binding
):
    customer = make_customer()
    asked = await send(edge_a, customer, CONFORMANCE, binding, request(f"tck-input-required-{uuid.uuid4()}"))
    task = asked[0].task
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    follow_up = request(f"follow-up-{uuid.uuid4()}", "here is more", immediately=True)
    follow_up.message.task_id = task.id
    key = str(uuid.uuid4())
    first = await send(edge_a, customer, CONFORMANCE, binding, follow_up, key=key)
    again = await send(edge_a, customer, CONFORMANCE, binding, follow_up, key=key)
    assert first[0].task.id == again[0].task.id == task.id
    with engine.connect() as conn:
        outbox_rows = conn.execute(
            text("SELECT count(*) FROM dispatch_outbox WHERE task_id = :t"), {"t": task.id}
        ).scalar_one()
    assert outbox_rows == 2  # the first message and the one follow-up, not a third
