"""Tenancy: another customer's task answers exactly like a task that does not exist; contexts stay with their first customer."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests import http_calls
from tests.app.conftest import message, rpc

pytestmark = pytest.mark.timeout(60, func_only=True)
CONFORMANCE = "conformance"


@pytest.fixture
def owners_task(edge_a, make_customer) -> tuple[str, str]:
    owner = make_customer()
    answer = http_calls.post(
        f"{edge_a.specialist(CONFORMANCE)}/message:send",
        json=message(f"tck-input-required-{uuid.uuid4()}"),
        headers=owner.headers,
    )
    task = answer.json()["task"]
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    return task["id"], task["contextId"]


def _rest_probes(base: str, task_id: str) -> list[tuple[str, str, dict | None]]:
    return [
        ("GET", f"{base}/tasks/{task_id}", None),
        ("POST", f"{base}/tasks/{task_id}:cancel", {}),
        ("GET", f"{base}/tasks/{task_id}:subscribe", None),
        ("POST", f"{base}/message:send", message("follow-up-probe", taskId=task_id)),
    ]


def _answer(http: httpx.Client, method: str, url: str, body: dict | None) -> tuple[int, object]:
    if body is not None:
        body = {**body, "message": {**body["message"], "messageId": f"probe-{uuid.uuid4()}"}} if "message" in body else body
    response = http.request(method, url, json=body)
    return response.status_code, response.json()


def test_another_customers_task_answers_like_a_missing_one_over_http_json(edge_a, edge_b, make_customer, owners_task):
    task_id, _ = owners_task
    stranger = make_customer()
    missing = str(uuid.uuid4())
    with httpx.Client(headers=stranger.headers, timeout=10) as http:
        for edge in (edge_a, edge_b):
            base = edge.specialist(CONFORMANCE)
            for (method, url, body), (_, url_missing, body_missing) in zip(
                _rest_probes(base, task_id), _rest_probes(base, missing)
            ):
                foreign = _answer(http, method, url, body)
                absent = _answer(http, method, url_missing, body_missing)
                assert foreign[0] == 404, (url, foreign)
                assert foreign == absent, (url, foreign, absent)


def test_another_customers_task_answers_like_a_missing_one_over_json_rpc(edge_b, make_customer, owners_task):
    task_id, _ = owners_task
    stranger = make_customer()
    missing = str(uuid.uuid4())
    url = f"{edge_b.specialist(CONFORMANCE)}/jsonrpc"
    with httpx.Client(headers=stranger.headers, timeout=10) as http:
        for method in ("GetTask", "CancelTask"):
            foreign = http.post(url, json=rpc(method, {"id": task_id})).json()
            absent = http.post(url, json=rpc(method, {"id": missing})).json()
            assert foreign["error"]["code"] == -32001
            assert foreign == absent


def test_another_customers_tasks_are_not_listed(edge_a, make_customer, owners_task):
    task_id, _ = owners_task
    stranger = make_customer()
    listed = http_calls.get(f"{edge_a.specialist(CONFORMANCE)}/tasks", headers=stranger.headers).json()
    assert listed["tasks"] == [] and listed["totalSize"] == 0


def test_a_task_of_one_specialist_is_not_found_through_another(edge_a, make_customer):
    customer = make_customer(credits=50)
    task_id = http_calls.post(
        f"{edge_a.specialist('paid-echo')}/message:send",
        json=message(returnImmediately=True),
        headers=customer.headers,
    ).json()["task"]["id"]
    answer = http_calls.get(f"{edge_a.specialist(CONFORMANCE)}/tasks/{task_id}", headers=customer.headers)
    assert answer.status_code == 404


def test_a_context_id_stays_with_its_first_customer(edge_a, make_customer, owners_task):
    _, context_id = owners_task
    stranger = make_customer()
    answer = http_calls.post(
        f"{edge_a.specialist(CONFORMANCE)}/message:send",
        json=message(f"tck-complete-task-{uuid.uuid4()}", contextId=context_id),
        headers=stranger.headers,
    )
    assert answer.status_code == 409
    assert answer.json()["error"]["details"][0]["metadata"]["code"] == "context_id_unavailable"


def test_the_owner_continues_its_own_context_with_a_new_task(edge_a, make_customer):
    owner = make_customer()
    url = f"{edge_a.specialist(CONFORMANCE)}/message:send"
    first = http_calls.post(url, json=message(f"tck-complete-task-{uuid.uuid4()}"), headers=owner.headers).json()["task"]
    second = http_calls.post(
        url, json=message(f"tck-complete-task-{uuid.uuid4()}", contextId=first["contextId"]), headers=owner.headers
    ).json()["task"]
    assert second["contextId"] == first["contextId"] and second["id"] != first["id"]
