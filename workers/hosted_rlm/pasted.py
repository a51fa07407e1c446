"""Code pasted into a message's text, read as an evidence bundle.

The first thing a foreign agent sends a reviewer is code pasted in text, not
files or evidence items. Such a text-only message is read here:

- a fenced code block (``` or ~~~, CommonMark rules: the closing fence uses the
  same character, at least as many, and nothing else; an unclosed fence runs to
  the end of the text) that names a path becomes a file of the bundle, its
  content exactly the lines between the fences;
- the text outside those blocks is the task. When no block names a path, or a
  block without a path is left in it, that text is also one inline document,
  ``PASTED_DOCUMENT_PATH`` (without named blocks: the whole message, so its line
  1 is the message's first line).

A block names its path in one of the ways agents and chat tools write it
(``NAMING_CONVENTIONS`` lists them for the docs):

- in the info string: ```` ```python path=app/db.py ```` (also ``file=``,
  ``filename=``, ``title=``, quoted or not), ```` ```python:app/db.py ```` (and
  ``12:15:app/db.py``, line range first), or the path alone, ```` ```app/db.py ````;
- on the line right before the fence: ``app/db.py``, ``**app/db.py**``,
  ```` `app/db.py` ````, ``### app/db.py``, ``File: app/db.py``, ``# file: app/db.py``;
- on the block's first line, as a comment: ``# file: app/db.py``,
  ``// file: app/db.py``, ``-- file: app/db.py``, ``/* file: app/db.py */``,
  ``<!-- file: app/db.py -->``; that line is not part of the file.

A path names a file inside the bundle: relative, ``/``-separated, no ``.`` or
``..`` segment, no control characters, at most ``MAX_PATH_CHARS``. Anything
else, a path named twice, or more files than the spec allows parts
(``max_parts``) is refused with a stable code and what to change. Work is
linear in the text, which admission already bounded (``max_input_bytes``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from core.errors import ServiceError

MAX_PATH_CHARS = 1024
PASTED_DOCUMENT_PATH = "message.md"
NAMING_CONVENTIONS = (
    "```python path=app/db.py",
    "```python:app/db.py",
    "```app/db.py",
    "a line right before the fence: app/db.py, **app/db.py**, `app/db.py`, ### app/db.py, File: app/db.py",
    "the block's first line: # file: app/db.py (also //, --, /* */, <!-- -->)",
)

# Every pattern below is anchored and has no nested repetition: matching a line is linear in its length.
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
INFO_ATTRIBUTE = re.compile(r"""(?:^|\s)(?:path|file|filename|title)=(?:"([^"]*)"|'([^']*)'|(\S+))""")
LABEL_LINE = re.compile(
    r"^\s*(?:#{1,6}\s+)?(?:(?:file|path|filename)\s*:\s*)?(\*\*|`)?([^\s*`]+)(?:\*\*|`)?:?\s*$", re.IGNORECASE
)
COMMENT_LINE = re.compile(r"^\s*(?:#|//|--|;|/\*|<!--)\s*(?:file|path|filename)\s*:(.*)$", re.IGNORECASE)
COMMENT_ENDS = ("*/", "-->")
# What makes a bare word a path rather than a language name: a "/" or a file extension.
PATH_SHAPED = re.compile(r"^[^\s]*(?:/[^\s]*|\.[A-Za-z0-9_-]{1,16})$")
WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")


class PastedRefused(ServiceError):
    code = "task_refused"


@dataclass(frozen=True)
class Pasted:
    """A text-only message read as a bundle: the task, and evidence items ``{path, start, end, text}``."""

    question: str
    items: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class _Block:
    first: int  # index of the opening fence line
    last: int  # index of the closing fence line (== len(lines) when unclosed)
    path: str | None
    content: str


def read_pasted(text: str, *, max_files: int, max_bytes: int) -> Pasted:
    """Read a text-only message. Raises ``PastedRefused``."""
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise PastedRefused(f"the message's text is {size:,} bytes; this specialist reads at most {max_bytes:,} "
                            "(max_input_bytes)", code="evidence_too_large")
    lines = text.split("\n")
    blocks = _blocks(lines, max_files)
    named = [b for b in blocks if b.path is not None]
    seen: set[str] = set()
    for block in named:
        assert block.path is not None
        if block.path in seen:
            raise PastedRefused(f"the path {block.path!r} names two code blocks; send each file once",
                                code="evidence_path_duplicate")
        seen.add(block.path)
    items = [{"path": b.path, "start": 0, "end": len(b.content), "text": b.content} for b in named]
    rest = _without(lines, named)
    question = rest.strip()
    if not question:
        raise PastedRefused("the message's text holds only code blocks; say outside them what to review against "
                            "(the rule or the question)", code="task_missing")
    if len(named) < len(blocks) or not named:  # code without a path, or no block at all: the text is evidence too
        items.append({"path": PASTED_DOCUMENT_PATH, "start": 0, "end": len(rest), "text": rest})
    return Pasted(question=question, items=tuple(items))


def _blocks(lines: list[str], max_files: int) -> list[_Block]:
    blocks: list[_Block] = []
    named = 0
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None or (opening.group(1)[0] == "`" and "`" in opening.group(2)):
            index += 1  # not a fence (a backtick fence's info string may not hold a backtick)
            continue
        marker, info = opening.group(1), opening.group(2).strip()
        close = _closing(lines, index + 1, marker)
        body = lines[index + 1:close]
        if close == len(lines) and body and body[-1] == "":
            body = body[:-1]  # an unclosed block ends with the text; a final newline is not an empty line
        path, body = _path_of(info, lines[index - 1] if index > 0 else "", body)
        if path is not None:
            named += 1
            if named > max_files:
                raise PastedRefused(
                    f"the message's text holds more than {max_files} named code blocks; this specialist reads at "
                    f"most {max_files} files (max_parts). Send fewer files, or the rest in another task",
                    code="evidence_too_many_files")
        blocks.append(_Block(first=index, last=close, path=path, content="\n".join(body) + ("\n" if body else "")))
        index = close + 1
    return blocks


def _closing(lines: list[str], start: int, marker: str) -> int:
    for index in range(start, len(lines)):
        candidate = lines[index].strip()
        if len(lines[index]) - len(lines[index].lstrip(" ")) <= 3 and candidate \
                and set(candidate) == {marker[0]} and len(candidate) >= len(marker):
            return index
    return len(lines)  # unclosed: the block runs to the end of the text (CommonMark)


def _path_of(info: str, line_before: str, body: list[str]) -> tuple[str | None, list[str]]:
    """The path a block names, and its content (without a first-line comment that named it)."""
    raw = _path_in_info(info)
    if raw is None and body:
        raw = _path_in_comment(body[0])
        if raw is not None:
            body = body[1:]
    if raw is None:
        label = LABEL_LINE.match(line_before)
        if label is not None and PATH_SHAPED.match(label.group(2)):
            raw = label.group(2)
    return (None, body) if raw is None else (checked_path(raw), body)


def _path_in_comment(line: str) -> str | None:
    """``# file: app/db.py`` and its kin; the comment's closing (``*/``, ``-->``) is not part of the path."""
    comment = COMMENT_LINE.match(line)
    if comment is None:
        return None
    rest = comment.group(1).strip()
    for end in COMMENT_ENDS:
        rest = rest.removesuffix(end).rstrip()
    return rest if rest and len(rest.split()) == 1 else None


def _path_in_info(info: str) -> str | None:
    attribute = INFO_ATTRIBUTE.search(info)
    if attribute is not None:
        return next(g for g in attribute.groups() if g is not None)
    words = info.split()
    if len(words) != 1:
        return None
    word = words[0]
    if ":" in word and not WINDOWS_DRIVE.match(word):  # python:app/db.py, 12:15:app/db.py; a drive is refused
        word = word.rsplit(":", 1)[1]
    return word if PATH_SHAPED.match(word) else None


def checked_path(raw: str) -> str:
    """``raw`` as a bundle path, or ``PastedRefused`` saying what a path must look like."""
    advice = "name files by a relative path inside the project, such as app/db.py"
    if not raw or len(raw) > MAX_PATH_CHARS:
        raise PastedRefused(f"a code block's path is empty or longer than {MAX_PATH_CHARS} characters; {advice}",
                            code="evidence_path_invalid")
    shown = raw[:80] + ("..." if len(raw) > 80 else "")
    if any(not c.isprintable() or c.isspace() for c in raw):
        raise PastedRefused(f"the path {shown!r} holds a control or space character; {advice}",
                            code="evidence_path_invalid")
    if raw.startswith(("/", "\\", "~")) or WINDOWS_DRIVE.match(raw):
        raise PastedRefused(f"the path {shown!r} is absolute; {advice}", code="evidence_path_invalid")
    segments = raw.replace("\\", "/").split("/")
    if any(s in ("", ".", "..") for s in segments):
        raise PastedRefused(f"the path {shown!r} has an empty, '.' or '..' segment; {advice}",
                            code="evidence_path_invalid")
    return "/".join(segments)


def _without(lines: list[str], blocks: list[_Block]) -> str:
    """The text with ``blocks`` (fences, and the label line a path was read from, kept) removed."""
    dropped: set[int] = set()
    for block in blocks:
        dropped.update(range(block.first, min(block.last, len(lines) - 1) + 1))
    return "\n".join(line for index, line in enumerate(lines) if index not in dropped)
