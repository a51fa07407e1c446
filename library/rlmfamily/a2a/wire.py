"""The A2A 1.0 wire format for delegation: requests built and answers parsed with the a2a-sdk's own types.

Messages are the SDK's protobuf types serialised with ``json_format`` (the
ProtoJSON that A2A 1.0 JSON-RPC carries), so field names and enum spellings
are exactly the SDK's. An answer is reduced to a ``RemoteView``: the task's
state in our vocabulary, ids, the status message, the result rendered as
text, and the charge the peer reports (``CHARGE_METADATA_KEY``; what it means
for the hold is ``rlmfamily.a2a.charge``). File parts stay references
(``url``) and are never fetched.

Whole numbers: data parts and metadata travel in protobuf ``Struct``, whose
only number is a double, so parsing turns a peer's ``"line": 8`` into
``8.0``. A data part is therefore rendered from the JSON the peer sent (the
answer as read, beside its parsed form): ``8`` stays ``8`` and ``8.0`` stays
``8.0``. Without that JSON, a whole double within +-2**53 is read back as an
integer (``whole_numbers``, the rule the hosted service's edge prints with).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from a2a.types.a2a_pb2 import (
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SendMessageResponse,
    Task,
    TaskState,
)
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from google.protobuf.struct_pb2 import Value

from rlmfamily.a2a.charge import CHARGE_METADATA_KEY
from rlmfamily.a2a.errors import PeerProtocolError

MAX_PARSE_ERROR_CHARS = 300  # of the parser's complaint quoted in a PeerProtocolError
CREDIT_CEILING_KEY = "credit_ceiling"  # the key the hosted service checks before reserving (app/admission.py)
MAX_EXACT_INTEGER = 2**53  # doubles hold every integer up to here exactly; past it, a whole double may be a rounding

STATES = {
    TaskState.TASK_STATE_SUBMITTED: "submitted",
    TaskState.TASK_STATE_WORKING: "working",
    TaskState.TASK_STATE_COMPLETED: "completed",
    TaskState.TASK_STATE_FAILED: "failed",
    TaskState.TASK_STATE_CANCELED: "canceled",
    TaskState.TASK_STATE_INPUT_REQUIRED: "input_required",
    TaskState.TASK_STATE_REJECTED: "rejected",
    TaskState.TASK_STATE_AUTH_REQUIRED: "auth_required",
}
TERMINAL = {"completed", "failed", "canceled", "rejected"}
INTERRUPTED = {"input_required", "auth_required"}


@dataclass(frozen=True)
class RemoteView:
    """What one answer says about the remote work."""

    state: str
    task_id: str | None  # None for a direct Message reply: no task id is invented
    context_id: str | None
    status_text: str  # the status message (the peer's question when it asks for input)
    result_text: str  # artifacts (or a direct reply's parts) rendered as text
    references: list[dict[str, Any]] = field(default_factory=list)  # file parts: url, media type, name; not fetched
    direct_reply: bool = False
    message_ids: tuple[str, ...] = ()  # ids of the messages in the task's history (for reconciliation)
    charge_reported: Any = None  # the value at CHARGE_METADATA_KEY as sent (None: nothing there); not yet checked


def whole_numbers(value: Any) -> Any:
    """``8.0`` -> ``8`` in a JSON-like value, recursively; ``2.5``, ``2.0**60``, bools and text unchanged."""
    if type(value) is float and value.is_integer() and abs(value) <= MAX_EXACT_INTEGER:
        return int(value)
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    return value


def charge_reported(metadata: Any) -> Any:
    """The value a task's (or message's) metadata holds at ``CHARGE_METADATA_KEY``, or None."""
    value: Any = whole_numbers(MessageToDict(metadata))
    for key in CHARGE_METADATA_KEY:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def user_message(text_parts: list[str], *, message_id: str, evidence_items: list[dict[str, Any]] | None = None,
                 context_id: str | None = None,
                 task_id: str | None = None, reference_task_ids: list[str] | None = None,
                 credit_ceiling: int | None = None) -> Message:
    message = Message(message_id=message_id, role=Role.ROLE_USER,
                      parts=[Part(text=t, media_type="text/plain") for t in text_parts if t])
    if evidence_items:
        message.parts.append(Part(data=ParseDict({"items": evidence_items}, Value()), media_type="application/json"))
    if context_id:
        message.context_id = context_id
    if task_id:
        message.task_id = task_id
    if reference_task_ids:
        message.reference_task_ids.extend(reference_task_ids)
    if credit_ceiling is not None:
        message.metadata.update({CREDIT_CEILING_KEY: credit_ceiling})
    return message


def send_params(message: Message) -> dict[str, Any]:
    """``SendMessage`` params: return as soon as the peer has a task; progress is read with GetTask."""
    request = SendMessageRequest(message=message, configuration=SendMessageConfiguration(return_immediately=True))
    params = MessageToDict(request)
    metadata = params.get("message", {}).get("metadata")
    if metadata and CREDIT_CEILING_KEY in metadata:
        # Struct numbers are doubles; the ceiling is a whole number of credits on the wire.
        metadata[CREDIT_CEILING_KEY] = int(metadata[CREDIT_CEILING_KEY])
    return params


def parse_send_result(result: Any) -> RemoteView:
    if not isinstance(result, dict):
        raise PeerProtocolError(f"SendMessage result must be an object, got {type(result).__name__}")
    response = _parse(result, SendMessageResponse(), "SendMessage result")
    kind = response.WhichOneof("payload")
    if kind == "task":
        return task_view(response.task, raw=result.get("task"))
    if kind == "message":
        return message_view(response.message, raw=result.get("message"))
    raise PeerProtocolError("SendMessage result has neither a task nor a message")


def parse_task(result: Any) -> RemoteView:
    if not isinstance(result, dict):
        raise PeerProtocolError(f"the result must be a Task object, got {type(result).__name__}")
    return task_view(_parse(result, Task(), "Task"), raw=result)


def _parse(data: dict[str, Any], message: Any, what: str) -> Any:
    try:
        # Unknown fields are ignored (a newer peer may add some); wrong types are not.
        return ParseDict(data, message, ignore_unknown_fields=True)
    except (ParseError, ValueError, TypeError) as exc:
        raise PeerProtocolError(f"the peer's {what} is not valid A2A 1.0: {str(exc)[:MAX_PARSE_ERROR_CHARS]}") from None


def task_view(task: Task, *, raw: Any = None) -> RemoteView:
    """The task as a ``RemoteView``; ``raw`` is the JSON it was parsed from (its data parts are rendered from it)."""
    if not task.id:
        raise PeerProtocolError("the peer returned a task without an id")
    state = STATES.get(task.status.state)
    if state is None:
        raise PeerProtocolError(f"the peer returned a task in an unknown state ({task.status.state})")
    references: list[dict[str, Any]] = []
    status_text = (render_parts(task.status.message.parts, references,
                                _raw_parts(_raw_field(_raw_field(raw, "status"), "message")))
                   if task.status.HasField("message") else "")
    raw_artifacts = _raw_field(raw, "artifacts")
    blocks = []
    for index, artifact in enumerate(task.artifacts):
        raw_artifact = raw_artifacts[index] if isinstance(raw_artifacts, list) and index < len(raw_artifacts) else None
        text = render_parts(artifact.parts, references, _raw_parts(raw_artifact))
        if len(task.artifacts) > 1 and artifact.name:
            text = f"=== {artifact.name} ===\n{text}"
        blocks.append(text)
    result_text = "\n\n".join(b for b in blocks if b)
    if not result_text and state in TERMINAL:
        result_text = status_text  # some peers answer in the final status message only
    return RemoteView(state=state, task_id=task.id, context_id=task.context_id or None, status_text=status_text,
                      result_text=result_text, references=references,
                      message_ids=tuple(m.message_id for m in task.history if m.message_id),
                      charge_reported=charge_reported(task.metadata))


def message_view(message: Message, *, raw: Any = None) -> RemoteView:
    references: list[dict[str, Any]] = []
    text = render_parts(message.parts, references, _raw_parts(raw))
    return RemoteView(state="completed", task_id=None, context_id=message.context_id or None, status_text="",
                      result_text=text, references=references, direct_reply=True,
                      charge_reported=charge_reported(message.metadata))


def _raw_field(raw: Any, name: str) -> Any:
    return raw.get(name) if isinstance(raw, dict) else None


def _raw_parts(raw: Any) -> list[Any] | None:
    """The ``parts`` of a raw message or artifact, when they are a list (ProtoJSON keeps the parsed order)."""
    parts = _raw_field(raw, "parts")
    return parts if isinstance(parts, list) else None


def render_parts(parts: Any, references: list[dict[str, Any]], raw_parts: list[Any] | None = None) -> str:
    """The parts as text; ``raw_parts``, when given, are the same parts as the peer's JSON (for data parts)."""
    if raw_parts is not None and len(raw_parts) != len(parts):
        raw_parts = None  # not the JSON these parts came from: fall back to the parsed values
    out = []
    for index, part in enumerate(parts):
        kind = part.WhichOneof("content")
        if kind == "text":
            out.append(part.text)
        elif kind == "data":
            raw_part = raw_parts[index] if raw_parts is not None else None
            if isinstance(raw_part, dict) and "data" in raw_part:
                data = raw_part["data"]  # what the peer sent: its integers stay integers, its 8.0 stays 8.0
            else:
                data = whole_numbers(MessageToDict(part.data))
            out.append(json.dumps(data, ensure_ascii=False, indent=2))
        elif kind == "url":
            # A reference, never fetched: fetching would let a peer point the host at anything.
            ref = {"url": part.url, "media_type": part.media_type or None, "filename": part.filename or None}
            references.append(ref)
            out.append(f"[file reference, not fetched: {part.url}"
                       + (f" ({part.media_type})" if part.media_type else "") + "]")
        elif kind == "raw":
            out.append(f"[{len(part.raw):,} bytes of {part.media_type or 'binary data'}"
                       + (f" ({part.filename})" if part.filename else "") + "; not shown]")
    return "\n".join(out)
