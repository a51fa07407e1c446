"""A strict checker of A2A 1.0 JSON documents (an Agent Card, a Task, ...) against the protocol's own schema.

The schema is not copied here: it is derived from the a2a-sdk's compiled ``a2a.proto``
descriptors (``a2a.types.a2a_pb2``), which are the A2A 1.0 specification's normative
definition (its JSON form is ProtoJSON). A document passes only if, recursively:

- every key is the ``json_name`` of a field of its message (no 0.3 leftovers such as
  ``url``, ``preferredTransport``, ``protocolVersion`` at the card's top level);
- every field the proto marks ``(google.api.field_behavior) = REQUIRED`` is present
  (ProtoJSON omits empty values, so an empty required list or string is missing too);
- at most one member of a ``oneof`` is present;
- each value has its field's JSON type: strings, booleans, integers (int64 may be a
  decimal string), numbers, enums by their names, maps as objects, repeated fields as
  arrays; ``Struct``/``Value`` hold any JSON, ``Timestamp`` is a string.

``problems(document, Message)`` lists what is wrong, each with its JSON path; an empty
list means the document is valid. The A2A TCK's CARD-STRUCT checks apply the same
strictness to the card, through the JSON Schema generated from the same proto.
"""

from __future__ import annotations

from typing import Any

from google.api import field_behavior_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor

_INT32 = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_FIXED32,
    FieldDescriptor.TYPE_SFIXED32,
}
_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}
_FLOATS = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}
_FLOAT_WORDS = {"NaN", "Infinity", "-Infinity"}
_ANY_JSON = {"google.protobuf.Struct", "google.protobuf.Value"}


def problems(document: Any, message: Any) -> list[str]:
    """What makes ``document`` not a valid ProtoJSON form of ``message`` (a generated class); [] if nothing."""
    found: list[str] = []
    _check_message(document, message.DESCRIPTOR, "$", found)
    return found


def is_required(field: FieldDescriptor) -> bool:
    behaviors = field.GetOptions().Extensions[field_behavior_pb2.field_behavior]
    return field_behavior_pb2.REQUIRED in behaviors


def _check_message(value: Any, descriptor: Descriptor, path: str, found: list[str]) -> None:
    full_name = descriptor.full_name
    if full_name in _ANY_JSON:
        return
    if full_name == "google.protobuf.ListValue":
        if not isinstance(value, list):
            found.append(f"{path}: expected an array ({full_name}), got {type(value).__name__}")
        return
    if full_name in ("google.protobuf.Timestamp", "google.protobuf.Duration", "google.protobuf.FieldMask"):
        if not isinstance(value, str):
            found.append(f"{path}: expected a string ({full_name}), got {type(value).__name__}")
        return
    if not isinstance(value, dict):
        found.append(f"{path}: expected an object ({full_name}), got {type(value).__name__}")
        return
    if full_name == "google.protobuf.Any":
        if not isinstance(value.get("@type"), str):
            found.append(f"{path}: an Any needs its '@type'")
        return
    fields = {field.json_name: field for field in descriptor.fields}
    for key in value:
        if key not in fields:
            found.append(f"{path}: '{key}' is not a field of {full_name} (known: {', '.join(sorted(fields))})")
    for name, field in fields.items():
        if is_required(field) and name not in value:
            found.append(f"{path}: required field '{name}' of {full_name} is missing")
    for oneof in descriptor.oneofs:
        members = [f.json_name for f in oneof.fields if f.json_name in value]
        if len(members) > 1 and not _is_synthetic(oneof):
            found.append(f"{path}: only one of {members} may be set (oneof {oneof.name})")
    for key, item in value.items():
        if key in fields:
            _check_field(item, fields[key], f"{path}.{key}", found)


def _is_synthetic(oneof: Any) -> bool:
    """The oneof protobuf makes for one ``optional`` field (a single member): nothing to exclude."""
    return len(oneof.fields) == 1 and oneof.name == f"_{oneof.fields[0].name}"


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _check_field(value: Any, field: FieldDescriptor, path: str, found: list[str]) -> None:
    if _is_map(field):
        if not isinstance(value, dict):
            found.append(f"{path}: expected an object (map), got {type(value).__name__}")
            return
        value_field = field.message_type.fields_by_name["value"]
        for key, item in value.items():
            _check_single(item, value_field, f"{path}.{key}", found)
        return
    if field.is_repeated:
        if not isinstance(value, list):
            found.append(f"{path}: expected an array, got {type(value).__name__}")
            return
        for index, item in enumerate(value):
            _check_single(item, field, f"{path}[{index}]", found)
        return
    _check_single(value, field, path, found)


def _check_single(value: Any, field: FieldDescriptor, path: str, found: list[str]) -> None:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        _check_message(value, field.message_type, path, found)
    elif kind == FieldDescriptor.TYPE_ENUM:
        names = {v.name for v in field.enum_type.values}
        if value not in names:
            found.append(f"{path}: {value!r} is not a name of {field.enum_type.full_name}")
    elif kind in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        if not isinstance(value, str):
            found.append(f"{path}: expected a string, got {type(value).__name__}")
    elif kind == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            found.append(f"{path}: expected a boolean, got {type(value).__name__}")
    elif kind in _INT32:
        if isinstance(value, bool) or not isinstance(value, int):
            found.append(f"{path}: expected an integer, got {value!r}")
    elif kind in _INT64:
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.lstrip("-").isdigit())):
            found.append(f"{path}: expected an integer (or its decimal string), got {value!r}")
    elif kind in _FLOATS:
        if isinstance(value, bool) or not (isinstance(value, (int, float)) or value in _FLOAT_WORDS):
            found.append(f"{path}: expected a number, got {value!r}")
    else:  # a type this checker does not know is a gap in the checker, not a pass
        found.append(f"{path}: field type {kind} is not checked by tests/app/a2a_schema.py")
