"""The edge's REQUIRED-field check (app/required.py) answers exactly what the a2a-sdk's check answers.

The SDK's ``validate_proto_required_fields`` is the model: every request type the edge's handler takes, empty and
filled, and hypothesis' requests with fields missing at every depth (a message without its id, role or parts, a
push configuration without its url, an authentication without its scheme, metadata and data parts of any shape)
get the same refusal, with the same errors in the same order, or none from both. Over the wire, a send with
required fields missing is refused as before, on both bindings.
"""

from __future__ import annotations

import pytest
from a2a.types import a2a_pb2
from a2a.utils.errors import InvalidParamsError
from a2a.utils.proto_utils import validate_proto_required_fields
from google.protobuf.struct_pb2 import Struct, Value
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.required import check_required_fields, required_field_errors
from tests import http_calls
from tests.app.conftest import PAID

MODEL = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])
# Every request type the edge's handler checks (app/handler.py's decorated methods).
REQUEST_TYPES = (
    a2a_pb2.SendMessageRequest, a2a_pb2.GetTaskRequest, a2a_pb2.CancelTaskRequest, a2a_pb2.ListTasksRequest,
    a2a_pb2.SubscribeToTaskRequest, a2a_pb2.TaskPushNotificationConfig, a2a_pb2.GetTaskPushNotificationConfigRequest,
    a2a_pb2.ListTaskPushNotificationConfigsRequest, a2a_pb2.DeleteTaskPushNotificationConfigRequest,
)


def errors_of(check, request) -> list | None:
    """A check's answer: its errors, or None when it accepts the request."""
    try:
        check(request)
    except InvalidParamsError as refused:
        assert refused.message == "Validation failed"
        return refused.data["errors"]
    return None


def sdk_errors(request) -> list | None:
    return errors_of(validate_proto_required_fields, request)


def edge_errors(request) -> list | None:
    return errors_of(check_required_fields, request)


@pytest.mark.parametrize("request_type", REQUEST_TYPES, ids=lambda t: t.__name__)
def test_an_empty_request_of_every_type_is_refused_with_the_sdks_errors(request_type):
    assert edge_errors(request_type()) == sdk_errors(request_type())


def test_a_complete_send_passes_both_checks():
    request = a2a_pb2.SendMessageRequest(message=a2a_pb2.Message(
        message_id="m-1", role=a2a_pb2.Role.ROLE_USER, parts=[a2a_pb2.Part(text="hello")]))
    assert sdk_errors(request) is None
    assert required_field_errors(request) == []


_words = st.text(alphabet="ab-", max_size=3)
_values = st.recursive(
    st.builds(lambda n: Value(number_value=n), st.integers(-3, 3)) | st.builds(lambda s: Value(string_value=s), _words),
    lambda inner: st.builds(lambda items: Value(list_value={"values": items}), st.lists(inner, max_size=3))
    | st.builds(lambda fields: Value(struct_value=Struct(fields=fields)), st.dictionaries(_words, inner, max_size=3)),
    max_leaves=6,
)
_structs = st.builds(lambda fields: Struct(fields=fields), st.dictionaries(_words, _values, max_size=3))


@st.composite
def _parts(draw) -> a2a_pb2.Part:
    part = a2a_pb2.Part(filename=draw(_words), media_type=draw(_words))
    content = draw(st.sampled_from(("none", "text", "raw", "url", "data")))
    if content == "text":
        part.text = draw(_words)
    elif content == "raw":
        part.raw = draw(_words).encode()
    elif content == "url":
        part.url = draw(_words)
    elif content == "data":
        part.data.CopyFrom(draw(_values))
    if draw(st.booleans()):
        part.metadata.CopyFrom(draw(_structs))
    return part


@st.composite
def _sends(draw) -> a2a_pb2.SendMessageRequest:
    request = a2a_pb2.SendMessageRequest(tenant=draw(_words))
    if draw(st.booleans()):
        message = request.message
        message.message_id = draw(_words)
        message.role = draw(st.sampled_from((a2a_pb2.Role.ROLE_UNSPECIFIED, a2a_pb2.Role.ROLE_USER)))
        message.parts.extend(draw(st.lists(_parts(), max_size=4)))
        message.task_id = draw(_words)
        if draw(st.booleans()):
            message.metadata.CopyFrom(draw(_structs))
    if draw(st.booleans()):
        configuration = request.configuration
        configuration.accepted_output_modes.extend(draw(st.lists(_words, max_size=2)))
        if draw(st.booleans()):
            push = configuration.task_push_notification_config
            push.url = draw(_words)
            push.id = draw(_words)
            if draw(st.booleans()):
                push.authentication.scheme = draw(_words)
                push.authentication.credentials = draw(_words)
        if draw(st.booleans()):
            configuration.history_length = draw(st.integers(0, 3))
    if draw(st.booleans()):
        request.metadata.CopyFrom(draw(_structs))
    return request


@MODEL
@given(_sends())
def test_any_send_gets_the_sdks_answer(request):
    assert edge_errors(request) == sdk_errors(request)


@MODEL
@given(st.sampled_from(REQUEST_TYPES), st.data())
def test_any_request_with_its_string_fields_set_or_not_gets_the_sdks_answer(request_type, data):
    request = request_type()
    for field in request.DESCRIPTOR.fields:
        if field.type == field.TYPE_STRING and not field.is_repeated and data.draw(st.booleans()):
            setattr(request, field.name, data.draw(_words))
    if hasattr(request, "authentication") and data.draw(st.booleans()):
        request.authentication.scheme = data.draw(_words)
    assert edge_errors(request) == sdk_errors(request)


MISSING = [{"field": "message.message_id", "message": "Field is required."},
           {"field": "message.parts", "message": "Field must contain at least one element."}]


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
def test_a_send_without_a_message_id_or_parts_is_refused_naming_both(edge_alone, make_customer, binding):
    customer = make_customer(credits=100, max_parallel=2)
    message = {"role": "ROLE_USER", "parts": []}
    if binding == "jsonrpc":
        answer = http_calls.post(f"{edge_alone.specialist(PAID)}/jsonrpc", headers=customer.headers, json={
            "jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}})
        assert answer.status_code == 200, answer.text
        error = answer.json()["error"]
        assert (error["code"], error["message"]) == (-32602, "Validation failed"), error
        details = error["data"]
    else:
        answer = http_calls.post(f"{edge_alone.specialist(PAID)}/message:send", headers=customer.headers,
                                 json={"message": message})
        assert answer.status_code == 400, answer.text
        details = answer.json()["error"]["details"]
    [info] = [detail for detail in details if detail["@type"].endswith("ErrorInfo")]
    assert (info["reason"], info["metadata"]["errors"]) == ("INVALID_PARAMS", MISSING), details
