"""The edge's errors: one shape, one table of wire forms, and one boundary for everything else.

Every refusal class has its wire form in ``app.errors.WIRE_FORMS``; once registered, the a2a-sdk answers
with exactly that form over JSON-RPC and HTTP+JSON, and docs/A2A_EDGE.md's table says the same. An
exception that is not an A2A error (SQL, a bug) reaches the customer as an internal error with a generic
message, over every binding the SDK serves, never with its own text.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.request_handlers.response_helpers import build_error_response
from a2a.server.routes import create_jsonrpc_routes, create_rest_routes
from a2a.utils.error_handlers import build_rest_error_payload
from a2a.utils.errors import A2A_ERROR_MAPPING, A2A_ERROR_REASONS, A2A_REASON_TO_ERROR, JSON_RPC_ERROR_CODE_MAP
from starlette.applications import Starlette

from app import errors
from app.errors import WIRE_FORMS, EdgeError, register_with_sdk
from app.handler import EdgeRequestHandler
from core.errors import ServiceError

EDGE_DOC = Path(__file__).resolve().parents[2] / "docs" / "A2A_EDGE.md"
SECRET_TEXT = 'relation "edge_tasks" violates ... SELECT * FROM ledger_accounts /srv/app/secret.py'


def all_subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    for sub in cls.__subclasses__():
        found |= {sub, *all_subclasses(sub)}
    return found


def test_every_edge_error_class_has_its_wire_form_in_the_table() -> None:
    assert all_subclasses(EdgeError) == set(WIRE_FORMS)


def test_json_rpc_codes_are_distinct_and_follow_the_http_status() -> None:
    # A refinement of JSON-RPC's own invalid params keeps its code, which InvalidValue also answers (with its
    # own reason); every other code names one refusal.
    codes = [form.json_rpc_code for cls, form in WIRE_FORMS.items() if cls is not errors.InvalidParams]
    assert len(codes) == len(set(codes))
    for cls, form in WIRE_FORMS.items():
        if not -32768 <= form.json_rpc_code <= -32000:  # JSON-RPC's own codes (parse error, invalid params) aside
            assert -form.json_rpc_code // 100 == form.http_status, cls


@pytest.mark.parametrize("cls", list(WIRE_FORMS), ids=lambda cls: cls.__name__)
def test_the_sdk_answers_each_refusal_with_its_registered_wire_form(cls: type[EdgeError]) -> None:
    register_with_sdk()
    form = WIRE_FORMS[cls]
    refused = cls("what to do about it", code=f"{cls.code}_specific", limit_bytes=5)

    rpc = build_error_response(7, refused)["error"]
    assert rpc["code"] == form.json_rpc_code
    assert rpc["message"] == "what to do about it"
    assert rpc["data"][0]["reason"] == cls.code.upper()
    assert rpc["data"][0]["metadata"] == {"code": f"{cls.code}_specific", "limit_bytes": "5"}

    rest = build_rest_error_payload(refused)["error"]
    assert (rest["code"], rest["status"]) == (form.http_status, form.grpc_status)
    assert rest["details"][0]["reason"] == cls.code.upper()
    assert rest["details"][0]["metadata"]["code"] == f"{cls.code}_specific"

    for binding in ("jsonrpc", "rest"):
        assert errors.error_response(refused, binding).status_code == form.http_status


def test_registering_twice_changes_nothing() -> None:
    register_with_sdk()
    tables = [dict(table) for table in (JSON_RPC_ERROR_CODE_MAP, A2A_ERROR_MAPPING, A2A_ERROR_REASONS, A2A_REASON_TO_ERROR)]
    register_with_sdk()
    assert tables == [
        dict(table) for table in (JSON_RPC_ERROR_CODE_MAP, A2A_ERROR_MAPPING, A2A_ERROR_REASONS, A2A_REASON_TO_ERROR)
    ]


def test_the_documented_refusals_are_the_registered_ones() -> None:
    """docs/A2A_EDGE.md's table of refusals: every row is a wire form of the table, and every form has a row."""
    rows = re.findall(r"^\| (`[^|]+) \| (\d{3}) \| (-\d+) \|", EDGE_DOC.read_text(), re.MULTILINE)
    documented: dict[tuple[int, int], set[str]] = {}
    for codes, http, rpc in rows:  # two rows may share a form (invalid_value and invalid_params: -32602)
        documented.setdefault((int(http), int(rpc)), set()).update(re.findall(r"`([a-z_]+)`", codes))
    registered = {(form.http_status, form.json_rpc_code): cls for cls, form in WIRE_FORMS.items()}
    assert set(documented) == set(registered)
    for cls, form in WIRE_FORMS.items():
        if cls is not errors.KeyRejected:  # documented by the reasons it carries (key_expired, ...)
            key = (form.http_status, form.json_rpc_code)
            assert cls.code in documented[key], (cls.__name__, documented[key])


def test_edge_errors_and_service_errors_have_one_shape() -> None:
    edge = errors.RateLimited("retry in 3 s", retry_after_s=3)
    assert edge.code == "rate_limited" and edge.message == "retry in 3 s"
    assert edge.to_dict() == {"code": "rate_limited", "message": "retry in 3 s", "details": {"retry_after_s": "3"}}
    specific = errors.KeyRejected("the key expired", code="key_expired")
    assert specific.code == "key_expired" and errors.KeyRejected.code == "key_refused"
    assert specific.to_dict() == {"code": "key_expired", "message": "the key expired"}
    service = ServiceError("no such key", code="key_not_found")
    assert service.to_dict() == {"code": "key_not_found", "message": "no such key"}
    assert ServiceError("x", code="c", field="n").to_dict() == {"code": "c", "message": "x", "details": {"field": "n"}}


# --- the boundary for foreign errors -----------------------------------------------------------------


def test_every_sdk_entry_point_of_the_edge_handler_converts_foreign_errors() -> None:
    assert set(errors.SDK_ENTRY_POINTS) == set(RequestHandler.__abstractmethods__)
    for name in errors.SDK_ENTRY_POINTS:
        assert getattr(getattr(EdgeRequestHandler, name), "converts_foreign_errors", False), name


@errors.converting_foreign_errors
class Exploding(RequestHandler):
    """Every call fails the way a lost database or a bug would: with internal text in the exception."""

    async def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(SECRET_TEXT)

    on_get_task = on_list_tasks = on_cancel_task = on_message_send = _fail
    on_create_task_push_notification_config = on_get_task_push_notification_config = _fail
    on_list_task_push_notification_configs = on_delete_task_push_notification_config = _fail
    on_get_extended_agent_card = _fail

    async def on_message_send_stream(self, params: Any, context: ServerCallContext) -> AsyncGenerator[Any, None]:
        raise RuntimeError(SECRET_TEXT)
        yield  # an async generator, like the SDK's

    on_subscribe_to_task = on_message_send_stream


@pytest.fixture
def exploding_edge() -> httpx.AsyncClient:
    handler = Exploding()
    routes = [*create_jsonrpc_routes(handler, "/jsonrpc", enable_v0_3_compat=True), *create_rest_routes(handler)]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=Starlette(routes=routes)), base_url="http://edge")


def _rpc(method: str, params: dict) -> dict:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


MESSAGE = {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}


@pytest.mark.anyio
async def test_an_unforeseen_failure_answers_a_generic_internal_error_over_json_rpc(exploding_edge) -> None:
    async with exploding_edge as client:
        for method, params in (("GetTask", {"id": "t-1"}), ("SendMessage", MESSAGE), ("ListTasks", {})):
            answer = (await client.post("/jsonrpc", json=_rpc(method, params), headers={"A2A-Version": "1.0"})).json()
            assert answer["error"]["code"] == -32603, answer
            assert answer["error"]["message"] == errors.INTERNAL_MESSAGE
            assert "edge_tasks" not in str(answer)
        legacy = (await client.post("/jsonrpc", json=_rpc("tasks/get", {"id": "t-1"}))).json()  # 0.3, no header
        assert legacy["error"]["code"] == -32603 and "edge_tasks" not in str(legacy), legacy


@pytest.mark.anyio
async def test_an_unforeseen_failure_in_a_stream_answers_a_generic_internal_error(exploding_edge) -> None:
    async with exploding_edge as client:
        answer = await client.post(
            "/jsonrpc", json=_rpc("SendStreamingMessage", MESSAGE), headers={"A2A-Version": "1.0"}
        )
        assert "-32603" in answer.text and errors.INTERNAL_MESSAGE in answer.text
        assert "edge_tasks" not in answer.text


@pytest.mark.anyio
async def test_an_unforeseen_failure_answers_a_generic_internal_error_over_http_json(exploding_edge) -> None:
    async with exploding_edge as client:
        answer = await client.get("/tasks/t-1", headers={"A2A-Version": "1.0"})
        assert answer.status_code == 500
        assert answer.json()["error"]["message"] == errors.INTERNAL_MESSAGE
        assert "edge_tasks" not in answer.text
