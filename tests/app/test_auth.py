"""Keys at the edge: 401 with `WWW-Authenticate: Bearer` and a reason a person can act on, in both bindings."""

from __future__ import annotations

import uuid

import httpx
import pytest
from sqlalchemy import text

from ledger import keys
from tests import http_calls
from tests.app.conftest import NOTHING, PAID, footprint, message, rpc

pytestmark = pytest.mark.timeout(60, func_only=True)


def send_rest(edge, headers: dict, specialist: str = PAID, body: dict | None = None) -> httpx.Response:
    return http_calls.post(f"{edge.specialist(specialist)}/message:send", json=body or message(), headers=headers)


def test_a_request_without_a_key_is_refused_with_the_header_to_send(edge_a):
    answer = send_rest(edge_a, {"A2A-Version": "1.0"})
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == 'Bearer realm="specialists"'
    error = answer.json()["error"]
    assert error["details"][0]["metadata"]["code"] == "key_required"
    assert "Authorization: Bearer" in error["message"]


def test_json_rpc_callers_get_the_refusal_as_a_json_rpc_error(edge_a):
    answer = http_calls.post(f"{edge_a.specialist(PAID)}/jsonrpc", json=rpc("SendMessage", message()))
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].startswith("Bearer")
    body = answer.json()
    assert body["jsonrpc"] == "2.0" and body["id"] is None
    assert body["error"]["code"] == -40100
    assert body["error"]["data"][0]["metadata"]["code"] == "key_required"


@pytest.mark.parametrize(
    ("presented", "code"),
    [
        ("not-a-key", "key_malformed"),
        ("sk_live_00000000_abc.def", "key_wrong_environment"),
        ("sk_test_00000000_abc.def", "key_unknown_signing_secret"),
    ],
)
def test_a_key_that_is_not_ours_is_refused_with_its_reason(edge_a, presented, code):
    answer = send_rest(edge_a, {"Authorization": f"Bearer {presented}", "A2A-Version": "1.0"})
    assert answer.status_code == 401
    assert answer.json()["error"]["details"][0]["metadata"]["code"] == code
    assert f'error_description="{code}"' in answer.headers["www-authenticate"]


def test_an_altered_key_is_refused_as_tampered(edge_a, make_customer):
    customer = make_customer()
    payload, signature = customer.key.rsplit(".", 1)
    tampered = f"{payload}.{'A' if signature[0] != 'A' else 'B'}{signature[1:]}"
    answer = send_rest(edge_a, {"Authorization": f"Bearer {tampered}", "A2A-Version": "1.0"})
    assert answer.status_code == 401
    assert answer.json()["error"]["details"][0]["metadata"]["code"] == "key_tampered"


def test_a_scheme_other_than_bearer_is_refused(edge_a, make_customer):
    customer = make_customer()
    answer = send_rest(edge_a, {"Authorization": f"Basic {customer.key}", "A2A-Version": "1.0"})
    assert answer.status_code == 401
    assert answer.json()["error"]["details"][0]["metadata"]["code"] == "key_malformed"


def test_a_revoked_key_is_refused_on_every_instance_and_leaves_nothing(edge_a, edge_b, engine, make_customer):
    customer = make_customer(credits=20)
    assert keys.revoke_key(engine, customer.key_id, reason="laptop lost", operator="tests")
    for edge in (edge_a, edge_b):
        answer = send_rest(edge, customer.headers)
        assert answer.status_code == 401
        assert answer.json()["error"]["details"][0]["metadata"]["code"] == "key_revoked"
        assert "revoked" in answer.json()["error"]["message"]
    assert footprint(engine, customer.customer_id) == NOTHING


def test_reads_need_a_key_too(edge_a):
    answer = http_calls.get(f"{edge_a.specialist(PAID)}/tasks", headers={"A2A-Version": "1.0"})
    assert answer.status_code == 401


def test_the_public_card_and_the_specialist_list_need_no_key(edge_a):
    assert http_calls.get(f"{edge_a.url}/specialists").status_code == 200
    assert http_calls.get(f"{edge_a.specialist(PAID)}/.well-known/agent-card.json").status_code == 200


def test_an_unknown_specialist_is_not_found(edge_a, make_customer):
    customer = make_customer()
    answer = send_rest(edge_a, customer.headers, specialist="no-such-specialist")
    assert answer.status_code == 404
    assert answer.json()["error"]["details"][0]["metadata"]["code"] == "specialist_not_found"


# --- anonymous callers (the strict edge allows them for tariff-0 specialists) ----------


def test_anonymous_callers_are_served_for_a_free_specialist_when_the_operator_allows_it(strict_edge, engine):
    answer = http_calls.post(
        f"{strict_edge.specialist('conformance')}/message:send",
        json=message(returnImmediately=True),
        headers={"A2A-Version": "1.0"},
    )
    assert answer.status_code == 200, answer.text
    task_id = answer.json()["task"]["id"]
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT customer_id, tariff_credits FROM edge_tasks WHERE task_id = :t"), {"t": task_id}
        ).one()
    assert (row.customer_id, row.tariff_credits) == (None, 0)
    fetched = http_calls.get(f"{strict_edge.specialist('conformance')}/tasks/{task_id}", headers={"A2A-Version": "1.0"})
    assert fetched.status_code == 200


def test_anonymous_callers_are_refused_for_a_paid_specialist(strict_edge):
    answer = send_rest(strict_edge, {"A2A-Version": "1.0"})
    assert answer.status_code == 401
    assert answer.json()["error"]["details"][0]["metadata"]["code"] == "key_required"


def test_anonymous_callers_are_refused_by_default(edge_a):
    answer = send_rest(edge_a, {"A2A-Version": "1.0"}, specialist="conformance")
    assert answer.status_code == 401


def test_anonymous_callers_cannot_list_tasks(strict_edge):
    answer = http_calls.get(f"{strict_edge.specialist('conformance')}/tasks", headers={"A2A-Version": "1.0"})
    assert answer.status_code == 401
    assert answer.json()["error"]["details"][0]["metadata"]["code"] == "key_required_for_listing"


def test_an_anonymous_resend_is_never_answered_with_the_first_task(strict_edge):
    # Anonymous callers share one namespace: answering a resend could hand one caller another's task. The
    # conformance specialist is key_only, so a reused messageId is a new task, and a reused key is refused.
    body = message(returnImmediately=True)
    url = f"{strict_edge.specialist('conformance')}/message:send"
    first = http_calls.post(url, json=body, headers={"A2A-Version": "1.0"})
    again = http_calls.post(url, json=body, headers={"A2A-Version": "1.0"})
    assert first.status_code == again.status_code == 200
    assert first.json()["task"]["id"] != again.json()["task"]["id"]
    keyed = {"A2A-Version": "1.0", "Idempotency-Key": f"anonymous-{uuid.uuid4()}"}
    assert http_calls.post(url, json=body, headers=keyed).status_code == 200
    refused = http_calls.post(url, json=body, headers=keyed)
    assert refused.status_code == 409
    assert refused.json()["error"]["details"][0]["metadata"]["code"] == "idempotency_key_conflict"
