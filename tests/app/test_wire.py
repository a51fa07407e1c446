"""Wire behaviours the A2A 1.0 specification asks for where the SDK alone would leave an accident."""

from __future__ import annotations

import uuid

import httpx
import pytest

from core.settings import EdgeSettings
from tests import http_calls
from tests.app.conftest import PAID, message, rpc

pytestmark = pytest.mark.timeout(40, func_only=True)
CONFORMANCE = "conformance"
PING_INTERVAL_S = EdgeSettings.model_fields["sse_ping_interval_s"].default  # the test edges run with the default
# A keep-alive is checked with this much room: what the test proves is that keep-alives keep coming on a quiet
# stream at the configured interval (not once, not never, not sse-starlette's own 15 s), not how promptly a
# loaded machine sends them.
PING_GAP_MARGIN_FACTOR = 3


def jsonrpc(edge, customer, body: dict, *, version: str | None = "1.0") -> dict:
    headers = {"Authorization": f"Bearer {customer.key}"}
    if version is not None:
        headers["A2A-Version"] = version
    return http_calls.post(f"{edge.specialist(CONFORMANCE)}/jsonrpc", json=body, headers=headers, timeout=30).json()


def test_a_request_without_a2a_version_is_read_as_0_3_so_a_1_0_method_is_refused(edge_a, make_customer):
    answer = jsonrpc(edge_a, make_customer(), rpc("SendMessage", message()), version=None)
    assert answer["error"]["code"] == -32009
    assert "0.3" in answer["error"]["message"]


def test_a_request_without_a2a_version_may_use_the_0_3_method_names(edge_a, make_customer):
    params = {
        "message": {
            "kind": "message",
            "messageId": f"tck-complete-task-{uuid.uuid4()}",
            "role": "user",
            "parts": [{"kind": "text", "text": "hi"}],
        }
    }
    answer = jsonrpc(edge_a, make_customer(), rpc("message/send", params), version=None)
    assert answer["result"]["kind"] == "task"
    assert answer["result"]["status"]["state"] == "completed"


def test_an_http_json_request_without_a2a_version_is_refused_as_unsupported_version(edge_a, make_customer):
    customer = make_customer()
    answer = http_calls.post(
        f"{edge_a.specialist(CONFORMANCE)}/message:send",
        json=message(),
        headers={"Authorization": f"Bearer {customer.key}"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["details"][0]["reason"] == "VERSION_NOT_SUPPORTED"


def test_a_patch_version_is_accepted_and_another_major_refused(edge_a, make_customer):
    customer = make_customer()
    ok = jsonrpc(edge_a, customer, rpc("SendMessage", message(f"tck-complete-task-{uuid.uuid4()}")), version="1.0.2")
    assert ok["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert jsonrpc(edge_a, customer, rpc("GetTask", {"id": "x"}), version="2.0")["error"]["code"] == -32009


def test_an_unknown_method_is_method_not_found(edge_a, make_customer):
    assert jsonrpc(edge_a, make_customer(), rpc("DoSomething", {}))["error"]["code"] == -32601


def test_push_notifications_are_refused_as_unsupported_by_a_specialist_that_sends_none(edge_a, make_customer):
    body = message(taskPushNotificationConfig={"url": "https://example.com/hook"})
    answer = http_calls.post(f"{edge_a.specialist(PAID)}/jsonrpc", json=rpc("SendMessage", body), timeout=30,
                             headers={"Authorization": f"Bearer {make_customer().key}", "A2A-Version": "1.0"}).json()
    assert answer["error"]["code"] == -32003


def test_a_message_must_come_from_the_user(edge_a, make_customer):
    body = message()
    body["message"]["role"] = "ROLE_AGENT"
    answer = jsonrpc(edge_a, make_customer(), rpc("SendMessage", body))
    assert answer["error"]["code"] == -32602
    assert answer["error"]["data"][0]["metadata"]["code"] == "role_invalid"


def test_a_follow_up_to_a_finished_task_is_refused(edge_a, make_customer):
    customer = make_customer()
    task = jsonrpc(edge_a, customer, rpc("SendMessage", message(f"tck-complete-task-{uuid.uuid4()}")))["result"]["task"]
    answer = jsonrpc(edge_a, customer, rpc("SendMessage", message(taskId=task["id"])))
    assert answer["error"]["code"] == -32004
    assert "terminal" in answer["error"]["message"]


def test_a_follow_up_to_a_task_still_working_is_refused(edge_a, make_customer):
    customer = make_customer()
    task = jsonrpc(
        edge_a,
        customer,
        rpc("SendMessage", message(f"test-resubscribe-message-id-{uuid.uuid4()}", returnImmediately=True)),
    )["result"]["task"]
    answer = jsonrpc(edge_a, customer, rpc("SendMessage", message(taskId=task["id"])))
    assert answer["error"]["code"] == -40903
    assert answer["error"]["data"][0]["metadata"]["code"] == "task_not_awaiting_input"


def test_a_follow_up_naming_another_context_than_its_tasks_is_refused(edge_a, make_customer):
    customer = make_customer()
    task = jsonrpc(edge_a, customer, rpc("SendMessage", message(f"tck-input-required-{uuid.uuid4()}")))["result"]["task"]
    answer = jsonrpc(
        edge_a, customer, rpc("SendMessage", message(taskId=task["id"], contextId=str(uuid.uuid4())))
    )
    assert answer["error"]["code"] == -32602


def test_tenant_prefixed_paths_are_not_served(edge_a, make_customer):
    customer = make_customer()
    answer = http_calls.get(f"{edge_a.url}/some-tenant/specialists/{CONFORMANCE}/tasks", headers=customer.headers)
    assert answer.status_code == 404


def test_a_blocking_send_answers_once_the_task_asks_for_input(edge_b, make_customer):
    answer = jsonrpc(edge_b, make_customer(), rpc("SendMessage", message(f"tck-input-required-{uuid.uuid4()}")))
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"


def test_history_length_limits_the_history_returned(edge_a, make_customer):
    body = message(f"tck-complete-task-{uuid.uuid4()}", historyLength=0)
    task = jsonrpc(edge_a, make_customer(), rpc("SendMessage", body))["result"]["task"]
    assert "history" not in task


def test_a_quiet_stream_sends_keep_alives_within_the_sdk_clients_five_second_timeout(edge_a, make_customer):
    # The interval itself is the bound that matters: the a2a-sdk client reads with httpx's default timeout.
    with httpx.Client() as plain:
        sdk_read_timeout_s = plain.timeout.read
    assert PING_INTERVAL_S < sdk_read_timeout_s, "SPECIALISTS_SSE_PING_INTERVAL_S must stay below the SDK's timeout"
    customer = make_customer(credits=20)
    base = edge_a.specialist("paid-echo")  # nothing runs paid tasks here: the stream stays quiet
    task = http_calls.post(f"{base}/message:send", json=message(returnImmediately=True), headers=customer.headers).json()
    pings = 0
    # On the wire, keep-alives keep coming: none is ever more than a generous multiple of the interval late.
    gap_bound_s = PING_GAP_MARGIN_FACTOR * PING_INTERVAL_S
    with http_calls.stream(
        "GET", f"{base}/tasks/{task['task']['id']}:subscribe", headers=customer.headers, timeout=gap_bound_s
    ) as stream:
        assert stream.status_code == 200
        try:
            for line in stream.iter_lines():  # a gap without bytes longer than the bound raises ReadTimeout here
                if line.startswith(":"):
                    pings += 1
                if pings == 2:
                    break
        except httpx.ReadTimeout:
            pytest.fail(f"no keep-alive within {gap_bound_s:g} s ({PING_GAP_MARGIN_FACTOR}x SPECIALISTS_SSE_PING_INTERVAL_S)")
    assert pings == 2
