"""Admission over real HTTP: refusals leave nothing behind, resends are idempotent, cancel before claim is free."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from tests import http_calls
from tests.app.conftest import (
    NOTHING,
    PAID,
    PAID_TARIFF,
    EdgeProcess,
    footprint,
    message,
    rpc,
    start_edge,
    stop_edge,
)
from tests.rlm.holds import DEADLINE_SLACK_S

pytestmark = pytest.mark.timeout(60, func_only=True)


def send(edge, customer, body: dict, specialist: str = PAID) -> httpx.Response:
    return http_calls.post(f"{edge.specialist(specialist)}/message:send", json=body, headers=customer.headers)


def reason(response: httpx.Response) -> str:
    return response.json()["error"]["details"][0]["metadata"]["code"]


def reservation_state(engine, task_id: str) -> tuple[str, int | None]:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT state, charged FROM ledger_reservations WHERE job_id = :j"), {"j": task_id}
        ).one()
    return row.state, row.charged


def test_an_admitted_paid_task_holds_its_tariff_and_waits_in_the_outbox(edge_a, engine, make_customer):
    customer = make_customer(credits=20)
    answer = send(edge_a, customer, message(returnImmediately=True))
    assert answer.status_code == 200, answer.text
    task = answer.json()["task"]
    assert task["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert reservation_state(engine, task["id"]) == ("open", None)
    with engine.connect() as conn:
        outbox = conn.execute(
            text("SELECT status, executor FROM dispatch_outbox WHERE task_id = :t"), {"t": task["id"]}
        ).one()
    assert (outbox.status, outbox.executor) == ("pending", "rlm")
    assert footprint(engine, customer.customer_id) == {
        "tasks": 1, "task_rows": 1, "outbox": 1, "messages": 1, "reservations": 1
    }


def test_a_customer_without_the_entitlement_is_refused_and_nothing_is_left(edge_a, engine, make_customer):
    customer = make_customer(credits=20, entitled=False)
    answer = send(edge_a, customer, message())
    assert answer.status_code == 403
    assert reason(answer) == "not_entitled"
    assert "not entitled" in answer.json()["error"]["message"]
    assert footprint(engine, customer.customer_id) == NOTHING


def test_too_few_credits_are_refused_with_what_is_available(edge_a, engine, make_customer):
    customer = make_customer(credits=PAID_TARIFF - 1)
    answer = send(edge_a, customer, message())
    assert answer.status_code == 402
    error = answer.json()["error"]
    assert error["details"][0]["metadata"]["code"] == "insufficient_credits"
    assert error["details"][0]["metadata"]["available_credits"] == str(PAID_TARIFF - 1)
    assert footprint(engine, customer.customer_id) == NOTHING


def test_the_concurrency_cap_refuses_a_second_open_task(edge_a, engine, make_customer):
    customer = make_customer(credits=50, max_parallel=1)
    assert send(edge_a, customer, message(returnImmediately=True)).status_code == 200
    before = footprint(engine, customer.customer_id)
    answer = send(edge_a, customer, message(returnImmediately=True))
    assert answer.status_code == 429
    assert reason(answer) == "concurrency_cap"
    assert footprint(engine, customer.customer_id) == before


def test_a_tariff_above_the_callers_credit_ceiling_is_refused_before_reserving(edge_a, engine, make_customer):
    customer = make_customer(credits=50)
    answer = send(edge_a, customer, message(metadata={"credit_ceiling": PAID_TARIFF - 1}))
    assert answer.status_code == 400
    assert reason(answer) == "over_credit_ceiling"
    assert "credit_ceiling" in answer.json()["error"]["message"]
    assert footprint(engine, customer.customer_id) == NOTHING
    at_ceiling = send(edge_a, customer, message(metadata={"credit_ceiling": PAID_TARIFF}, returnImmediately=True))
    assert at_ceiling.status_code == 200


def test_a_credit_ceiling_that_is_not_a_whole_number_is_refused(edge_a, engine, make_customer):
    customer = make_customer(credits=50)
    answer = send(edge_a, customer, message(metadata={"credit_ceiling": "lots"}))
    assert answer.status_code == 400
    assert reason(answer) == "credit_ceiling_invalid"
    assert footprint(engine, customer.customer_id) == NOTHING


def test_a_message_over_the_specialists_input_limit_is_refused(edge_a, engine, make_customer):
    customer = make_customer(credits=50)
    answer = send(edge_a, customer, message(text="x" * 2000))  # paid-echo accepts 1024 bytes
    assert answer.status_code == 413
    assert "limits.max_input_bytes" in answer.json()["error"]["message"]
    assert footprint(engine, customer.customer_id) == NOTHING


def test_a_part_of_a_media_type_the_specialist_does_not_take_is_refused(edge_a, engine, make_customer):
    customer = make_customer(credits=50)
    body = message()
    body["message"]["parts"] = [{"data": {"a": 1}}]  # application/json; paid-echo takes text/plain
    answer = send(edge_a, customer, body)
    assert answer.status_code == 415
    assert answer.json()["error"]["details"][0]["reason"] == "CONTENT_TYPE_NOT_SUPPORTED"
    assert footprint(engine, customer.customer_id) == NOTHING


def test_a_resend_of_the_same_message_returns_the_same_task_and_reserves_nothing_more(edge_a, engine, make_customer):
    customer = make_customer(credits=50)
    body = message(returnImmediately=True)
    first = send(edge_a, customer, body)
    again = send(edge_a, customer, body)
    assert first.status_code == again.status_code == 200
    assert first.json()["task"]["id"] == again.json()["task"]["id"]
    assert footprint(engine, customer.customer_id) == {
        "tasks": 1, "task_rows": 1, "outbox": 1, "messages": 1, "reservations": 1
    }


def test_a_resend_through_the_other_instance_and_the_other_binding_is_the_same_task(
    edge_a, edge_b, engine, make_customer
):
    customer = make_customer(credits=50)
    body = message(returnImmediately=True)
    first = send(edge_a, customer, body)
    again = http_calls.post(
        f"{edge_b.specialist(PAID)}/jsonrpc", json=rpc("SendMessage", body), headers=customer.headers, timeout=10
    )
    assert again.json()["result"]["task"]["id"] == first.json()["task"]["id"]
    assert footprint(engine, customer.customer_id)["reservations"] == 1


def test_the_same_message_id_with_other_content_is_refused(edge_a, engine, make_customer):
    customer = make_customer(credits=50)
    first = send(edge_a, customer, message("same-id", "one", returnImmediately=True))
    assert first.status_code == 200
    before = footprint(engine, customer.customer_id)
    other = send(edge_a, customer, message("same-id", "two", returnImmediately=True))
    assert other.status_code == 409
    assert reason(other) == "message_id_conflict"
    assert footprint(engine, customer.customer_id) == before


def test_two_customers_may_use_the_same_message_id(edge_a, make_customer):
    first, second = make_customer(credits=50), make_customer(credits=50)
    a = send(edge_a, first, message("shared-id", returnImmediately=True))
    b = send(edge_a, second, message("shared-id", returnImmediately=True))
    assert a.status_code == b.status_code == 200
    assert a.json()["task"]["id"] != b.json()["task"]["id"]


def test_a_refused_message_can_be_sent_again_once_the_customer_has_credits(edge_a, ledger, make_customer):
    customer = make_customer(credits=PAID_TARIFF - 1)
    body = message(returnImmediately=True)
    assert send(edge_a, customer, body).status_code == 402
    ledger.grant(customer.customer_id, 10, operator="tests", skills=[PAID], reason="top up")
    assert send(edge_a, customer, body).status_code == 200


def test_cancel_before_any_worker_claimed_the_task_voids_its_reservation(edge_a, edge_b, engine, ledger, make_customer):
    customer = make_customer(credits=PAID_TARIFF)
    task_id = send(edge_a, customer, message(returnImmediately=True)).json()["task"]["id"]
    assert ledger.account(customer.customer_id).available == 0
    canceled = http_calls.post(f"{edge_b.specialist(PAID)}/tasks/{task_id}:cancel", json={}, headers=customer.headers)
    assert canceled.status_code == 200, canceled.text
    assert canceled.json()["status"]["state"] == "TASK_STATE_CANCELED"
    assert reservation_state(engine, task_id) == ("voided", 0)
    assert ledger.account(customer.customer_id).available == PAID_TARIFF
    with engine.connect() as conn:
        assert conn.execute(
            text("SELECT status FROM dispatch_outbox WHERE task_id = :t"), {"t": task_id}
        ).scalar_one() == "canceled"
    again = http_calls.post(f"{edge_a.specialist(PAID)}/tasks/{task_id}:cancel", json={}, headers=customer.headers)
    assert again.status_code == 409
    assert again.json()["error"]["details"][0]["reason"] == "TASK_NOT_CANCELABLE"


def test_concurrent_resends_of_one_message_create_one_task(edge_a, edge_b, engine, make_customer):
    import concurrent.futures

    customer = make_customer(credits=100)
    body = message(returnImmediately=True)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: send(edge_a if i % 2 else edge_b, customer, body), range(8)))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert len({a.json()["task"]["id"] for a in answers}) == 1
    assert footprint(engine, customer.customer_id)["reservations"] == 1


def test_an_expired_entitlement_is_refused_as_expired_and_nothing_is_left(edge_a, engine, ledger, make_customer):
    from datetime import datetime, timedelta, timezone

    customer = make_customer()
    two_days_ago = datetime.now(timezone.utc) - timedelta(days=2)
    ledger.grant(
        customer.customer_id,
        50,
        operator="tests",
        skills=[PAID],
        skill_expires_at=two_days_ago + timedelta(days=1),
        reason="an entitlement that lapsed yesterday",
        now=two_days_ago,
    )
    answer = send(edge_a, customer, message())
    assert answer.status_code == 403
    assert reason(answer) == "expired"
    assert "expired" in answer.json()["error"]["message"]
    assert footprint(engine, customer.customer_id) == NOTHING


def test_cancel_of_a_task_waiting_for_input_after_a_run_charges_the_tariff(edge_a, engine, make_customer):
    from a2a.types.a2a_pb2 import TaskState

    from taskstate import rows as taskrows
    from taskstate import claims

    customer = make_customer(credits=20)
    task_id = send(edge_a, customer, message(returnImmediately=True)).json()["task"]["id"]
    owner = f"{customer.customer_id}:{PAID}"
    with engine.begin() as conn:  # what a worker does: claim the job, run it, ask for input
        dispatch_id = conn.execute(
            text("UPDATE dispatch_outbox SET status = 'done', finished_at = now() WHERE task_id = :t "
                 "RETURNING dispatch_id"),
            {"t": task_id},
        ).scalar_one()
        job = f"{task_id}.{dispatch_id}"
        token = claims.claim(conn, job, worker_id="test-worker", lease_s=30).fencing_token
        claims.finish(conn, job, fencing_token=token, outcome="input_required", detail=None, worker_id="test-worker")
        locked = taskrows.lock(conn, task_id, owner)
        locked.task.status.state = TaskState.TASK_STATE_INPUT_REQUIRED
        taskrows.write_event(conn, locked, locked.task)
    canceled = http_calls.post(f"{edge_a.specialist(PAID)}/tasks/{task_id}:cancel", json={}, headers=customer.headers)
    assert canceled.json()["status"]["state"] == "TASK_STATE_CANCELED"
    assert reservation_state(engine, task_id) == ("settled", PAID_TARIFF)


BLOCKING_WAIT_MAX_S = 1.0  # SPECIALISTS_BLOCKING_WAIT_MAX_S's least value


@pytest.fixture(scope="module")
def short_wait_edge(database_url: str, edge_specs_dir: Path, edge_logs: Path) -> Iterator[EdgeProcess]:
    """An edge alone (no worker: its tasks are never claimed) whose blocking sends wait the least they may."""
    edge = start_edge(database_url, edge_specs_dir, edge_logs, "short-wait",
                      blocking_wait_max_s=str(BLOCKING_WAIT_MAX_S))
    yield edge
    stop_edge(edge)


def test_a_blocking_send_whose_task_does_not_stop_answers_it_as_it_is_at_the_wait_limit(
    short_wait_edge, engine, make_customer
):
    customer = make_customer(credits=PAID_TARIFF * 2)
    body = message()
    started = time.monotonic()
    first = send(short_wait_edge, customer, body)
    waited_s = time.monotonic() - started
    assert first.status_code == 200, first.text
    task = first.json()["task"]
    assert task["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert [m["parts"][0]["text"] for m in task["history"]] == ["hello"]
    assert waited_s <= BLOCKING_WAIT_MAX_S + DEADLINE_SLACK_S, waited_s
    # A resend watches a task admitted before its watch began: the same task, as it is at the limit, reserved once.
    again = send(short_wait_edge, customer, body)
    assert again.status_code == 200, again.text
    assert again.json()["task"]["id"] == task["id"]
    assert again.json()["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert footprint(engine, customer.customer_id)["reservations"] == 1
