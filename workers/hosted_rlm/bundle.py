"""The customer's A2A message as the specialist's task and evidence bundle.

- text parts, joined, are the task (the rule to review against, or the question);
- data parts hold evidence items ``{path, start, end, text}``: one item, a list of
  them, or ``{"items": [...]}`` (the ``rlm run --bundle`` form);
- inline file parts (``raw`` bytes) are whole files: ``{path: filename, start: 0,
  end: len(text), text}``; they must be UTF-8 text;
- a message of text parts only is pasted code (``pasted``): fenced blocks that
  name a path are files, and the text is the task (and, without named blocks,
  one inline document).

Sizes and media types were checked at admission against the spec. What is left to
refuse here is what only the content shows: no task, a file that is
not text, an item whose offsets do not match its text, a file URL (references are
never fetched). A refusal is ``TaskRefused`` with a stable code and a message for
the customer; the job ends ``rejected`` and charges nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.json_format import MessageToDict

from core.errors import ServiceError
from core.specs import LimitsSpec
from workers.hosted_rlm.pasted import PastedRefused, read_pasted

MAX_PATH_CHARS = 1024


class TaskRefused(ServiceError):
    code = "task_refused"


@dataclass(frozen=True)
class SpecialistTask:
    question: str
    items: tuple[dict[str, Any], ...]

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(item["path"] for item in self.items)


def _item(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or set(raw) != {"path", "start", "end", "text"}:
        raise TaskRefused(
            f"{where} is not an evidence item: use {{path, start, end, text}} (character offsets into the file)",
            code="evidence_invalid",
        )
    path, text = raw["path"], raw["text"]
    if not isinstance(path, str) or not path.strip() or len(path) > MAX_PATH_CHARS or not isinstance(text, str):
        raise TaskRefused(f"{where}: path must be a non-empty string of at most {MAX_PATH_CHARS} characters and "
                          "text a string", code="evidence_invalid")
    try:
        start, end = int(raw["start"]), int(raw["end"])
    except (TypeError, ValueError):
        raise TaskRefused(f"{where}: start and end must be integers", code="evidence_invalid") from None
    if start != raw["start"] or end != raw["end"] or start < 0 or end - start != len(text):
        raise TaskRefused(
            f"{where} ({path}): end - start must equal the length of text in characters "
            f"(got start={raw['start']}, end={raw['end']}, {len(text)} characters)",
            code="evidence_invalid",
        )
    return {"path": path, "start": start, "end": end, "text": text}


def _items_of(value: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(value, dict) and set(value) == {"items"}:
        value = value["items"]
    if isinstance(value, list):
        return [_item(entry, f"{where} item {index}") for index, entry in enumerate(value)]
    return [_item(value, where)]


def task_from_message(message: Any, limits: LimitsSpec) -> SpecialistTask:
    """Read an a2a-sdk ``Message`` (protobuf) within the spec's ``limits``. Raises ``TaskRefused``."""
    texts: list[str] = []
    pasted: list[str] = []  # the text parts as sent: line numbers of pasted code count from their first line
    items: list[dict[str, Any]] = []
    for index, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        where = f"part {index}"
        if kind == "text":
            if part.text.strip():
                texts.append(part.text.strip())
                pasted.append(part.text)
        elif kind == "data":
            items.extend(_items_of(MessageToDict(part.data), where))
        elif kind == "raw":
            name = part.filename or f"file-{index}"
            if b"\0" in part.raw:
                raise TaskRefused(f"{where} ({name}) is binary; send text files only", code="evidence_not_text")
            try:
                text = part.raw.decode("utf-8")
            except UnicodeDecodeError:
                raise TaskRefused(f"{where} ({name}) is not UTF-8 text", code="evidence_not_text") from None
            items.append(_item({"path": name, "start": 0, "end": len(text), "text": text}, where))
        elif kind == "url":
            raise TaskRefused(
                f"{where} is a file URL; references are never fetched: send the file inline or as evidence items",
                code="evidence_url_refused",
            )
    if not texts:
        raise TaskRefused(
            "the message has no text part saying what to do (the rule to review against, or the question)",
            code="task_missing",
        )
    if not items:
        return _pasted("\n\n".join(pasted), limits)
    return SpecialistTask(question="\n\n".join(texts), items=tuple(items))


def _pasted(text: str, limits: LimitsSpec) -> SpecialistTask:
    """A text-only message: code pasted in text is the evidence (``workers.hosted_rlm.pasted``)."""
    try:
        pasted = read_pasted(text, max_files=limits.max_parts, max_bytes=limits.max_input_bytes)
    except PastedRefused as refused:
        raise TaskRefused(refused.message, code=refused.code) from None
    return SpecialistTask(question=pasted.question, items=pasted.items)
