"""Any task id that is not the caller's answers TaskNotFoundError, on every method and both bindings.

Whatever its length or shape (longer than any id the service issues, whitespace,
unicode, path-like, a uuid never issued, another customer's task, a task of
another specialist), the answer is A2A's TaskNotFoundError in the spec's form
(-32001 over JSON-RPC; 404 with reason TASK_NOT_FOUND over HTTP+JSON), and it is
the same answer as for a uuid that was never issued, so nothing tells a caller
that an id exists elsewhere. Checked with raw httpx (the exact wire form) and
with the official a2a-sdk client (what a real caller gets).
"""

from __future__ import annotations

import uuid
from urllib.parse import quote

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
)
from a2a.utils.errors import TaskNotFoundError

from tests import http_calls
from tests.app.conftest import PAID, message, rpc

pytestmark = pytest.mark.timeout(120, func_only=True)
CONFORMANCE = "conformance"

# Shapes of ids no caller owns. The TCK's own ids (`tck-nonexistent-errinfo-test-<8 hex>`) are 37 characters:
# one more than the ids this service issues.
FOREIGN_SHAPES = {
    "tck_style_37_chars": "tck-nonexistent-errinfo-test-" + "0123abcd",
    "very_long": "t" * 1000,
    "whitespace": "   ",
    "unicode": "tâche-✓-задача-" + uuid.uuid4().hex[:8],
    "path_like": "../../tasks/..;x=1",
    "never_issued_uuid": str(uuid.uuid4()),
}
REST_ID_SHAPES = {**FOREIGN_SHAPES, "encoded_slash": "a/b"}


def _jsonrpc_calls(task_id: str) -> dict[str, dict]:
    return {
        "GetTask": {"id": task_id},
        "CancelTask": {"id": task_id},
        "SubscribeToTask": {"id": task_id},
        "SendMessage": message(f"probe-{uuid.uuid4()}", taskId=task_id),
        "SendStreamingMessage": message(f"probe-{uuid.uuid4()}", taskId=task_id),
    }


def _rest_calls(task_id: str) -> dict[str, tuple[str, str, dict | None]]:
    path_id = quote(task_id, safe="")
    return {
        "GetTask": ("GET", f"/tasks/{path_id}", None),
        "CancelTask": ("POST", f"/tasks/{path_id}:cancel", {}),
        "SubscribeToTask": ("POST", f"/tasks/{path_id}:subscribe", {}),
        "SendMessage": ("POST", "/message:send", message(f"probe-{uuid.uuid4()}", taskId=task_id)),
        "SendStreamingMessage": ("POST", "/message:stream", message(f"probe-{uuid.uuid4()}", taskId=task_id)),
    }


def _jsonrpc_error(response: httpx.Response) -> dict:
    """The JSON-RPC error of an answer (a stream's upfront error comes as a plain JSON-RPC response)."""
    assert response.headers["content-type"].startswith("application/json"), (response.status_code, response.text)
    body = response.json()
    assert "error" in body, body
    return body["error"]


def _assert_task_not_found_jsonrpc(error: dict) -> None:
    assert error["code"] == -32001, error
    info = error["data"][0]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert (info["reason"], info["domain"]) == ("TASK_NOT_FOUND", "a2a-protocol.org"), info


def _assert_task_not_found_rest(response: httpx.Response) -> None:
    assert response.status_code == 404, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    assert "error" in response.json(), response.text
    error = response.json()["error"]
    assert (error["code"], error["status"]) == (404, "NOT_FOUND"), error
    info = error["details"][0]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert (info["reason"], info["domain"]) == ("TASK_NOT_FOUND", "a2a-protocol.org"), info


@pytest.fixture
def others_tasks(edge_alone, make_customer) -> list[tuple[str, str, dict[str, str]]]:
    """(what, task id, the prober's headers): tasks that exist, probed on the conformance specialist by a
    caller who does not own them there: another customer, and their owner through another specialist."""
    owner = make_customer(credits=50)
    own = http_calls.post(
        f"{edge_alone.specialist(CONFORMANCE)}/message:send",
        json=message(f"tck-input-required-{uuid.uuid4()}", returnImmediately=True),
        headers=owner.headers,
    ).json()["task"]
    paid = http_calls.post(
        f"{edge_alone.specialist(PAID)}/message:send", json=message(returnImmediately=True), headers=owner.headers
    ).json()["task"]
    return [
        ("another customer's task", own["id"], make_customer().headers),
        ("the caller's task of another specialist", paid["id"], owner.headers),
    ]


@pytest.mark.parametrize("shape", list(FOREIGN_SHAPES))
def test_an_id_that_names_no_task_of_the_caller_is_task_not_found_over_json_rpc(edge_alone, make_customer, shape):
    caller = make_customer()
    url = f"{edge_alone.specialist(CONFORMANCE)}/jsonrpc"
    with httpx.Client(headers=caller.headers, timeout=http_calls.TIMEOUT_S) as http:
        for method, params in _jsonrpc_calls(FOREIGN_SHAPES[shape]).items():
            try:
                _assert_task_not_found_jsonrpc(_jsonrpc_error(http.post(url, json=rpc(method, params))))
            except AssertionError as wrong:
                raise AssertionError(f"{method}: {wrong}") from None


@pytest.mark.parametrize("shape", list(REST_ID_SHAPES))
def test_an_id_that_names_no_task_of_the_caller_is_task_not_found_over_http_json(edge_alone, make_customer, shape):
    caller = make_customer()
    base = edge_alone.specialist(CONFORMANCE)
    with httpx.Client(headers=caller.headers, timeout=http_calls.TIMEOUT_S) as http:
        for method, (verb, path, body) in _rest_calls(REST_ID_SHAPES[shape]).items():
            try:
                _assert_task_not_found_rest(http.request(verb, f"{base}{path}", json=body))
            except AssertionError as wrong:
                raise AssertionError(f"{method} {verb} {path}: {wrong}") from None


def test_existing_tasks_of_others_answer_exactly_like_a_never_issued_id(edge_alone, others_tasks):
    missing = str(uuid.uuid4())
    for what, task_id, headers in others_tasks:
        base = edge_alone.specialist(CONFORMANCE)
        with httpx.Client(headers=headers, timeout=http_calls.TIMEOUT_S) as http:
            for method, params in _jsonrpc_calls(task_id).items():
                foreign = _jsonrpc_error(http.post(f"{base}/jsonrpc", json=rpc(method, params)))
                absent = _jsonrpc_error(http.post(f"{base}/jsonrpc", json=rpc(method, _jsonrpc_calls(missing)[method])))
                _assert_task_not_found_jsonrpc(foreign)
                assert foreign == absent, (what, method)
            for method, (verb, path, body) in _rest_calls(task_id).items():
                foreign = http.request(verb, f"{base}{path}", json=body)
                _assert_task_not_found_rest(foreign)
                _, missing_path, missing_body = _rest_calls(missing)[method]
                absent = http.request(verb, f"{base}{missing_path}", json=missing_body)
                assert foreign.json() == absent.json(), (what, method)


def _push_calls(task_id: str) -> dict[str, dict]:
    return {
        "CreateTaskPushNotificationConfig": {"taskId": task_id, "url": "https://example.com/hook"},
        "GetTaskPushNotificationConfig": {"taskId": task_id, "id": "c"},
        "ListTaskPushNotificationConfigs": {"taskId": task_id},
        "DeleteTaskPushNotificationConfig": {"taskId": task_id, "id": "c"},
    }


def test_push_config_methods_answer_any_foreign_id_exactly_like_a_never_issued_one(edge_alone, make_customer):
    """Push configurations are offered (issue 24): an id of any shape that is not the caller's task is
    TASK_NOT_FOUND, before the webhook address is looked at, and tells nothing a never-issued id does not."""
    caller = make_customer()
    url = f"{edge_alone.specialist(CONFORMANCE)}/jsonrpc"
    with httpx.Client(headers=caller.headers, timeout=http_calls.TIMEOUT_S) as http:
        absent = {method: _jsonrpc_error(http.post(url, json=rpc(method, params)))
                  for method, params in _push_calls(str(uuid.uuid4())).items()}
        for shape, task_id in FOREIGN_SHAPES.items():
            for method, params in _push_calls(task_id).items():
                error = _jsonrpc_error(http.post(url, json=rpc(method, params)))
                _assert_task_not_found_jsonrpc(error)
                assert error == absent[method], (shape, method)


async def _sdk_client(edge, key: str, binding: str):
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=http_calls.TIMEOUT_S)
    card = await A2ACardResolver(http, edge.specialist(CONFORMANCE)).get_agent_card()
    config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding], streaming=True)
    return ClientFactory(config).create(card), http


@pytest.mark.anyio
@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
async def test_the_official_client_raises_task_not_found_for_any_foreign_id(edge_alone, make_customer, binding):
    caller = make_customer()
    client, http = await _sdk_client(edge_alone, caller.key, binding)
    # The SDK's HTTP+JSON client puts the id in the path unencoded, so httpx resolves `../` in a path-like
    # id before the edge sees it (the request leaves the specialist's prefix): that shape is checked with
    # raw, encoded requests above.
    shapes = {k: v for k, v in FOREIGN_SHAPES.items() if not (binding == "HTTP+JSON" and k == "path_like")}
    try:
        for task_id in shapes.values():
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id=task_id))
            with pytest.raises(TaskNotFoundError):
                await client.cancel_task(CancelTaskRequest(id=task_id))
            with pytest.raises(TaskNotFoundError):
                async for _ in client.subscribe(SubscribeToTaskRequest(id=task_id)):
                    pass
            follow_up = Message(
                message_id=f"probe-{uuid.uuid4()}", role=Role.ROLE_USER, parts=[Part(text="more")], task_id=task_id
            )
            with pytest.raises(TaskNotFoundError):
                async for _ in client.send_message(SendMessageRequest(message=follow_up)):
                    pass
    finally:
        await client.close()  # its gRPC channel: a channel left open outlives the test's event loop
        await http.aclose()


def test_an_empty_task_id_is_a_missing_required_field(edge_alone, make_customer):
    """An empty `id` is not an id at all: the request lacks a required field (InvalidParams), as the spec's
    field-presence rules say; an empty `message.taskId` means "no task" and starts a new one."""
    caller = make_customer()
    url = f"{edge_alone.specialist(CONFORMANCE)}/jsonrpc"
    with httpx.Client(headers=caller.headers, timeout=http_calls.TIMEOUT_S) as http:
        for method in ("GetTask", "CancelTask"):
            assert _jsonrpc_error(http.post(url, json=rpc(method, {"id": ""})))["code"] == -32602
