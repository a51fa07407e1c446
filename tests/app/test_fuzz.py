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

import base64
import json
import re
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


@pytest.fixture(scope="module")
def other_customer(edge_a, engine: Engine, signer: keys.KeySigner, ledger) -> Customer:
    """Another customer with a task: no answer to the fuzzing customer may name its id, its task or its context."""
    customer_id = f"other-{uuid.uuid4().hex[:12]}"
    issued = keys.issue_key(engine, signer, customer_id=customer_id, ttl=timedelta(days=1))
    ledger.grant(customer_id, 100, operator="tests", skills=[PAID], reason="fuzz bystander")
    other = Customer(customer_id=customer_id, key_id=issued.identity.key_id, key=issued.token)
    task = httpx.post(f"{edge_a.specialist(PAID)}/message:send", json=a_message(), timeout=60,
                      headers={"Authorization": f"Bearer {other.key}", "A2A-Version": "1.0"}).json()["task"]
    FOREIGN_IDS.update({customer_id, task["id"], task["contextId"]})
    return other


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
        "counts", "size", "number", "number",
    ]))
    if fault == "counts":
        return draw(over_counts())
    if fault == "size":
        return draw(over_size())
    if fault == "number":
        return draw(bad_numbers())
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


# Counts (issue 15, items 2 and 4): lists over their caps, and bodies of more values than
# SPECIALISTS_MAX_BODY_ELEMENTS (20,000), all within the 2 MiB body limit.
@st.composite
def over_counts(draw: st.DrawFn) -> dict:
    field = draw(st.sampled_from(["parts", "referenceTaskIds", "extensions", "metadata", "acceptedOutputModes"]))
    count = draw(st.sampled_from([33, 1_000, 20_001, 100_000]))  # over max_list_items (32), max_parts (2), ...
    if field == "parts":
        return a_message(parts=[{"text": "a"}] * count)
    if field == "referenceTaskIds":
        return a_message(referenceTaskIds=[f"t{i}" for i in range(min(count, 60_000))])
    if field == "extensions":
        return a_message(extensions=[f"urn:x:{i}" for i in range(min(count, 60_000))])
    if field == "metadata":
        return a_message(metadata={f"k{i}": 1 for i in range(max(count, 1_000))})  # over 512 bytes
    params = a_message()
    params["configuration"]["acceptedOutputModes"] = ["text/plain"] * count
    return params


# Whole-message size: the paid specialist takes 1,024 bytes; every field counts, not only part content.
@st.composite
def over_size(draw: st.DrawFn) -> dict:
    n = draw(st.sampled_from([1_100, 70_000, 1_900_000]))
    field = draw(st.sampled_from(["filename", "mediaType", "extension", "reference", "partMetadata", "tenant"]))
    if field == "filename":
        return a_message(parts=[{"url": "https://example.com/a", "filename": "f" * n}])
    if field == "mediaType":
        return a_message(parts=[{"text": "hi", "mediaType": "text/" + "p" * n}])
    if field == "extension":
        return a_message(extensions=["urn:" + "x" * n])
    if field == "reference":
        return a_message(referenceTaskIds=["t" * n])
    if field == "partMetadata":
        return a_message(parts=[{"text": "hi", "metadata": {"k": "v" * n}}])
    params = a_message()
    params["tenant"] = "t" * n
    return params


NOT_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e400", "9" * 5_000, "-" + "1" * 4_400, "1" + "0" * 50]


@st.composite
def bad_numbers(draw: st.DrawFn) -> object:
    """A number the service cannot hold, in the ceiling, in data, in metadata. Returned as text (json cannot
    write most of them): the caller splices it into the body."""
    literal = draw(st.sampled_from(NOT_FINITE))
    where = draw(st.sampled_from(["ceiling", "data", "metadata", "historyLength"]))
    return RawParams(literal, where)


class RawParams:
    """Params holding a number literal json.dumps cannot write; ``text()`` is the JSON of them."""

    def __init__(self, literal: str, where: str) -> None:
        self.literal, self.where = literal, where

    def text(self) -> str:
        marker = "__NUMBER__"
        if self.where == "ceiling":
            params = a_message(metadata={"credit_ceiling": marker})
        elif self.where == "data":
            params = a_message(parts=[{"data": {"v": marker}}])
        elif self.where == "metadata":
            params = a_message(metadata={"x": [1, marker]})
        else:
            params = a_message()
            params["configuration"]["historyLength"] = marker
        return json.dumps(params).replace(f'"{marker}"', self.literal)


def dumps(value: object) -> str:
    return value.text() if isinstance(value, RawParams) else json.dumps(value)


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
        params = draw(faulty_params())
        marker = '"__PARAMS__"'
        return json.dumps(envelope(method, "__PARAMS__")).replace(marker, dumps(params)).encode()
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
        return dumps(draw(faulty_params())).encode()
    if draw(st.booleans()):
        return deeply_nested('{"message":', "}", draw(list_depth), True)
    levels = draw(metadata_depth)
    return deeply_nested(
        '{"message":{"messageId":"m-deep","role":"ROLE_USER","parts":[{"text":"hi"}],"metadata":', "}}", levels, False
    )


# --- what every answer must be ---------------------------------------------------------------------


# What no answer may carry (item 3 of issue 15): SQL and its parameters, tracebacks, file paths, driver names.
# A pattern the request itself carried is an echo of the caller's own text, not a leak.
INTERNAL_TEXT = (
    "[SQL:", "[parameters:", "Background on this error", "sqlalchemy", "psycopg", "Traceback (most recent",
    'File "/', "site-packages", "/work/", "ledger_", "edge_tasks", "dispatch_outbox", "Exceeds the limit",
)
# Ids that belong to another customer, filled by the ``other_customer`` fixture: no answer may name them.
FOREIGN_IDS: set[str] = set()


def assert_no_internal_text(answer: httpx.Response, sent: bytes | str = b"") -> None:
    sent_text = sent.decode("utf-8", "replace") if isinstance(sent, bytes) else sent
    for pattern in (*INTERNAL_TEXT, *FOREIGN_IDS):
        assert pattern not in answer.text or pattern in sent_text, f"{pattern!r} in {answer.text[:500]}"


def assert_jsonrpc_error(answer: httpx.Response, sent: bytes | str = b"") -> None:
    assert_no_internal_text(answer, sent)
    assert answer.status_code < 500, f"{answer.status_code}: {answer.text[:300]}"
    assert answer.headers["content-type"].startswith("application/json"), answer.text[:300]
    payload = answer.json()
    assert isinstance(payload, dict) and payload.get("jsonrpc") == "2.0", payload
    assert "result" not in payload, payload
    assert isinstance(payload["error"]["code"], int) and isinstance(payload["error"]["message"], str), payload
    assert payload["error"]["code"] != INTERNAL_ERROR, f"JSON-RPC's own 500: {payload}"


def assert_rest_error(answer: httpx.Response, *, routed_elsewhere: bool = False, sent: bytes | str = b"") -> None:
    """A 4xx with the A2A error payload. A task id holding "/" (sent as %2F, which the router decodes)
    names another path: then no A2A handler is reached, and only "no success, no 5xx" is owed."""
    assert_no_internal_text(answer, sent)
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


def test_hostile_json_rpc_requests_get_protocol_errors_and_admit_nothing(edge_a, engine, customer, other_customer):
    before = table_sizes(engine)
    url = f"{edge_a.specialist(PAID)}/jsonrpc"
    with client_for(customer) as client:

        @FUZZ
        @given(body=jsonrpc_bodies())
        def probe(body: bytes) -> None:
            assert_jsonrpc_error(client.post(url, content=body), body)

        probe()
    assert footprint(engine, customer.customer_id) == NOTHING
    assert table_sizes(engine) == before


def test_hostile_http_json_requests_get_protocol_errors_and_admit_nothing(edge_a, engine, customer, other_customer):
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
            assert_rest_error(answer, routed_elsewhere=route != "send" and route != "stream" and "/" in task_id,
                              sent=body + task_id.encode("utf-8", "replace"))

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


# --- Reads: ListTasks and GetTask (issue 15, item 3) ----------------------------------------------------------
# A page token is opaque: the store decodes it (base64, then JSON) and compares its parts in SQL. "AAAA" (three
# NUL bytes once decoded) used to reach PostgreSQL and answer -32603 / 500. Every answer here must be a result
# or a 4xx refusal, never internal text or another customer's ids.


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


page_tokens = st.one_of(
    st.sampled_from(["AAAA", "AA==", "====", "%%%", "e30", _b64(b'{"ts":1,"id":""}'), _b64(b'{"ts":-1,"id":"x"}'),
                     _b64(b'{"ts":1e999,"id":"x"}'), _b64(b'{"ts":' + b"9" * 30 + b',"id":"x"}'),
                     _b64(b'{"ts":null,"id":"' + b"x" * 400 + b'"}'), _b64(b'{"ts":null,"id":"a\\u0000"}')]),
    texts(max_size=80),
    st.binary(max_size=120).map(_b64),
    st.builds(lambda ts, task_id: _b64(json.dumps({"ts": ts, "id": task_id}).encode()),
              st.one_of(st.none(), st.integers(), st.booleans(), texts(max_size=5)), texts(max_size=60)),
    st.integers(min_value=300, max_value=100_000).map(lambda n: "A" * n),
)
list_params = st.fixed_dictionaries({}, optional={
    "pageToken": page_tokens,
    "pageSize": st.one_of(st.integers(min_value=-2**31, max_value=2**31 - 1), st.integers(), texts(max_size=8)),
    "contextId": st.one_of(texts(max_size=80), st.just("x" * 5_000)),
    "status": st.one_of(st.integers(min_value=-5, max_value=20), texts(max_size=30)),
    "statusTimestampAfter": st.one_of(texts(max_size=40), st.sampled_from(
        ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "10000-01-01T00:00:00Z", "-1", "1e999"])),
    "historyLength": st.one_of(st.integers(min_value=-2**31, max_value=2**31 - 1), texts(max_size=8)),
    "includeArtifacts": st.one_of(st.booleans(), texts(max_size=5)),
})


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
def test_hostile_list_and_get_requests_answer_results_or_refusals_never_internal_text(
    edge_a, customer, other_customer, binding
):
    base = edge_a.specialist(PAID)
    with client_for(customer) as client:
        # One task of its own, so that a listing has something to page through.
        client.post(f"{base}/message:send", content=json.dumps(a_message()))

        @FUZZ
        @given(params=list_params, task_id=st.one_of(texts(max_size=60), st.sampled_from(list(FOREIGN_IDS))),
               get=st.booleans())
        def probe(params: dict, task_id: str, get: bool) -> None:
            if binding == "jsonrpc":
                method, sent = ("GetTask", {"id": task_id, **params}) if get else ("ListTasks", params)
                body = json.dumps(envelope(method, sent))
                answer = client.post(f"{base}/jsonrpc", content=body)
                assert_no_internal_text(answer, body)
                assert answer.status_code < 500, answer.text[:300]
                payload = answer.json()
                assert "result" in payload or payload["error"]["code"] != INTERNAL_ERROR, payload
                if "result" in payload:
                    assert not FOREIGN_IDS & set(re.findall(r'"([^"]+)"', answer.text)), answer.text[:300]
                return
            query = {key: value if isinstance(value, str) else json.dumps(value) for key, value in params.items()}
            if get:
                answer = client.get(f"{base}/tasks/{quote(task_id, safe='')}", params=query)
            else:
                answer = client.get(f"{base}/tasks", params=query)
            sent = json.dumps(params) + task_id
            assert_no_internal_text(answer, sent)
            assert answer.status_code < 500, f"{answer.status_code}: {answer.text[:300]}"
            if answer.status_code == 200:
                assert not FOREIGN_IDS & set(re.findall(r'"([^"]+)"', answer.text)), answer.text[:300]

        probe()


@pytest.mark.parametrize("token", ["AAAA", _b64(b'{"ts":null,"id":"a\\u0000"}'), "A" * 400])
def test_a_page_token_the_edge_did_not_issue_is_refused_with_a_stable_code(edge_a, customer, token):
    base = edge_a.specialist(PAID)
    with client_for(customer) as client:
        rpc_answer = client.post(f"{base}/jsonrpc", content=json.dumps(envelope("ListTasks", {"pageToken": token})))
        rest_answer = client.get(f"{base}/tasks", params={"pageToken": token})
    error = rpc_answer.json()["error"]
    assert (error["code"], error["data"][0]["metadata"]["code"]) == (-32602, "page_token_invalid"), error
    assert rest_answer.status_code == 400, rest_answer.text
    assert rest_answer.json()["error"]["details"][0]["metadata"]["code"] == "page_token_invalid"


def test_a_page_token_the_edge_issued_still_pages(edge_a, make_customer):
    owner = make_customer(credits=50)
    # Tasks nobody works on: pages follow the tasks' update times, which a running task would move between calls.
    base = edge_a.specialist(PAID)
    headers = {**owner.headers, "Content-Type": "application/json"}
    for _ in range(3):
        httpx.post(f"{base}/message:send", content=json.dumps(a_message()), headers=headers, timeout=60)
    first = httpx.get(f"{base}/tasks", params={"pageSize": 2}, headers=headers, timeout=60).json()
    assert len(first["tasks"]) == 2 and first["nextPageToken"]
    second = httpx.get(f"{base}/tasks", params={"pageSize": 2, "pageToken": first["nextPageToken"]},
                       headers=headers, timeout=60).json()
    assert len(second["tasks"]) == 1
    assert {t["id"] for t in first["tasks"]}.isdisjoint(t["id"] for t in second["tasks"])
