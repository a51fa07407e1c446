"""A2A push notifications at the edge: the capability, the config methods on every binding, owner scoping,
refusals at registration, and a task's updates reaching a real webhook on 127.0.0.1, each notification's JWT
verified with the JWKS the edge publishes. Delivery's own bounds (retries, hangs, rebinding, a killed
dispatcher) are tests/workers/dispatch/test_push.py's."""

from __future__ import annotations

import hashlib
import uuid

import grpc
import httpx
import pytest
from a2a.client import A2ACardResolver, ClientCallContext, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskPushNotificationConfig,
    TaskState,
)

from core.push_signing import verify
from tests.app.conftest import message
from tests.webhook import Webhook, running_webhook

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

CONFORMANCE = "conformance"
BINDINGS = ["JSONRPC", "HTTP+JSON", "GRPC"]


@pytest.fixture(scope="module")
def webhook() -> Webhook:
    with running_webhook() as hook:
        yield hook


async def client_of(edge, customer, binding: str):
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {customer.key}"}, timeout=30)
    card = await A2ACardResolver(http, edge.specialist(CONFORMANCE)).get_agent_card()
    config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding], streaming=False,
                          grpc_channel_factory=grpc.aio.insecure_channel)
    context = ClientCallContext(service_parameters={"authorization": f"Bearer {customer.key}"}, timeout=30)
    return ClientFactory(config).create(card), http, context


async def waiting_task(edge, customer) -> str:
    """A task of the customer's that stays SUBMITTED (the edge alone runs nothing)."""
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(f"{edge.specialist(CONFORMANCE)}/message:send", headers=customer.headers,
                                 json=message(returnImmediately=True))
    assert answer.status_code == 200, answer.text
    return answer.json()["task"]["id"]


async def test_the_card_declares_push_notifications_and_the_edge_publishes_its_jwks(edge_alone):
    async with httpx.AsyncClient(timeout=30) as http:
        card = (await http.get(f"{edge_alone.specialist(CONFORMANCE)}/.well-known/agent-card.json")).json()
        jwks = (await http.get(f"{edge_alone.url}/.well-known/jwks.json")).json()
    assert card["capabilities"]["pushNotifications"] is True
    assert [(k["kty"], k["crv"], k["alg"]) for k in jwks["keys"]] == [("EC", "P-256", "ES256")]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_the_config_methods_set_get_list_and_delete_twice_on_every_binding(edge_alone, make_customer, webhook, binding):
    customer = make_customer()
    task_id = await waiting_task(edge_alone, customer)
    client, http, context = await client_of(edge_alone, customer, binding)
    url = webhook.url(f"/ok/{uuid.uuid4().hex}")
    try:
        created = await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task_id, id="mine", url=url, token="t-1"), context=context)
        assert (created.id, created.task_id, created.url, created.token) == ("mine", task_id, url, "t-1")
        got = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=task_id, id="mine"), context=context)
        assert got.url == url
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id), context=context)
        assert [c.id for c in listed.configs] == ["mine"]
        for _ in range(2):  # delete is idempotent (spec 3.1.10): the second answers success too, not TaskNotFound
            await client.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=task_id, id="mine"), context=context)
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id), context=context)
        assert list(listed.configs) == []
    finally:
        await client.close()  # its gRPC channel: a channel left open outlives the test's event loop
        await http.aclose()


RPC_PATHS = {"get": "GetTaskPushNotificationConfig", "list": "ListTaskPushNotificationConfigs",
             "delete": "DeleteTaskPushNotificationConfig", "create": "CreateTaskPushNotificationConfig"}


async def test_another_customers_task_or_config_answers_not_found(edge_alone, make_customer, webhook):
    owner, stranger = make_customer(), make_customer()
    task_id = await waiting_task(edge_alone, owner)
    rpc_url = f"{edge_alone.specialist(CONFORMANCE)}/jsonrpc"
    async with httpx.AsyncClient(timeout=30) as http:
        async def call(customer, method: str, params: dict) -> dict:
            body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
            return (await http.post(rpc_url, headers=customer.headers, json=body)).json()

        made = await call(owner, RPC_PATHS["create"], {"taskId": task_id, "id": "c1", "url": webhook.url("/ok/x")})
        assert made["result"]["id"] == "c1", made
        for method, params in (
            ("get", {"taskId": task_id, "id": "c1"}),
            ("list", {"taskId": task_id}),
            ("delete", {"taskId": task_id, "id": "c1"}),
            ("create", {"taskId": task_id, "id": "c1", "url": webhook.url("/ok/stolen")}),
        ):
            answer = await call(stranger, RPC_PATHS[method], params)
            assert answer["error"]["code"] == -32001, (method, answer)  # TaskNotFoundError, as for no task at all
        still = await call(owner, RPC_PATHS["get"], {"taskId": task_id, "id": "c1"})
        assert still["result"]["url"] == webhook.url("/ok/x")
        missing = await call(owner, RPC_PATHS["get"], {"taskId": task_id, "id": "nope"})
        assert missing["error"]["code"] == -32001


@pytest.mark.parametrize("url, code", [
    ("https://10.1.2.3/hook", "webhook_address_refused"),
    ("https://169.254.169.254/latest/meta-data/", "webhook_address_refused"),
    ("https://metadata.google.internal/computeMetadata/v1/", "webhook_address_refused"),
    ("https://[::ffff:192.168.0.1]/hook", "webhook_address_refused"),
    ("http://example.com/hook", "webhook_https_required"),
    ("ftp://example.com/", "webhook_url_invalid"),
])
async def test_registration_refuses_private_metadata_and_plain_http_targets(edge_alone, make_customer, url, code):
    customer = make_customer()
    task_id = await waiting_task(edge_alone, customer)
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(f"{edge_alone.specialist(CONFORMANCE)}/tasks/{task_id}/pushNotificationConfigs",
                                 headers=customer.headers, json={"taskId": task_id, "url": url})
        send = await http.post(f"{edge_alone.specialist(CONFORMANCE)}/message:send", headers=customer.headers,
                               json=message(taskPushNotificationConfig={"url": url}))
    for refused in (answer, send):
        assert refused.status_code == 400, refused.text
        [info] = [d for d in refused.json()["error"]["details"] if "ErrorInfo" in d.get("@type", "")]
        assert info["metadata"]["code"] == code, refused.text


async def test_a_send_with_a_push_config_notifies_its_webhook_of_every_update_in_order_signed_by_the_jwks(
    edge_a, make_customer, webhook
):
    customer = make_customer()
    path = f"/ok/{uuid.uuid4().hex}"
    client, http, context = await client_of(edge_a, customer, "JSONRPC")
    request = SendMessageRequest(message=Message(message_id=f"tck-stream-001-{uuid.uuid4()}", role=Role.ROLE_USER,
                                                 parts=[Part(text="hello")]))
    request.configuration.task_push_notification_config.CopyFrom(
        TaskPushNotificationConfig(url=webhook.url(path), token="echo-me"))
    try:
        [answer] = [event async for event in client.send_message(request, context=context)]
        jwks = (await http.get(f"{edge_a.url}/.well-known/jwks.json")).json()
    finally:
        await client.close()  # its gRPC channel: a channel left open outlives the test's event loop
        await http.aclose()
    task_id = answer.task.id
    assert answer.task.status.state == TaskState.TASK_STATE_COMPLETED
    received = webhook.wait_for(lambda seen: len([r for r in seen if r.path == path]) >= 4)
    mine = [r for r in received if r.path == path]
    kinds = [next(iter(r.event)) for r in mine]
    assert kinds == ["task", "statusUpdate", "artifactUpdate", "statusUpdate"]
    assert mine[-1].event["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    ids = [int(r.event_id) for r in mine]
    assert ids == sorted(set(ids))
    for r in mine:
        assert r.headers["x-a2a-notification-token"] == "echo-me"
        claims = verify(r.headers["authorization"].removeprefix("Bearer "), jwks)
        assert (claims["task_id"], claims["event_id"], claims["iss"]) == (task_id, r.event_id, claims["iss"])
        assert claims["body_sha256"] == hashlib.sha256(r.body).hexdigest()
