"""A2A's own errors answer in the specification's forms (A2A 1.0 section 5.4) on every binding.

``app.errors.SPEC_WIRE_FORMS`` is the spec's table; the first tests hold it to the
spec's text (the rows below are copied from section 5.4 of the v1.0.0 release,
the one the conformance kit bundles) and to what the a2a-sdk answers once the edge registered
it. The rest trigger every row the edge can produce, for real, over JSON-RPC and
HTTP+JSON against a running edge, and check the whole wire form: the JSON-RPC
code with a ``google.rpc.ErrorInfo`` in ``error.data``; the HTTP status with a
``google.rpc.Status`` body (``code``, ``status``, ``message``, ``details``) whose
ErrorInfo carries the spec's reason and the domain ``a2a-protocol.org``.
Rows the edge cannot produce (it never relays an agent's response, configures the
extended card of every specialist, and requires no extension) are checked in the
table only.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from a2a.server.request_handlers.response_helpers import build_error_response
from a2a.utils import errors as sdk_errors
from a2a.utils.error_handlers import build_rest_error_payload

from app.errors import (
    SPEC_WIRE_FORMS,
    WIRE_FORMS,
    ContentTypeNotSupported,
    grpc_status_for,
    register_with_sdk,
    spec_reason,
)
from tests import http_calls
from tests.app.conftest import PAID, message, rpc

pytestmark = pytest.mark.timeout(120, func_only=True)
CONFORMANCE = "conformance"

# Section 5.4 of the A2A specification, v1.0.0 (the kit's specification/specification.md), verbatim.
SPEC_SECTION_5_4 = """
| A2A Error Type                        | JSON-RPC Code | gRPC Status           | HTTP Status                  |
| :------------------------------------ | :------------ | :-------------------- | :--------------------------- |
| `TaskNotFoundError`                   | `-32001`      | `NOT_FOUND`           | `404 Not Found`              |
| `TaskNotCancelableError`              | `-32002`      | `FAILED_PRECONDITION` | `409 Conflict`               |
| `PushNotificationNotSupportedError`   | `-32003`      | `UNIMPLEMENTED`       | `400 Bad Request`            |
| `UnsupportedOperationError`           | `-32004`      | `UNIMPLEMENTED`       | `400 Bad Request`            |
| `ContentTypeNotSupportedError`        | `-32005`      | `INVALID_ARGUMENT`    | `415 Unsupported Media Type` |
| `InvalidAgentResponseError`           | `-32006`      | `INTERNAL`            | `502 Bad Gateway`            |
| `ExtendedAgentCardNotConfiguredError` | `-32007`      | `FAILED_PRECONDITION` | `400 Bad Request`            |
| `ExtensionSupportRequiredError`       | `-32008`      | `FAILED_PRECONDITION` | `400 Bad Request`            |
| `VersionNotSupportedError`            | `-32009`      | `UNIMPLEMENTED`       | `400 Bad Request`            |
"""
# Section 11.6: the ErrorInfo reason is the type's name in UPPER_SNAKE_CASE without "Error".
SPEC_REASONS = {
    "TaskNotFoundError": "TASK_NOT_FOUND",
    "TaskNotCancelableError": "TASK_NOT_CANCELABLE",
    "PushNotificationNotSupportedError": "PUSH_NOTIFICATION_NOT_SUPPORTED",
    "UnsupportedOperationError": "UNSUPPORTED_OPERATION",
    "ContentTypeNotSupportedError": "CONTENT_TYPE_NOT_SUPPORTED",
    "InvalidAgentResponseError": "INVALID_AGENT_RESPONSE",
    "ExtendedAgentCardNotConfiguredError": "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
    "ExtensionSupportRequiredError": "EXTENSION_SUPPORT_REQUIRED",
    "VersionNotSupportedError": "VERSION_NOT_SUPPORTED",
}
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
DOMAIN = "a2a-protocol.org"


def spec_rows() -> dict[str, tuple[int, str, int]]:
    rows = {}
    for line in SPEC_SECTION_5_4.strip().splitlines()[2:]:
        name, code, grpc, http = (cell.strip().strip("`") for cell in line.strip().strip("|").split("|"))
        rows[name] = (int(code), grpc, int(http.split()[0]))
    return rows


# --- the table --------------------------------------------------------------------------


def test_the_spec_table_holds_exactly_the_rows_of_section_5_4() -> None:
    ours = {cls.__name__: (form.json_rpc_code, form.grpc_status, form.http_status) for cls, form in SPEC_WIRE_FORMS.items()}
    assert ours == spec_rows()


def test_each_spec_error_has_the_spec_reason() -> None:
    assert {cls.__name__: spec_reason(cls) for cls in SPEC_WIRE_FORMS} == SPEC_REASONS


def test_once_registered_the_sdk_answers_every_spec_row_in_its_form() -> None:
    register_with_sdk()
    for cls, form in SPEC_WIRE_FORMS.items():
        error = cls("what happened")
        rpc_error = build_error_response(3, error)["error"]
        assert rpc_error["code"] == form.json_rpc_code
        assert rpc_error["data"][0]["reason"] == SPEC_REASONS[cls.__name__]
        rest = build_rest_error_payload(error)["error"]
        assert (rest["code"], rest["status"]) == (form.http_status, form.grpc_status), cls
        assert (rest["details"][0]["@type"], rest["details"][0]["domain"]) == (ERROR_INFO, DOMAIN)
        assert rest["details"][0]["reason"] == SPEC_REASONS[cls.__name__]
        assert sdk_errors.A2A_REASON_TO_ERROR[SPEC_REASONS[cls.__name__]] is cls  # what a client raises


def test_grpc_status_for_gives_each_error_the_status_of_its_table() -> None:
    for cls, form in SPEC_WIRE_FORMS.items():
        assert grpc_status_for(cls("x")) == form.grpc_status
    for edge_cls, form in WIRE_FORMS.items():
        assert grpc_status_for(edge_cls("x")) == form.grpc_status
    assert grpc_status_for(sdk_errors.InvalidParamsError("x")) == "INVALID_ARGUMENT"
    assert grpc_status_for(sdk_errors.InternalError("x")) == "INTERNAL"


def test_an_edge_refusal_that_is_an_a2a_error_takes_the_spec_form_and_reason() -> None:
    register_with_sdk()
    refused = ContentTypeNotSupported("send JSON")
    assert isinstance(refused, sdk_errors.ContentTypeNotSupportedError)
    assert WIRE_FORMS[ContentTypeNotSupported] == SPEC_WIRE_FORMS[sdk_errors.ContentTypeNotSupportedError]
    info = build_rest_error_payload(refused)["error"]["details"][0]
    assert info["reason"] == "CONTENT_TYPE_NOT_SUPPORTED"
    assert info["metadata"]["code"] == "content_type_not_supported"


# --- over the real edge ----------------------------------------------------------------------


def assert_jsonrpc_form(response: httpx.Response, error_type: str) -> dict:
    code, _, _ = spec_rows()[error_type]
    body = response.json()
    assert "error" in body, body
    error = body["error"]
    assert error["code"] == code, (error_type, response.status_code, error)
    assert isinstance(error["message"], str) and error["message"]
    info = error["data"][0]
    assert (info["@type"], info["domain"], info["reason"]) == (ERROR_INFO, DOMAIN, SPEC_REASONS[error_type]), info
    return error


def assert_rest_form(response: httpx.Response, error_type: str) -> dict:
    _, grpc, http = spec_rows()[error_type]
    assert response.status_code == http, (error_type, response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert (error["code"], error["status"]) == (http, grpc), error
    assert isinstance(error["message"], str) and error["message"]
    info = error["details"][0]
    assert (info["@type"], info["domain"], info["reason"]) == (ERROR_INFO, DOMAIN, SPEC_REASONS[error_type]), info
    return error


@pytest.fixture
def caller(make_customer):
    return make_customer(credits=50)


@pytest.fixture
def finished_task_id(edge_alone, caller) -> str:
    """A task of the paid specialist (no worker serves it), canceled at once: finished, without a worker."""
    base = edge_alone.specialist(PAID)
    task = http_calls.post(f"{base}/message:send", json=message(returnImmediately=True), headers=caller.headers).json()
    canceled = http_calls.post(f"{base}/tasks/{task['task']['id']}:cancel", json={}, headers=caller.headers).json()
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED", canceled
    return canceled["id"]


def test_task_not_found(edge_alone, caller):
    base, missing = edge_alone.specialist(CONFORMANCE), str(uuid.uuid4())
    assert_jsonrpc_form(http_calls.post(f"{base}/jsonrpc", json=rpc("GetTask", {"id": missing}), headers=caller.headers),
                        "TaskNotFoundError")
    assert_rest_form(http_calls.get(f"{base}/tasks/{missing}", headers=caller.headers), "TaskNotFoundError")


def test_task_not_cancelable_when_canceling_a_finished_task(edge_alone, caller, finished_task_id):
    base = edge_alone.specialist(PAID)
    assert_jsonrpc_form(
        http_calls.post(f"{base}/jsonrpc", json=rpc("CancelTask", {"id": finished_task_id}), headers=caller.headers),
        "TaskNotCancelableError",
    )
    assert_rest_form(
        http_calls.post(f"{base}/tasks/{finished_task_id}:cancel", json={}, headers=caller.headers),
        "TaskNotCancelableError",
    )


def test_task_not_cancelable_when_canceling_a_completed_task_as_the_tck_does(edge_a, caller):
    """CORE-CANCEL-002: the kit completes a task on the conformance specialist, then cancels it."""
    base = edge_a.specialist(CONFORMANCE)
    task = http_calls.post(
        f"{base}/message:send", json=message(f"tck-complete-task-{uuid.uuid4()}"), headers=caller.headers
    ).json()["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert_jsonrpc_form(
        http_calls.post(f"{base}/jsonrpc", json=rpc("CancelTask", {"id": task["id"]}), headers=caller.headers),
        "TaskNotCancelableError",
    )
    assert_rest_form(http_calls.post(f"{base}/tasks/{task['id']}:cancel", json={}, headers=caller.headers),
                     "TaskNotCancelableError")


def test_push_notification_not_supported(edge_alone, caller, finished_task_id):
    base = edge_alone.specialist(PAID)
    config = {"url": "https://example.com/hook"}
    assert_jsonrpc_form(
        http_calls.post(f"{base}/jsonrpc", json=rpc("CreateTaskPushNotificationConfig",
                                                    {"taskId": finished_task_id, **config}), headers=caller.headers),
        "PushNotificationNotSupportedError",
    )
    assert_rest_form(
        http_calls.post(f"{base}/tasks/{finished_task_id}/pushNotificationConfigs", json=config, headers=caller.headers),
        "PushNotificationNotSupportedError",
    )
    # Asking for push updates in the send itself is refused the same way.
    body = message(taskPushNotificationConfig=config)
    assert_rest_form(http_calls.post(f"{base}/message:send", json=body, headers=caller.headers),
                     "PushNotificationNotSupportedError")


def test_unsupported_operation_for_a_follow_up_to_a_finished_task(edge_alone, caller, finished_task_id):
    base = edge_alone.specialist(PAID)
    follow_up = message(taskId=finished_task_id)
    assert_jsonrpc_form(http_calls.post(f"{base}/jsonrpc", json=rpc("SendMessage", follow_up), headers=caller.headers),
                        "UnsupportedOperationError")
    follow_up = message(taskId=finished_task_id)
    assert_rest_form(http_calls.post(f"{base}/message:send", json=follow_up, headers=caller.headers),
                     "UnsupportedOperationError")


def test_content_type_not_supported_for_a_part_the_specialist_does_not_take(edge_alone, caller):
    base = edge_alone.specialist(CONFORMANCE)

    def image_message() -> dict:
        body = message()
        body["message"]["parts"] = [{"raw": "iVBORw0KGgo=", "mediaType": "image/png", "filename": "x.png"}]
        return body

    assert_jsonrpc_form(http_calls.post(f"{base}/jsonrpc", json=rpc("SendMessage", image_message()),
                                        headers=caller.headers), "ContentTypeNotSupportedError")
    assert_rest_form(http_calls.post(f"{base}/message:send", json=image_message(), headers=caller.headers),
                     "ContentTypeNotSupportedError")


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_content_type_not_supported_for_a_body_that_is_not_json(edge_alone, caller, content_type):
    """What the TCK sends: a JSON body labelled text/plain. Not an edge-private code: A2A's own error."""
    base = edge_alone.specialist(CONFORMANCE)
    headers = {**caller.headers}
    if content_type is not None:
        headers["Content-Type"] = content_type
    rpc_body = json.dumps(rpc("SendMessage", message())).encode()
    answer = http_calls.post(f"{base}/jsonrpc", content=rpc_body, headers=headers)
    assert answer.status_code == 415  # the guard answers it over JSON-RPC too, in the table's HTTP status
    error = assert_jsonrpc_form(answer, "ContentTypeNotSupportedError")
    assert error["data"][0]["metadata"]["code"] == "content_type_not_supported"
    assert answer.json()["id"] is None  # refused before the body was read as JSON-RPC
    rest_body = json.dumps(message()).encode()
    assert_rest_form(http_calls.post(f"{base}/message:send", content=rest_body, headers=headers),
                     "ContentTypeNotSupportedError")


def test_version_not_supported(edge_alone, caller):
    base = edge_alone.specialist(CONFORMANCE)
    headers = {**caller.headers, "A2A-Version": "99.0"}
    assert_jsonrpc_form(http_calls.post(f"{base}/jsonrpc", json=rpc("SendMessage", message()), headers=headers),
                        "VersionNotSupportedError")
    assert_rest_form(http_calls.post(f"{base}/message:send", json=message(), headers=headers),
                     "VersionNotSupportedError")


def test_a_compressed_body_keeps_the_edge_private_415(edge_alone, caller):
    """Content-Encoding is not a situation of the spec's table: the edge's own code answers it."""
    base = edge_alone.specialist(CONFORMANCE)
    headers = {**caller.headers, "Content-Encoding": "gzip"}
    answer = http_calls.post(f"{base}/message:send", json=message(), headers=headers)
    assert answer.status_code == 415
    assert answer.json()["error"]["details"][0]["reason"] == "UNSUPPORTED_MEDIA_TYPE"
