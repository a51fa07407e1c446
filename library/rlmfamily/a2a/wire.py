"""The A2A 1.0 wire format for delegation: requests built and answers parsed with the a2a-sdk's own types.

Messages are the SDK's protobuf types serialised with ``json_format`` (the
ProtoJSON that A2A 1.0 JSON-RPC carries), so field names and enum spellings
are exactly the SDK's. An answer is reduced to a ``RemoteView``: the task's
state in our vocabulary, ids, the status message, and the result rendered as
text. File parts stay references (``url``) and are never fetched.
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

from rlmfamily.a2a.errors import PeerProtocolError

MAX_PARSE_ERROR_CHARS = 300  # of the parser's complaint quoted in a PeerProtocolError
CREDIT_CEILING_KEY = "credit_ceiling"  # the key the hosted service checks before reserving (app/admission.py)

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
        return task_view(response.task)
    if kind == "message":
        return message_view(response.message)
    raise PeerProtocolError("SendMessage result has neither a task nor a message")


def parse_task(result: Any) -> RemoteView:
    if not isinstance(result, dict):
        raise PeerProtocolError(f"the result must be a Task object, got {type(result).__name__}")
    return task_view(_parse(result, Task(), "Task"))


def _parse(data: dict[str, Any], message: Any, what: str) -> Any:
    try:
        # Unknown fields are ignored (a newer peer may add some); wrong types are not.
        return ParseDict(data, message, ignore_unknown_fields=True)
    except (ParseError, ValueError, TypeError) as exc:
        raise PeerProtocolError(f"the peer's {what} is not valid A2A 1.0: {str(exc)[:MAX_PARSE_ERROR_CHARS]}") from None


def task_view(task: Task) -> RemoteView:
    if not task.id:
        raise PeerProtocolError("the peer returned a task without an id")
    state = STATES.get(task.status.state)
    if state is None:
        raise PeerProtocolError(f"the peer returned a task in an unknown state ({task.status.state})")
    references: list[dict[str, Any]] = []
    status_text = render_parts(task.status.message.parts, references) if task.status.HasField("message") else ""
    blocks = []
    for artifact in task.artifacts:
        text = render_parts(artifact.parts, references)
        if len(task.artifacts) > 1 and artifact.name:
            text = f"=== {artifact.name} ===\n{text}"
        blocks.append(text)
    result_text = "\n\n".join(b for b in blocks if b)
    if not result_text and state in TERMINAL:
        result_text = status_text  # some peers answer in the final status message only
    return RemoteView(state=state, task_id=task.id, context_id=task.context_id or None, status_text=status_text,
                      result_text=result_text, references=references,
                      message_ids=tuple(m.message_id for m in task.history if m.message_id))


def message_view(message: Message) -> RemoteView:
    references: list[dict[str, Any]] = []
    text = render_parts(message.parts, references)
    return RemoteView(state="completed", task_id=None, context_id=message.context_id or None, status_text="",
                      result_text=text, references=references, direct_reply=True)


def render_parts(parts: Any, references: list[dict[str, Any]]) -> str:
    out = []
    for part in parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            out.append(part.text)
        elif kind == "data":
            out.append(json.dumps(MessageToDict(part.data), ensure_ascii=False, indent=2))
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
