"""Tenancy: another customer's task answers exactly like a task that does not exist; contexts stay with their first customer."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from ledger.verify import verify
from taskstate import claims, ids, outbox
from taskstate.updates import TaskEvents
from tests import http_calls
from tests.app.conftest import PAID, message, rpc
from workers.dispatch.sweeper import LeaseSweeper
from workers.settlement import TaskSettlement

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


def _unknown_paid_task(base: str, engine, owner) -> str:
    """A paid task whose job a worker claimed and then died in: the lease sweeper records it unknown, as it
    would for a worker killed mid-job (tests/workers/test_worker_crash.py kills one for real)."""
    task_id = http_calls.post(
        f"{base}/message:send", json=message(returnImmediately=True), headers=owner.headers
    ).json()["task"]["id"]
    with engine.begin() as conn:
        (dispatch_id,) = outbox.open_dispatch_ids(conn, task_id, f"{owner.customer_id}:{PAID}")
        job_id = ids.job_id_for(task_id, dispatch_id)
        a_minute_ago = datetime.now(timezone.utc) - timedelta(minutes=1)
        assert claims.claim(conn, job_id, worker_id="a-worker-that-died", lease_s=1, now=a_minute_ago).outcome == "claimed"
    LeaseSweeper(engine, TaskSettlement(TaskEvents(engine), operator="tests")).sweep()
    with engine.connect() as conn:
        assert claims.get(conn, job_id)["state"] == "unknown"  # whichever sweeper (this one, edge_a's) got it
    return task_id


def test_cancel_of_another_customers_unknown_task_answers_like_a_missing_one_on_both_bindings(
    edge_b, engine, make_customer
):
    base = edge_b.specialist(PAID)
    owner, stranger = make_customer(credits=50), make_customer(credits=50)
    task_id = _unknown_paid_task(base, engine, owner)
    missing = str(uuid.uuid4())
    with httpx.Client(headers=stranger.headers, timeout=10) as http:
        rpc_url = f"{base}/jsonrpc"
        foreign = http.post(rpc_url, json=rpc("CancelTask", {"id": task_id}))
        absent = http.post(rpc_url, json=rpc("CancelTask", {"id": missing}))
        assert (foreign.status_code, foreign.json()) == (absent.status_code, absent.json())
        assert foreign.json()["error"]["code"] == -32001
        foreign = http.post(f"{base}/tasks/{task_id}:cancel", json={})
        absent = http.post(f"{base}/tasks/{missing}:cancel", json={})
        assert (foreign.status_code, foreign.json()) == (absent.status_code, absent.json())
        assert foreign.status_code == 404
    # The owner is told the truth about its own task.
    own = http_calls.post(f"{base}/tasks/{task_id}:cancel", json={}, headers=owner.headers)
    assert own.status_code == 409 and "under reconciliation" in own.json()["error"]["message"], own.json()
    with engine.connect() as conn:
        assert verify(conn, owner.customer_id) == [] and verify(conn, stranger.customer_id) == []
