"""What the root model is told: the system prompt (tool or code blocks, namespace, answer protocol) and the first message.

The first message gives the question and the corpus's shape and size (counts,
bytes, top folders and extensions, skips), never its content: the model reads
what it needs through ``context``.
"""

from __future__ import annotations

from typing import Any

PYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": (
            "Run Python code in your persistent namespace. Variables survive between calls. "
            "Only what you print() comes back to you, cut to a bounded size."
        ),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source to run"}},
            "required": ["code"],
        },
    },
}

SYSTEM = """You investigate a corpus to answer a question. {how_code_runs} The corpus is NOT in this conversation: it is data in the namespace.

Names in the namespace:
- `context`: the corpus. `context.files()` paths; `context.size()` bytes (reads nothing); \
`context.stats()` shape; `context.read(path, start=None, size=None)` text; \
`context.search(regex, limit=20)` hits as dicts with path, line, start, end, match, snippet; \
`context.select(*globs)` a narrowed view (same methods); `context.chunk(size=20000, overlap=0)` \
chunks with .path .start .end, .text(), .labelled(); `context.text(max_chars)` a labelled text form.
- `llm_query(prompt, context="")`: ask a sub-model one focused question about text you pass as \
context (a string, a chunk, a search hit - sent as its path, line numbers and surrounding lines - \
or a list of them). Returns a result with .text, .ok, \
.error, .advice, .truncated, .usage; failures come back as results with ok=False, never as exceptions.
- `llm_query_batched(prompts, contexts=None)`: the same for many prompts at once, concurrently; \
results in input order.
- `history.search(query, limit)`, `history.read(id, start, size)`, `history.stats()`: everything \
printed earlier, in full, even when what you were shown was cut.
- `final_answer(value)`: ends the run with `value` (a string, or JSON-like data) as the answer.

How to work: look at the shape first, search and select before reading, read bounded slices, \
chunk big files and ask sub-calls about chunks, keep intermediate results in variables, print \
short summaries. Limits: {limits}.

The answer protocol: when you know the answer, call `final_answer(value)` from code. The run ends \
after that step. {plain_reply} does not end the run, except when you are told to answer now.
{kernel_notes}"""

MONTY_NOTES = """
Your code runs in Monty, a sandboxed Python subset: no network, shell, environment or file writes. \
Available: functions, lambdas, classes without inheritance, comprehensions, f-strings, try/except with \
builtin exceptions, and the modules re, json, math, collections, itertools, functools, datetime, \
bisect, hashlib, csv. Missing: `del`, `yield`, class inheritance (so no custom exception classes), \
method decorators such as @property, `__lt__`/`__eq__` on your classes, `len()` of your own classes, \
`dir()`, `vars()`, `callable()`, `globals()`, and the modules heapq, textwrap, string, statistics, \
difflib, fnmatch, glob, operator."""

HOST_NOTES = """
Your code runs in a separate Python process on the user's machine with the standard library. \
It has time and output limits; it is not a sandbox, so never modify or delete files."""


# The words that differ between the protocols (rlmfamily/protocol.py): a tool call, or a fenced block in text.
WORDS: dict[str, dict[str, str]] = {
    "tools": {
        "how_code_runs": "You have exactly one tool, `python`, which runs code in a persistent namespace.",
        "plain_reply": "Replying in plain text",
        "work_with": "with the python tool",
        "last_step": "in one last python step",
        "no_code": "no tool call (text beside a python call is not taken as the answer)",
    },
    "text": {
        "how_code_runs": (
            "You run Python code by writing it in a fenced code block that opens with ```python and closes "
            "with ```; it runs in a persistent namespace, and what it prints comes back to you in the next "
            "message. Write exactly one such block per reply, then stop and wait for its output: only the "
            "first block of a reply is run."),
        "plain_reply": "A reply without a python block",
        "work_with": "with one ```python block per reply",
        "last_step": "in one last ```python block",
        "no_code": "no code block (text beside a python block is not taken as the answer)",
    },
}


def in_text_words(content: str) -> str:
    """A message written for the tools protocol, in the text protocol's words (an ``auto`` run's fallback)."""
    for key, words in WORDS["tools"].items():
        content = content.replace(words, WORDS["text"][key])
    return content


def system_prompt(kernel: str, limits: dict[str, Any], protocol: str = "tools") -> str:
    rendered = ", ".join(f"{k} {v}" for k, v in limits.items())
    words = WORDS[protocol]
    return SYSTEM.format(limits=rendered, kernel_notes=MONTY_NOTES if kernel == "monty" else HOST_NOTES,
                         how_code_runs=words["how_code_runs"], plain_reply=words["plain_reply"])


def first_message(question: str, stats: dict[str, Any], protocol: str = "tools") -> str:
    lines = [f"Question: {question}", "", f"The corpus ({stats['source']}: {stats['root']}), shape only:"]
    lines.append(f"- {stats['files']:,} files, {stats['bytes']:,} bytes")
    if stats["top_folders"]:
        lines.append("- top folders: " + ", ".join(
            f"{f['folder']} ({f['files']} files, {f['bytes']:,} B)" for f in stats["top_folders"]))
    if stats["extensions"]:
        lines.append("- extensions: " + ", ".join(
            f"{e['ext']} ({e['files']}, {e['bytes']:,} B)" for e in stats["extensions"]))
    if stats["largest_files"]:
        lines.append("- largest files: " + ", ".join(f"{f['path']} ({f['bytes']:,} B)" for f in stats["largest_files"]))
    if stats["skipped"]:
        lines.append("- skipped (not in context): " + ", ".join(f"{n} {reason}" for reason, n in stats["skipped"].items()))
    for note in stats["notes"]:
        lines.append(f"- note: {note}")
    lines += ["", f"Investigate {WORDS[protocol]['work_with']}, then call final_answer(value)."]
    return "\n".join(lines)


def follow_up(question: str, protocol: str = "tools") -> str:
    return f"Follow-up: {question}\n\nContinue {WORDS[protocol]['work_with']}, then call final_answer(value)."


NO_OUTPUT_HINT = "(no output; print() what you want to see)"  # for the model; a person is shown NO_OUTPUT
NO_OUTPUT = "(no output)"

NUDGE = (
    "Use the python tool to continue. To finish, call final_answer(value) in code; "
    "a plain-text reply does not end the run."
)
TEXT_NUDGE = (
    "Write exactly one fenced code block that opens with ```python to continue. To finish, call "
    "final_answer(value) in that code; a reply without a python block does not end the run."
)


def final_request(why: str, protocol: str = "tools") -> str:
    words = WORDS[protocol]
    return (
        f"Stop investigating: {why}. Answer now. Call final_answer(value) {words['last_step']}, "
        f"or reply with the answer as plain text and {words['no_code']}. Say what you could not verify."
    )
