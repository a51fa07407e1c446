"""Body limits while reading, media type and encoding, and rate limits counted in PostgreSQL.

The strict edge accepts bodies of at most 4096 bytes and 4 requests per key per hour-long window.
"""

from __future__ import annotations

import gzip
import json
import re
import time

import httpx
import pytest

from tests import http_calls
from tests.app.conftest import NOTHING, PAID, footprint, message, rpc

pytestmark = pytest.mark.timeout(60, func_only=True)
LIMIT = 4096


def test_a_declared_body_over_the_limit_is_refused_before_it_is_read(strict_edge, engine, make_customer):
    customer = make_customer(credits=50)
    body = json.dumps(message(text="x" * (2 * LIMIT))).encode()
    answer = http_calls.post(
        f"{strict_edge.specialist(PAID)}/message:send",
        content=body,
        headers={**customer.headers, "Content-Type": "application/json"},
    )
    assert answer.status_code == 413
    error = answer.json()["error"]
    assert error["details"][0]["metadata"]["code"] == "payload_too_large"
    assert "SPECIALISTS_MAX_REQUEST_BODY_BYTES" in error["message"]
    assert footprint(engine, customer.customer_id) == NOTHING


def test_a_streamed_body_is_counted_as_it_arrives_and_refused_past_the_limit(strict_edge, engine, make_customer):
    customer = make_customer(credits=50)
    sent = []

    def chunks():  # no Content-Length: chunked transfer encoding
        for _ in range(64):
            sent.append(1024)
            yield b" " * 1024

    answer = http_calls.post(
        f"{strict_edge.specialist(PAID)}/jsonrpc",
        content=chunks(),
        headers={**customer.headers, "Content-Type": "application/json"},
    )
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == -41301
    assert footprint(engine, customer.customer_id) == NOTHING


def test_a_compressed_body_is_refused(strict_edge, engine, make_customer):
    customer = make_customer(credits=50)
    answer = http_calls.post(
        f"{strict_edge.specialist(PAID)}/message:send",
        content=gzip.compress(json.dumps(message()).encode()),
        headers={**customer.headers, "Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert answer.status_code == 415
    assert "uncompressed" in answer.json()["error"]["message"]
    assert footprint(engine, customer.customer_id) == NOTHING


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_that_is_not_json_is_refused_as_content_type_not_supported(strict_edge, make_customer, content_type):
    customer = make_customer(credits=50)
    headers = dict(customer.headers)
    if content_type:
        headers["Content-Type"] = content_type
    answer = http_calls.post(
        f"{strict_edge.specialist(PAID)}/message:send", content=json.dumps(message()).encode(), headers=headers
    )
    # A2A's own ContentTypeNotSupportedError in the spec's form (section 5.4 of v1.0.0, the kit's: 415).
    assert answer.status_code == 415
    assert answer.json()["error"]["details"][0]["reason"] == "CONTENT_TYPE_NOT_SUPPORTED"
    assert answer.json()["error"]["details"][0]["metadata"]["code"] == "content_type_not_supported"


@pytest.mark.parametrize("content_type", ["application/json", "application/a2a+json", "application/json; charset=utf-8"])
def test_both_json_media_types_are_accepted(strict_edge, make_customer, content_type):
    customer = make_customer(credits=50)
    answer = http_calls.post(
        f"{strict_edge.specialist(PAID)}/message:send",
        content=json.dumps(message(returnImmediately=True)).encode(),
        headers={**customer.headers, "Content-Type": content_type},
    )
    assert answer.status_code == 200, answer.text


def test_a_key_over_its_rate_limit_gets_429_with_retry_after_and_leaves_no_task(strict_edge, engine, make_customer):
    customer = make_customer(credits=1000)
    answers = []
    # 4 per window; a window boundary mid-test resets the count once, so 9 requests always hit the limit.
    for _ in range(9):
        answer = http_calls.post(
            f"{strict_edge.specialist(PAID)}/message:send",
            json=message(returnImmediately=True),
            headers=customer.headers,
        )
        answers.append(answer)
        if answer.status_code == 429:
            break
    refused = answers[-1]
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 3600
    assert refused.json()["error"]["details"][0]["metadata"]["code"] == "rate_limited"
    assert "SPECIALISTS_RATE_LIMIT_PER_KEY" in refused.json()["error"]["message"]
    admitted = sum(1 for a in answers if a.status_code == 200)
    assert footprint(engine, customer.customer_id)["tasks"] == admitted
    assert footprint(engine, customer.customer_id)["reservations"] == admitted


def test_rate_limited_json_rpc_callers_get_a_json_rpc_error(strict_edge, make_customer):
    customer = make_customer()
    url = f"{strict_edge.specialist('conformance')}/jsonrpc"
    for _ in range(9):
        answer = http_calls.post(url, json=rpc("GetTask", {"id": "nope"}), headers=customer.headers)
        if answer.status_code == 429:
            break
    assert answer.status_code == 429
    assert answer.json()["error"]["code"] == -42901
    assert "retry-after" in answer.headers


def test_the_rate_limit_is_per_key(strict_edge, make_customer):
    first, second = make_customer(), make_customer()
    url = f"{strict_edge.specialist('conformance')}/tasks"
    statuses = [http_calls.get(url, headers=first.headers).status_code for _ in range(9)]
    assert 429 in statuses
    assert http_calls.get(url, headers=second.headers).status_code == 200


def open_streams(edge) -> float:
    """The instance's own count of the streams it serves (its ``edge_open_streams`` gauge)."""
    metrics = http_calls.get(f"{edge.url}/metrics", timeout=30).text
    return float(re.search(r"^edge_open_streams (\S+)$", metrics, re.MULTILINE).group(1))


def wait_for_open_streams(edge, count: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while open_streams(edge) != count:
        assert time.monotonic() < deadline, f"the edge still serves {open_streams(edge):g} streams, not {count}"
        time.sleep(0.05)


def test_streams_beyond_the_instance_limit_are_refused_with_503_until_one_closes(strict_edge, make_customer):
    # Paid tasks: no runner anywhere runs them, so their streams stay open and quiet. One
    # customer per task keeps each key under the strict edge's tiny per-key rate limit.
    base = strict_edge.specialist(PAID)
    owners = [make_customer(credits=20) for _ in range(3)]
    tasks = [
        http_calls.post(f"{base}/message:send", json=message(returnImmediately=True), headers=c.headers).json()["task"]["id"]
        for c in owners
    ]

    def subscribe(client: httpx.Client, i: int):
        return client.stream("GET", f"{base}/tasks/{tasks[i]}:subscribe", headers=owners[i].headers)

    with httpx.Client(timeout=10) as http:
        with subscribe(http, 0) as one, subscribe(http, 1) as two:
            assert one.status_code == two.status_code == 200
            refused = http.get(f"{base}/tasks/{tasks[2]}:subscribe", headers=owners[2].headers)
            assert refused.status_code == 503
            assert refused.json()["error"]["details"][0]["metadata"]["code"] == "service_busy"
            assert "SPECIALISTS_MAX_OPEN_STREAMS" in refused.json()["error"]["message"]
        wait_for_open_streams(strict_edge, 0)  # the server lets a stream go once it sees its client disconnect
        with subscribe(http, 2) as three:
            assert three.status_code == 200


def test_a_json_rpc_body_that_is_not_json_gets_content_type_not_supported_as_a_json_rpc_error(strict_edge, make_customer):
    customer = make_customer()
    answer = http_calls.post(
        f"{strict_edge.specialist('conformance')}/jsonrpc",
        content=json.dumps(rpc("GetTask", {"id": "x"})).encode(),
        headers={**customer.headers, "Content-Type": "text/plain"},
    )
    assert answer.status_code == 415
    body = answer.json()
    assert body["jsonrpc"] == "2.0" and body["id"] is None and body["error"]["code"] == -32005


# --- The whole message and every list and short string in it (issue 15, item 4) --------------------------------
# Seen before: on conformance (limits.max_input_bytes 64 KiB) a 1.9 MB filename, a 1.9 MB extension URI and
# 100,000 referenceTaskIds were admitted and stored, because only part content was counted.

BIG = 1_900_000


def conformance_send(edge, customer, body: dict) -> httpx.Response:
    return http_calls.post(f"{edge.specialist('conformance')}/message:send", json=body,
                           headers={**customer.headers, "Content-Type": "application/json"})


def with_message(**fields: object) -> dict:
    body = message(returnImmediately=True)
    body["message"].update(fields)
    return body


OVERSIZE = {
    "filename": (with_message(parts=[{"url": "https://example.com/a", "filename": "f" * BIG}]), "field_too_long",
                 "SPECIALISTS_MAX_NAME_CHARS"),
    "mediaType": (with_message(parts=[{"text": "hi", "mediaType": "text/" + "p" * 300}]), "field_too_long",
                  "SPECIALISTS_MAX_NAME_CHARS"),
    "extension-uri": (with_message(extensions=["urn:" + "x" * BIG]), "field_too_long", "SPECIALISTS_MAX_URI_CHARS"),
    "extensions": (with_message(extensions=[f"urn:x:{i}" for i in range(33)]), "list_too_long",
                   "SPECIALISTS_MAX_LIST_ITEMS"),
    "referenceTaskIds-100k": (with_message(referenceTaskIds=[f"{i}" for i in range(100_000)]),
                              "body_elements_over_limit", "SPECIALISTS_MAX_BODY_ELEMENTS"),
    "referenceTaskIds": (with_message(referenceTaskIds=[f"t{i}" for i in range(33)]), "list_too_long",
                         "SPECIALISTS_MAX_LIST_ITEMS"),
    "referenceTaskId-long": (with_message(referenceTaskIds=["t" * 37]), "field_too_long", "MAX_ID_CHARS"),
    "acceptedOutputModes": ({**message(), "configuration": {"returnImmediately": True,
                                                            "acceptedOutputModes": ["text/plain"] * 33}},
                            "list_too_long", "SPECIALISTS_MAX_LIST_ITEMS"),
    "tenant": ({**message(returnImmediately=True), "tenant": "t" * 300}, "field_too_long",
               "SPECIALISTS_MAX_NAME_CHARS"),
    "part-metadata": (with_message(parts=[{"text": "hi", "metadata": {"k": "v" * 70_000}}]), "payload_too_large",
                      "limits.max_input_bytes"),
}


@pytest.mark.parametrize("case", list(OVERSIZE))
def test_every_field_of_a_message_is_bounded_and_refused_with_a_stable_code(edge_a, engine, make_customer, case):
    customer = make_customer()
    body, code, setting = OVERSIZE[case]
    answer = conformance_send(edge_a, customer, body)
    assert answer.status_code == 413, answer.text[:300]
    error = answer.json()["error"]
    assert error["details"][0]["metadata"]["code"] == code, error
    assert setting in error["message"], error["message"]
    assert footprint(engine, customer.customer_id) == NOTHING


def test_the_whole_message_counts_against_the_specs_input_limit(edge_a, engine, make_customer):
    """64 KiB on conformance: text under it is admitted; the same text with 2 KiB of part names is not."""
    customer = make_customer()
    text = "x" * (64 * 1024 - 512)
    assert conformance_send(edge_a, customer, with_message(parts=[{"text": text}])).status_code == 200
    names = [{"text": "y", "filename": "n" * 250, "mediaType": "text/plain"} for _ in range(10)]
    answer = conformance_send(edge_a, customer, with_message(parts=[{"text": text}, *names]))
    assert answer.status_code == 413, answer.text[:300]
    assert "limits.max_input_bytes" in answer.json()["error"]["message"]
    assert footprint(engine, customer.customer_id)["tasks"] == 1


def test_lists_and_names_at_their_caps_are_admitted(edge_a, make_customer):
    customer = make_customer()
    body = with_message(referenceTaskIds=[f"t{i}" for i in range(32)], extensions=[f"urn:x:{i}" for i in range(32)],
                        parts=[{"url": "https://example.com/a", "filename": "f" * 256, "mediaType": "text/plain"}])
    assert conformance_send(edge_a, customer, body).status_code == 200
