"""How the root model's code reaches the kernel and its output the model (``RLM_PROTOCOL``).

``tools`` (the default): the model calls the function tool ``python``; each
observation goes back as that call's tool result.

``text``: for models and servers without tool calling (a local llama.cpp,
Ollama or vLLM server started without a tool parser). No tools are sent; the
system prompt asks for exactly one fenced ```python block per reply. The
harness runs the **first** python block of a reply and says so when there were
more: a model that writes several blocks in one reply has not seen the first
one's output, so what the later blocks assume is a guess. The observation goes
back as a user message. A reply without a python block gets a reminder.

``auto``: ``tools``, until the first root call is refused with an error that a
server gives for tool calling it does not offer (``TOOL_REFUSALS``); the run then
goes on in ``text`` and its trajectory records why (``protocol_fallback``). Any
other error stays an error: a guess would hide a real fault.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from rlmfamily.errors import ProviderError
from rlmfamily.prompts import NUDGE, PYTHON_TOOL, TEXT_NUDGE
from rlmfamily.providers.base import Completion, ToolCall
from rlmfamily.settings import ProtocolName

PYTHON_FENCE_LANGUAGES = frozenset({"python", "py", "python3"})  # the info string that marks a block to run
OPENING_FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*)$")  # CommonMark's fenced code

# What servers answer when a request has tools they cannot use, as each says it (checked against their
# issue trackers): Ollama 400 "<model> does not support tools"; vLLM without --enable-auto-tool-choice 400
# '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'; llama.cpp's
# llama-server without --jinja 500 "tools param requires --jinja flag"; and the generic wording.
TOOL_REFUSALS = re.compile(
    r"does not support tools|tool choice requires --enable-auto-tool-choice|tools param requires --jinja"
    r"|\btools? (?:are |is )?not supported",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Protocol:
    """One way of carrying code and observations; ``after_completion`` in rlmfamily/session.py plays it."""

    name: Literal["tools", "text"]
    tools: list[dict[str, Any]] | None  # sent with every root call
    nudge: str  # the reminder after a reply with no code
    may_fall_back: bool = False  # auto: a tool refusal on the first call switches to text

    def calls(self, completion: Completion) -> tuple[ToolCall, ...]:
        """The code a reply asks to run, in order."""
        if self.name == "tools":
            return completion.tool_calls
        blocks = python_blocks(completion.text)
        return (ToolCall(id="block_1", name="python", code=blocks[0]),) if blocks else ()

    def assistant_message(self, completion: Completion, calls: tuple[ToolCall, ...]) -> dict[str, Any]:
        if self.name == "text":
            return {"role": "assistant", "content": completion.text}
        message: dict[str, Any] = {"role": "assistant", "content": completion.text or None}
        if calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments if c.arguments is not None
                                                                      else {"code": c.code})}}
                for c in calls
            ]
        return message

    def result_messages(self, completion: Completion, calls: tuple[ToolCall, ...],
                        observations: list[str]) -> list[dict[str, Any]]:
        """The messages that carry each call's observation back to the model."""
        if self.name == "tools":
            return [{"role": "tool", "tool_call_id": c.id, "content": o} for c, o in zip(calls, observations)]
        content = "Output of your python block:\n" + "\n".join(observations)
        not_run = len(python_blocks(completion.text)) - len(calls)
        if not_run > 0:
            content += (f"\n[only the first python block of your reply was run; the other {not_run} were not. "
                        "Write one block per reply, then read its output]")
        return [{"role": "user", "content": content}]


TOOLS = Protocol(name="tools", tools=[PYTHON_TOOL], nudge=NUDGE)
TEXT = Protocol(name="text", tools=None, nudge=TEXT_NUDGE)
AUTO = Protocol(name="tools", tools=[PYTHON_TOOL], nudge=NUDGE, may_fall_back=True)


def protocol_named(name: ProtocolName) -> Protocol:
    return {"tools": TOOLS, "text": TEXT, "auto": AUTO}[name]


def refused_tools(protocol: Protocol, error: ProviderError) -> bool:
    """Whether ``error`` is a server saying it cannot take the tools an ``auto`` run sent (nothing was billed)."""
    return protocol.may_fall_back and error.billed is False and bool(TOOL_REFUSALS.search(error.message))


def python_blocks(text: str) -> list[str]:
    """The code of each fenced python block of ``text``, in order, read as CommonMark reads fences.

    A fence is 3 or more backticks or tildes, indented at most 3 spaces; the block's lines lose as much
    indentation as its opening fence had (a block inside a list item), and a block left open runs to the end
    of the text. Blocks of other languages, or of none, are not run: a model shows output or examples in them.
    """
    blocks: list[str] = []
    opening: re.Match[str] | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if opening is None:
            opening = OPENING_FENCE.match(line)
            lines = []
        elif _closes(opening, line):
            if _language(opening) in PYTHON_FENCE_LANGUAGES:
                blocks.append("\n".join(lines))
            opening = None
        else:
            indent = opening.start("fence")
            lines.append(line[min(indent, len(line) - len(line.lstrip(" "))):])
    if opening is not None and _language(opening) in PYTHON_FENCE_LANGUAGES:
        blocks.append("\n".join(lines))
    return blocks


def _language(opening: re.Match[str]) -> str:
    words = opening["info"].split()
    return words[0].lower() if words else ""


def _closes(opening: re.Match[str], line: str) -> bool:
    """A closing fence: the opening's character, at least as many, indented at most 3 spaces, nothing after."""
    fence = opening["fence"]
    closing = re.match(r"^ {0,3}(" + re.escape(fence[0]) + r"{3,})[ \t]*$", line)
    return closing is not None and len(closing[1]) >= len(fence)
