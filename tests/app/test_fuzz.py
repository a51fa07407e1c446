"""Hostile input: hypothesis throws malformed requests at a real edge process, over both bindings.

Malformed JSON, JSON of the wrong shape, wrong types, huge strings, deep nesting, unknown methods and
bad ids. Every answer must be a protocol error (a JSON-RPC error object; an HTTP+JSON error payload
with a 4xx status), never a 500, and nothing may be admitted or reserved: the customer's footprint
stays empty and the task, outbox, message and reservation tables do not grow. The customer holds
credits and the paid specialist's entitlement, so a request that slipped through would be admitted.

Three faults this fuzz found are now refused by the edge's guard before the SDK or SQL sees them
(app/middleware.py, ``check_json_text``): a body that is not UTF-8, JSON nested deeper than
SPECIALISTS_MAX_JSON_DEPTH, and a NUL character (which PostgreSQL refuses in a text value) in the body
or the path. They used to be internal errors whose JSON-RPC message carried the failed SQL. The tests at
the end pin each of them.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from ledger import keys
from tests.app.conftest import NOTHING, PAID, Customer, footprint

pytestmark = pytest.mark.timeout(120, func_only=True)

FUZZ = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,  # the same cases every run: a failure here is reproducible, not a flake
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
# Methods the edge serves (A2A 1.0 names and the 0.3 ones): an "unknown" method is none of these.
KNOWN_METHODS = {
    "SendMessage", "SendStreamingMessage", "GetTask", "ListTasks", "CancelTask", "SubscribeToTask",
    "CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig", "ListTaskPushNotificationConfigs",
    "DeleteTaskPushNotificationConfig", "GetExtendedAgentCard", "message/send", "message/stream", "tasks/get",
    "tasks/list", "tasks/cancel", "tasks/resubscribe", "tasks/pushNotificationConfig/set",
    "tasks/pushNotificationConfig/get", "tasks/pushNotificationConfig/list", "tasks/pushNotificationConfig/delete",
    "agent/getAuthenticatedExtendedCard",
}
INTERNAL_ERROR = -32603  # JSON-RPC's "Internal error": the server failed, not the request
BODY_LIMIT_BYTES = 2 * 1024 * 1024  # SPECIALISTS_MAX_REQUEST_BODY_BYTES' default, which the edge runs with


@pytest.fixture(scope="module")
def customer(engine: Engine, signer: keys.KeySigner, ledger) -> Customer:
    """Entitled to the paid specialist, with credits: only the requests' faults can stop an admission."""
    customer_id = f"fuzz-{uuid.uuid4().hex[:12]}"
    issued = keys.issue_key(engine, signer, customer_id=customer_id, ttl=timedelta(days=1))
    ledger.grant(customer_id, 1_000, operator="tests", skills=[PAID], reason="fuzz")
    return Customer(customer_id=customer_id, key_id=issued.identity.key_id, key=issued.token)


def table_sizes(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            table: conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
            for table in ("edge_tasks", "tasks", "dispatch_outbox", "edge_messages", "ledger_reservations")
        }


# --- strategies ------------------------------------------------------------------------------------


def texts(**sizes: int) -> st.SearchStrategy[str]:
    """Any text, NUL included (PostgreSQL cannot store it: the guard refuses it, pinned at the end)."""
    return st.text(**sizes)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | texts(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts(max_size=12), inner, max_size=4),
    max_leaves=12,
)
not_an_object = st.one_of(st.none(), st.booleans(), st.integers(), texts(max_size=40), st.lists(json_values, max_size=4))
not_a_string = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.lists(texts(), max_size=3), st.dictionaries(texts(max_size=5), st.integers(), max_size=3))
not_a_list = st.one_of(st.none(), st.booleans(), st.integers(), texts(max_size=20), st.dictionaries(texts(max_size=5), st.integers(), max_size=3))
huge_text = st.sampled_from([1_025, 70_000, 600_000, BODY_LIMIT_BYTES + 1]).map(lambda n: "x" * n)
# Nested lists never make valid params, at any depth: below and far above SPECIALISTS_MAX_JSON_DEPTH (100) and
# Python's own recursion limit. Nested metadata starts at 120 levels, over 512 bytes: more than the paid
# specialist's max_metadata_bytes, so even a depth the guard lets through could not be admitted.
list_depth = st.integers(min_value=2, max_value=4_000)
metadata_depth = st.integers(min_value=120, max_value=4_000)


def a_message(**overrides: object) -> dict:
    """A SendMessageRequest that would be admitted, before a fault is put into it."""
    message = {"messageId": f"m-{uuid.uuid4()}", "role": "ROLE_USER", "parts": [{"text": "hello"}]}
    message.update(overrides)
    # Not blocking: a request that slipped through would answer at once (with a result), not wait for the task.
    return {"message": message, "configuration": {"returnImmediately": True}}


@st.composite
def faulty_params(draw: st.DrawFn) -> dict | object:
    """SendMessage params with one fault each: wrong types, missing pieces, huge strings, bad values."""
    fault = draw(st.sampled_from([
        "params", "message", "parts", "part", "text", "message_id", "message_id_long", "role", "missing", "huge",
    ]))
    if fault == "params":
        return draw(not_an_object)
    if fault == "message":
        return {"message": draw(not_an_object)}
    if fault == "parts":
        return a_message(parts=draw(not_a_list))
    if fault == "part":
        return a_message(parts=[draw(st.one_of(not_an_object, st.just({}), st.just({"file": {}})))])
    if fault == "text":
        return a_message(parts=[{"text": draw(not_a_string.filter(lambda v: v is not None))}])
    if fault == "message_id":
        return a_message(messageId=draw(not_a_string.filter(lambda v: v is not None)))
    if fault == "message_id_long":
        return a_message(messageId="m" * draw(st.integers(min_value=257, max_value=200_000)))
    if fault == "role":
        return a_message(role=draw(texts(max_size=20).filter(lambda r: r not in ("ROLE_USER", "user", "1"))))
    if fault == "missing":
        key = draw(st.sampled_from(["messageId", "parts", "role"]))
        params = a_message()
        del params["message"][key]
        return params
    return a_message(parts=[{"text": draw(huge_text)}])


def deeply_nested(body_prefix: str, body_suffix: str, levels: int, as_list: bool) -> bytes:
    """Nesting built as text: Python's own json.dumps would give up first."""
    inner = "[" * levels + "]" * levels if as_list else '{"a":' * levels + "1" + "}" * levels
    return (body_prefix + inner + body_suffix).encode()


def truncated(document: dict, cut: int) -> bytes:
    """A proper prefix of a JSON object's text: never valid JSON."""
    raw = json.dumps(document).encode()
    return raw[: max(1, min(cut, len(raw) - 1))]


def not_json(draw: st.DrawFn) -> bytes:
    return draw(st.one_of(
        st.binary(max_size=200).filter(lambda raw: not _parses(raw)),  # mostly not UTF-8 either
        st.integers(min_value=1, max_value=400).map(lambda cut: truncated(envelope("SendMessage", a_message()), cut)),
    ))


def _parses(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


def envelope(method: object, params: object, request_id: object = 1) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


@st.composite
def jsonrpc_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["not_json", "not_an_object", "unknown_method", "envelope", "params", "task_id", "nested"]))
    if kind == "not_json":
        return not_json(draw)
    if kind == "not_an_object":
        return json.dumps(draw(not_an_object)).encode()
    if kind == "unknown_method":
        method = draw(st.one_of(texts(max_size=60), huge_text).filter(lambda m: m not in KNOWN_METHODS))
        return json.dumps(envelope(method, draw(json_values))).encode()
    if kind == "envelope":  # valid params in a broken envelope: no method, a method of the wrong type, bad ids
        fault = draw(st.sampled_from(["jsonrpc", "no_method", "method_type", "id"]))
        body = envelope("SendMessage", a_message())
        if fault == "jsonrpc":
            body["jsonrpc"] = draw(st.one_of(st.just("1.0"), st.integers(), st.none(), texts(max_size=5).filter(lambda v: v != "2.0")))
        elif fault == "no_method":
            del body["method"]
        elif fault == "method_type":
            body["method"] = draw(not_a_string)
        else:
            body["id"] = draw(st.one_of(st.lists(st.integers(), max_size=3), st.dictionaries(texts(max_size=5), st.integers(), max_size=3)))
        return json.dumps(body).encode()
    if kind == "params":
        method = draw(st.sampled_from(["SendMessage", "SendStreamingMessage"]))
        return json.dumps(envelope(method, draw(faulty_params()))).encode()
    if kind == "task_id":  # tasks that are not there, or ids that are not ids
        method = draw(st.sampled_from(["GetTask", "CancelTask", "SubscribeToTask"]))
        task_id = draw(st.one_of(texts(max_size=80), huge_text, not_a_string))
        return json.dumps(envelope(method, {"id": task_id})).encode()
    if draw(st.booleans()):
        return deeply_nested('{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":', "}", draw(list_depth), True)
    levels = draw(metadata_depth)
    return deeply_nested(
        '{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m-deep","role":"ROLE_USER",'
        '"parts":[{"text":"hi"}],"metadata":',
        "}}}",
        levels,
        False,
    )


@st.composite
def rest_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["not_json", "not_an_object", "params", "nested"]))
    if kind == "not_json":
        return not_json(draw)
    if kind == "not_an_object":
        return json.dumps(draw(not_an_object)).encode()
    if kind == "params":
        params = draw(faulty_params())
        return json.dumps(params).encode()
    if draw(st.booleans()):
        return deeply_nested('{"message":', "}", draw(list_depth), True)
    levels = draw(metadata_depth)
    return deeply_nested(
        '{"message":{"messageId":"m-deep","role":"ROLE_USER","parts":[{"text":"hi"}],"metadata":', "}}", levels, False
    )


# --- what every answer must be ---------------------------------------------------------------------


def assert_jsonrpc_error(answer: httpx.Response) -> None:
    assert answer.status_code < 500, f"{answer.status_code}: {answer.text[:300]}"
    assert answer.headers["content-type"].startswith("application/json"), answer.text[:300]
    payload = answer.json()
    assert isinstance(payload, dict) and payload.get("jsonrpc") == "2.0", payload
    assert "result" not in payload, payload
    assert isinstance(payload["error"]["code"], int) and isinstance(payload["error"]["message"], str), payload
    assert payload["error"]["code"] != INTERNAL_ERROR, f"JSON-RPC's own 500: {payload}"


def assert_rest_error(answer: httpx.Response, *, routed_elsewhere: bool = False) -> None:
    """A 4xx with the A2A error payload. A task id holding "/" (sent as %2F, which the router decodes)
    names another path: then no A2A handler is reached, and only "no success, no 5xx" is owed."""
    if routed_elsewhere:
        assert answer.status_code < 500 and not 200 <= answer.status_code < 300, f"{answer.status_code}: {answer.text[:300]}"
        return
    assert 400 <= answer.status_code < 500, f"{answer.status_code}: {answer.text[:300]}"
    payload = answer.json()
    assert isinstance(payload, dict) and isinstance(payload.get("error"), dict), payload


def client_for(customer: Customer) -> httpx.Client:
    return httpx.Client(
        headers={"Authorization": f"Bearer {customer.key}", "A2A-Version": "1.0", "Content-Type": "application/json"},
        timeout=30,
    )


# --- the fuzz ------------------------------------------------------------------------------------


def test_hostile_json_rpc_requests_get_protocol_errors_and_admit_nothing(edge_a, engine, customer):
    before = table_sizes(engine)
    url = f"{edge_a.specialist(PAID)}/jsonrpc"
    with client_for(customer) as client:

        @FUZZ
        @given(body=jsonrpc_bodies())
        def probe(body: bytes) -> None:
            assert_jsonrpc_error(client.post(url, content=body))

        probe()
    assert footprint(engine, customer.customer_id) == NOTHING
    assert table_sizes(engine) == before


def test_hostile_http_json_requests_get_protocol_errors_and_admit_nothing(edge_a, engine, customer):
    before = table_sizes(engine)
    base = edge_a.specialist(PAID)
    with client_for(customer) as client:

        @FUZZ
        @given(
            route=st.sampled_from(["send", "stream", "get", "cancel", "subscribe"]),
            body=rest_bodies(),
            task_id=st.one_of(texts(min_size=1, max_size=80), huge_text.map(lambda s: s[:8_000])),
        )
        def probe(route: str, body: bytes, task_id: str) -> None:
            quoted = quote(task_id, safe="")
            if route == "send":
                answer = client.post(f"{base}/message:send", content=body)
            elif route == "stream":
                answer = client.post(f"{base}/message:stream", content=body)
            elif route == "get":
                answer = client.get(f"{base}/tasks/{quoted}")
            elif route == "cancel":
                answer = client.post(f"{base}/tasks/{quoted}:cancel", content=b"{}")
            else:
                answer = client.get(f"{base}/tasks/{quoted}:subscribe")
            assert_rest_error(answer, routed_elsewhere=route != "send" and route != "stream" and "/" in task_id)

        probe()
    assert footprint(engine, customer.customer_id) == NOTHING
    assert table_sizes(engine) == before


# --- Faults this fuzz found, now refused by the edge's guard (app/middleware.py, check_json_text) ------
# A body that is not UTF-8, nests past SPECIALISTS_MAX_JSON_DEPTH, or carries a NUL (which PostgreSQL
# cannot store), and a NUL in the path: a parse error (JSON-RPC -32700) or 400, before the SDK or SQL.

NOT_UTF8 = [b"\x80", b'{"message": {"messageId": "m-\xc3"}}']


@pytest.mark.parametrize("body", NOT_UTF8)
def test_a_json_rpc_body_that_is_not_utf8_is_a_parse_error(edge_a, customer, body):
    with client_for(customer) as client:
        answer = client.post(f"{edge_a.specialist(PAID)}/jsonrpc", content=body)
    assert_jsonrpc_error(answer)
    assert answer.json()["error"]["code"] == -32700


@pytest.mark.parametrize("body", NOT_UTF8 + [b"\xff\xfe{}"])  # JSON-RPC reads this one as UTF-16: a parse error
def test_an_http_json_body_that_is_not_utf8_is_a_bad_request(edge_a, customer, body):
    with client_for(customer) as client:
        assert_rest_error(client.post(f"{edge_a.specialist(PAID)}/message:send", content=body))


def test_json_rpc_nested_deeper_than_the_parser_recurses_is_a_parse_error(edge_a, customer):
    body = deeply_nested('{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":', "}", 2_000, True)
    with client_for(customer) as client:
        assert_jsonrpc_error(client.post(f"{edge_a.specialist(PAID)}/jsonrpc", content=body))


NUL_REQUESTS = [
    ("jsonrpc", "GetTask", {"id": "a\x00b"}),
    ("jsonrpc", "CancelTask", {"id": "\x00"}),
    ("jsonrpc", "ListTasks", {"contextId": "a\x00"}),
    ("jsonrpc", "SendMessage", {"message": {"messageId": "m-\x00", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}),
    ("rest", "GET", "/tasks/a%00b"),
    ("rest", "POST", "/tasks/%00:cancel"),
]


@pytest.mark.parametrize("binding, method, target", NUL_REQUESTS, ids=lambda v: str(v)[:24])
def test_a_nul_character_in_an_id_is_refused_as_a_bad_request_without_telling_the_sql(
    edge_a, customer, binding, method, target
):
    with client_for(customer) as client:
        if binding == "jsonrpc":
            answer = client.post(f"{edge_a.specialist(PAID)}/jsonrpc", content=json.dumps(envelope(method, target)))
            assert_jsonrpc_error(answer)
        else:
            answer = client.request(method, f"{edge_a.specialist(PAID)}{target}", content=b"{}" if method == "POST" else None)
            assert_rest_error(answer)
    assert "SQL" not in answer.text
