"""Whole numbers read as integers in JSON, on both HTTP bindings: cards, task metadata, data parts, errors, SSE events.

Protobuf ``Struct`` holds numbers as doubles, and protobuf's JSON printer wrote
``"tariffCredits": 20.0``, ``"creditsCharged": 5.0``, ``"line": 8.0``; ``app/integers.py``
prints a whole double as an integer. Python's ``json`` keeps the distinction
(``5`` loads as ``int``, ``5.0`` as ``float``), so ``whole_floats`` finds any that is left.
The paid run is the demo review (the shipped reviewer, its scripted route) through a
whole `specialists serve` of its own.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from google.protobuf import json_format
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct

from app import integers
from app.errors import PayloadTooLarge
from core import db
from core.settings import Settings
from ledger import keys
from ledger.client import Ledger
from ops.cli_specialists import DEMO_PROJECT, DEMO_RULE, KNOWN_DEFECT
from tests import http_calls
from tests.app.conftest import PAID, PAID_TARIFF, STARTUP_TIMEOUT_S, message, rpc
from tests.conftest import TEST_SECRET
from tests.serve import RunningService, running_service

REVIEW_DEADLINE_S = 90.0  # generous: only "never" is a failure (the scripted review takes seconds)
POLL_S = 0.2
DEMO_CHARGE = 5  # the scripted demo review: 4 credits + 1 answered model call (tests/ops/test_demo.py)


def whole_floats(document: Any, path: str = "$") -> list[str]:
    """Every number in a JSON document that was written as a float although it is whole (``5.0``)."""
    if isinstance(document, float) and document.is_integer():
        return [f"{path} = {document!r}"]
    if isinstance(document, dict):
        return [found for key, value in document.items() for found in whole_floats(value, f"{path}.{key}")]
    if isinstance(document, list):
        return [found for index, value in enumerate(document) for found in whole_floats(value, f"{path}[{index}]")]
    return []


# --- the printer itself -----------------------------------------------------------------------


def test_whole_numbers_in_a_struct_print_as_integers_and_others_unchanged():
    integers.install()
    struct = Struct()
    struct.update({"whole": 5, "negative": -3, "zero": 0, "list": [1, 2.0, {"line": 8}], "fraction": 2.5,
                   "limit": 2**53, "past_limit": 2**53 + 2, "huge": 1e300, "tiny": 1e-300})
    printed = json.loads(json.dumps(MessageToDict(struct)))
    assert sorted(whole_floats(printed)) == ["$.huge = 1e+300", "$.past_limit = 9007199254740994.0"]
    assert (printed["whole"], printed["negative"], printed["zero"], printed["list"]) == (5, -3, 0, [1, 2, {"line": 8}])
    assert all(type(v) is int for v in (printed["whole"], printed["negative"], printed["zero"], printed["limit"]))
    assert printed["limit"] == 2**53
    assert type(printed["fraction"]) is float and printed["fraction"] == 2.5
    assert type(printed["past_limit"]) is float  # past 2**53 a whole double may be a rounding: it stays a double
    assert type(printed["tiny"]) is float


def test_installing_twice_patches_once():
    integers.install()
    integers.install()
    struct = Struct()
    struct.update({"n": 7})
    assert type(MessageToDict(struct)["n"]) is int


def test_start_up_fails_loudly_when_protobuf_moved_the_printer_hook(monkeypatch):
    monkeypatch.setattr(json_format, "_Printer", type("_Printer", (), {}))  # a release without the method
    with pytest.raises(integers.IntegerPrintingUnavailable, match="_ValueMessageToJsonObject"):
        integers.install()


def test_error_details_carry_whole_numbers_without_a_decimal_point():
    error = PayloadTooLarge("too big", limit=5.0, used=2.5, exact=7)
    assert error.details == {"limit": "5", "used": "2.5", "exact": "7"}


# --- over the edge: cards, the extended card, errors (edge_a) ---------------------------------


def test_cards_carry_tariffs_and_limits_as_integers(edge_a, make_customer):
    card = http_calls.get(f"{edge_a.specialist(PAID)}/.well-known/agent-card.json").json()
    params = card["capabilities"]["extensions"][0]["params"]
    assert type(params["tariffCredits"]) is int and params["tariffCredits"] == PAID_TARIFF
    assert type(params["maxParts"]) is int
    assert whole_floats(card) == []
    assert whole_floats(http_calls.get(f"{edge_a.specialist(PAID)}/.well-known/agent-card-0.3.json").json()) == []
    customer = make_customer(credits=42)
    extended = http_calls.get(f"{edge_a.specialist(PAID)}/extendedAgentCard", headers=customer.headers).json()
    assert whole_floats(extended) == [] and type(extended["capabilities"]["extensions"][0]["params"]["availableCredits"]) is int
    over_rpc = http_calls.post(f"{edge_a.specialist(PAID)}/jsonrpc", json=rpc("GetExtendedAgentCard", {}),
                               headers=customer.headers).json()
    assert "result" in over_rpc and whole_floats(over_rpc) == []


def test_an_error_states_its_numbers_as_whole_numbers_on_both_bindings(edge_a, make_customer):
    customer = make_customer(credits=20)
    body = message(metadata={"credit_ceiling": 1})
    rest = http_calls.post(f"{edge_a.specialist(PAID)}/message:send", json=body, headers=customer.headers).json()
    metadata = rest["error"]["details"][0]["metadata"]
    assert (metadata["tariff_credits"], metadata["credit_ceiling"]) == (str(PAID_TARIFF), "1")
    over_rpc = http_calls.post(f"{edge_a.specialist(PAID)}/jsonrpc", json=rpc("SendMessage", body),
                               headers=customer.headers).json()
    metadata = over_rpc["error"]["data"][0]["metadata"]
    assert (metadata["tariff_credits"], metadata["credit_ceiling"]) == (str(PAID_TARIFF), "1")


# --- over a whole service: a paid review's task, findings and stream ---------------------------


@pytest.fixture(scope="module")
def service(server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    with running_service(server_url, tmp_path_factory.mktemp("integers"), ready_timeout_s=STARTUP_TIMEOUT_S) as running:
        yield running


@pytest.fixture
def reviewer_key(service: RunningService) -> dict[str, str]:
    url = service.env["DATABASE_URL"]
    engine = db.make_engine(url, Settings(database={"url": url}))
    try:
        customer_id = f"c-{uuid.uuid4().hex[:12]}"
        issued = keys.issue_key(engine, keys.KeySigner([TEST_SECRET], "test"), customer_id=customer_id,
                                ttl=timedelta(days=1))
        Ledger(engine).grant(customer_id, 100, operator="tests", skills=["reviewer"], reason="integer tests")
    finally:
        engine.dispose()
    return {"Authorization": f"Bearer {issued.token}", "A2A-Version": "1.0"}


def review_message() -> dict:
    parts = [{"text": DEMO_RULE}] + [
        {"raw": base64.b64encode(p.read_bytes()).decode(), "filename": p.relative_to(DEMO_PROJECT).as_posix(),
         "mediaType": "text/x-python" if p.suffix == ".py" else "text/plain"}
        for p in sorted(DEMO_PROJECT.rglob("*")) if p.is_file()
    ]
    return {"message": {"messageId": f"m-{uuid.uuid4()}", "role": "ROLE_USER", "parts": parts}}


def findings_of(task: dict) -> list[dict]:
    return next(a["parts"][0]["data"] for a in task["artifacts"] if a["name"] == "findings")


def assert_a_finished_review_reads_in_integers(task: dict) -> None:
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task["status"].get("message", {}).get("parts")
    charged = task["metadata"]["specialist"]["creditsCharged"]
    assert type(charged) is int and charged == DEMO_CHARGE
    lines = [f["line"] for f in findings_of(task) if f["path"] == KNOWN_DEFECT]
    assert lines and all(type(line) is int for line in lines)
    assert whole_floats(task) == []


def poll_task(get_task, deadline_s: float) -> dict:
    deadline = time.monotonic() + deadline_s
    while True:
        task = get_task()
        if task["status"]["state"] not in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"):
            return task
        assert time.monotonic() < deadline, f"the review did not finish within {deadline_s:g} s: {task['status']}"
        time.sleep(POLL_S)


@pytest.mark.timeout(180)
def test_a_paid_review_over_http_json_reads_in_integers(service, reviewer_key):
    base = f"{service.base_url}/specialists/reviewer"
    body = review_message() | {"configuration": {"returnImmediately": True}}
    sent = http_calls.post(f"{base}/message:send", json=body, headers=reviewer_key)
    assert sent.status_code == 200, sent.text
    task_id = sent.json()["task"]["id"]
    task = poll_task(lambda: http_calls.get(f"{base}/tasks/{task_id}", headers=reviewer_key).json(), REVIEW_DEADLINE_S)
    assert_a_finished_review_reads_in_integers(task)
    listed = http_calls.get(f"{base}/tasks", headers=reviewer_key).json()
    assert whole_floats(listed) == []


@pytest.mark.timeout(180)
def test_a_paid_review_streamed_over_json_rpc_reads_in_integers(service, reviewer_key):
    url = f"{service.base_url}/specialists/reviewer/jsonrpc"
    events: list[dict] = []
    with http_calls.stream("POST", url, json=rpc("SendStreamingMessage", review_message()), headers=reviewer_key,
                           timeout=REVIEW_DEADLINE_S) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line.removeprefix("data:")))
    results = [event["result"] for event in events]
    assert results and whole_floats(events) == []
    final = [r["statusUpdate"] for r in results if "statusUpdate" in r][-1]
    assert final["status"]["state"] == "TASK_STATE_COMPLETED"
    charged = final["metadata"]["specialist"]["creditsCharged"]
    assert type(charged) is int and charged == DEMO_CHARGE
    found = [r["artifactUpdate"]["artifact"] for r in results if "artifactUpdate" in r]
    lines = [f["line"] for a in found if a["name"] == "findings" for f in a["parts"][0]["data"]]
    assert lines and all(type(line) is int for line in lines)
    task_id = final["taskId"]
    task = http_calls.post(url, json=rpc("GetTask", {"id": task_id}), headers=reviewer_key).json()["result"]
    assert_a_finished_review_reads_in_integers(task)
