"""Stream slots: one customer cannot take every stream of an instance, and a full instance says so with 503.

The streams edge serves at most 3 streams, at most 2 of one customer. Paid tasks stream quietly: no runner
anywhere runs them, so their streams stay open until the client leaves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import pytest

from ledger.verify import verify
from tests import http_calls
from tests.app.conftest import PAID, message, rpc, start_edge, stop_edge
from tests.app.test_limits import wait_for_open_streams

pytestmark = pytest.mark.timeout(60, func_only=True)
INSTANCE_STREAMS = 3
CUSTOMER_STREAMS = 2
RETRY_AFTER_S = 7


@pytest.fixture(scope="module")
def streams_edge(database_url, edge_specs_dir, edge_logs):
    edge = start_edge(database_url, edge_specs_dir, edge_logs, "streams", max_open_streams=str(INSTANCE_STREAMS),
                      max_open_streams_per_customer=str(CUSTOMER_STREAMS), stream_retry_after_s=str(RETRY_AFTER_S))
    yield edge
    stop_edge(edge)


def paid_task(base: str, customer) -> str:
    answer = http_calls.post(f"{base}/message:send", json=message(returnImmediately=True), headers=customer.headers)
    return answer.json()["task"]["id"]


@contextlib.contextmanager
def subscribed(http: httpx.Client, base: str, customer, task_id: str) -> Iterator[httpx.Response]:
    with http.stream("GET", f"{base}/tasks/{task_id}:subscribe", headers=customer.headers) as stream:
        assert stream.status_code == 200, stream.read()
        yield stream


def refused_over_json_rpc(http: httpx.Client, base: str, customer, task_id: str) -> httpx.Response:
    return http.post(f"{base}/jsonrpc", json=rpc("SubscribeToTask", {"id": task_id}), headers=customer.headers)


def refused_over_http_json(http: httpx.Client, base: str, customer, task_id: str) -> httpx.Response:
    return http.get(f"{base}/tasks/{task_id}:subscribe", headers=customer.headers)


def books_are_clean(engine, *customers) -> bool:
    with engine.connect() as conn:
        return all(verify(conn, customer.customer_id) == [] for customer in customers)


def test_one_customer_gets_its_cap_of_streams_and_another_still_streams(streams_edge, engine, make_customer):
    base = streams_edge.specialist(PAID)
    greedy, other = make_customer(credits=50), make_customer(credits=50)
    tasks = [paid_task(base, greedy) for _ in range(CUSTOMER_STREAMS + 1)]
    with httpx.Client(timeout=10) as http, contextlib.ExitStack() as open_streams:
        for task_id in tasks[:CUSTOMER_STREAMS]:
            open_streams.enter_context(subscribed(http, base, greedy, task_id))
        for refuse in (refused_over_http_json, refused_over_json_rpc):
            refused = refuse(http, base, greedy, tasks[-1])
            assert refused.status_code == 429 and refused.headers["Retry-After"] == str(RETRY_AFTER_S)
            error = refused.json()["error"]
            assert "SPECIALISTS_MAX_OPEN_STREAMS_PER_CUSTOMER" in error["message"]
            code = error["details"][0]["metadata"]["code"] if "details" in error else error["data"][0]["metadata"]["code"]
            assert code == "customer_stream_cap"
        with subscribed(http, base, other, paid_task(base, other)):
            pass
    wait_for_open_streams(streams_edge, 0)
    assert books_are_clean(engine, greedy, other)


def test_a_full_instance_answers_503_with_retry_after_on_both_bindings(streams_edge, engine, make_customer):
    base = streams_edge.specialist(PAID)
    customers = [make_customer(credits=50) for _ in range(INSTANCE_STREAMS + 1)]
    tasks = [paid_task(base, customer) for customer in customers]
    with httpx.Client(timeout=10) as http, contextlib.ExitStack() as open_streams:
        for customer, task_id in zip(customers[:INSTANCE_STREAMS], tasks):
            open_streams.enter_context(subscribed(http, base, customer, task_id))
        late, task_id = customers[-1], tasks[-1]
        over_rest = refused_over_http_json(http, base, late, task_id)
        assert over_rest.status_code == 503 and over_rest.headers["Retry-After"] == str(RETRY_AFTER_S)
        assert over_rest.json()["error"]["details"][0]["metadata"]["code"] == "service_busy"
        over_rpc = refused_over_json_rpc(http, base, late, task_id)
        assert over_rpc.status_code == 503 and over_rpc.headers["Retry-After"] == str(RETRY_AFTER_S)
        body = over_rpc.json()
        assert body["jsonrpc"] == "2.0" and body["id"] == 1 and body["error"]["code"] == -50301
        assert "SPECIALISTS_MAX_OPEN_STREAMS" in body["error"]["message"]
    wait_for_open_streams(streams_edge, 0)
    with httpx.Client(timeout=10) as http, subscribed(http, base, customers[-1], tasks[-1]):
        pass  # a slot is free again
    assert books_are_clean(engine, *customers)
