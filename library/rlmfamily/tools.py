"""Custom tools: host functions a caller gives a run, shown to the model by name, signature and docstring.

    from rlmfamily import Session, tool

    @tool(timeout_s=10, max_result_chars=20_000, repeat_safe=True)
    def orders(sql: str, limit: int = 50) -> list[dict]:
        '''Run a read-only SQL query on orders.sqlite3; at most ``limit`` rows.'''
        ...

    Session(context=..., provider=..., tools=[orders]).run("which customer ordered most?")

The model calls ``orders("SELECT ...")`` from its code, in every kernel (host,
Monty, container): the call crosses to this process like ``llm_query`` does,
and the function runs here, never in the sandbox. Each call is bounded:

- its arguments, as JSON, at most ``max_arg_chars`` characters; they must be
  JSON-like (str, int, float, bool, None, lists, dicts) and match the signature;
- its own deadline, ``timeout_s`` (below ``RLM_HOST_CALL_TIMEOUT_S``, the
  kernel's deadline for any host call); a call past it is abandoned (its thread
  finishes on its own) and the model gets a ``TimeoutError``; with
  ``RLM_MAX_ABANDONED_HOST_CALLS`` of a tool's calls still running, the next is
  refused at once;
- its result, which must be JSON-like, at most ``max_result_chars`` characters
  as JSON: a larger one is refused (the model is told to ask for less), never
  clipped silently.

A refusal reaches the model as ``ValueError("[code] ...")``; an exception the
function raises reaches it by type (``KeyError``, ``ValueError``, ...; others as
``RuntimeError``). Every call is a ``tool_call`` event of the trajectory.

A root run's host calls are journalled (rlmfamily/journal.py): when the run is
resumed, a recorded call is answered from the journal and not run again. A tool
declared ``repeat_safe=True`` (a read, a pure function) runs again instead. A
call of one that is not, cut off by the crash before it returned, is never run
twice: the resumed step gets ``RuntimeError("[tool_outcome_unknown] ...")``.
Tools are the root's: a child (``rlm.run``) runs in a process of its own and
does not get them. ``rlm resume`` cannot rebuild Python functions, so a run with
tools is resumed from Python (docs/RLM.md, "Custom tools").
"""

from __future__ import annotations

import builtins
import inspect
import json
import keyword
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from rlmfamily.errors import RLMError
from rlmfamily.extensions import RunInfo
from rlmfamily.kernels._calls import check_json_like

FUNCTION_PREFIX: Final = "_tool_"  # the host function behind tool ``name`` is ``_tool_<name>``
MAX_TOOLS: Final = 32  # tools one run may be given
MAX_DOC_CHARS: Final = 2_000  # of a tool's docstring, shown to the model in the system prompt
DEFAULT_TIMEOUT_S: Final = 30.0
DEFAULT_MAX_ARG_CHARS: Final = 20_000
DEFAULT_MAX_RESULT_CHARS: Final = 20_000
MAX_BOUND_CHARS: Final = 10_000_000  # the largest max_arg_chars / max_result_chars a tool may declare
PREVIEW_CHARS: Final = 200  # of a call's arguments in its trajectory event
# Names the model's namespace already gives a meaning to (rlmfamily/namespace.py, the extensions' objects).
TAKEN_NAMES: Final = frozenset({"context", "llm_query", "llm_query_batched", "history", "final_answer", "rlm",
                                "a2a", "bash", "gates", "print", "tools"})


class ToolInvalid(RLMError):
    """A tool's definition is refused (its name, docstring, bounds or timeout) before the run starts."""

    code = "tool_invalid"


class ToolCallRefused(RLMError):
    """A call of a tool is refused: arguments or result too large or not JSON-like, or too many calls still running."""

    code = "tool_call_refused"


@dataclass(frozen=True)
class Tool:
    """A host function offered to the model. Build one with ``tool(fn)`` or ``@tool(...)``."""

    name: str
    fn: Callable[..., Any]
    signature: str  # as the model sees it: "(sql: str, limit: int = 50) -> list[dict]"
    doc: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_arg_chars: int = DEFAULT_MAX_ARG_CHARS
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS
    repeat_safe: bool = False  # a resume may run a recorded call again (a read), instead of answering from the journal
    parameters: inspect.Signature = field(repr=False, compare=False, default=inspect.Signature())

    @property
    def function_name(self) -> str:
        return FUNCTION_PREFIX + self.name


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, doc: str | None = None,
         timeout_s: float = DEFAULT_TIMEOUT_S, max_arg_chars: int = DEFAULT_MAX_ARG_CHARS,
         max_result_chars: int = DEFAULT_MAX_RESULT_CHARS, repeat_safe: bool = False) -> Any:
    """A ``Tool`` from a function: ``tool(fn)``, ``tool(fn, name="q")``, or as a decorator ``@tool(timeout_s=5)``.

    ``name`` defaults to the function's, ``doc`` to its docstring (one is required: it is all the model knows of
    the tool). Refused with ``ToolInvalid`` naming what to change."""

    def build(function: Callable[..., Any]) -> Tool:
        return _checked(function, name=name or getattr(function, "__name__", ""), doc=doc, timeout_s=timeout_s,
                        max_arg_chars=max_arg_chars, max_result_chars=max_result_chars, repeat_safe=repeat_safe)

    return build if fn is None else build(fn)


def _checked(fn: Callable[..., Any], *, name: str, doc: str | None, timeout_s: float, max_arg_chars: int,
             max_result_chars: int, repeat_safe: bool) -> Tool:
    if not callable(fn):
        raise ToolInvalid(f"tool {name!r} is not callable")
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise ToolInvalid(f"tool name {name!r} must be a Python identifier not starting with '_' (name=...)")
    if name in TAKEN_NAMES or hasattr(builtins, name):
        raise ToolInvalid(f"tool name {name!r} is a name the run's namespace already uses (a builtin, or one of "
                          "the run's own); give it another (name=...)")
    text = inspect.cleandoc(doc if doc is not None else (fn.__doc__ or ""))
    if not text:
        raise ToolInvalid(f"tool {name!r} has no docstring: the model knows a tool only by its signature and "
                          "docstring; write one, or pass doc=...")
    if len(text) > MAX_DOC_CHARS:
        raise ToolInvalid(f"the docstring of tool {name!r} is {len(text):,} characters; at most {MAX_DOC_CHARS:,} "
                          "are shown to the model (pass a shorter doc=...)")
    if not 0 < timeout_s <= 86_400:
        raise ToolInvalid(f"tool {name!r}: timeout_s must be more than 0 and at most 86400 seconds, not {timeout_s}")
    for label, value in (("max_arg_chars", max_arg_chars), ("max_result_chars", max_result_chars)):
        if not isinstance(value, int) or not 1 <= value <= MAX_BOUND_CHARS:
            raise ToolInvalid(f"tool {name!r}: {label} must be a whole number from 1 to {MAX_BOUND_CHARS:,}")
    try:
        parameters = inspect.signature(fn, eval_str=True)
    except (NameError, TypeError, ValueError):
        parameters = inspect.signature(fn)
    return Tool(name=name, fn=fn, signature=_shown_signature(parameters), doc=text, timeout_s=float(timeout_s),
                max_arg_chars=max_arg_chars, max_result_chars=max_result_chars, repeat_safe=repeat_safe,
                parameters=parameters)


def _shown_signature(signature: inspect.Signature) -> str:
    def annotation(value: Any) -> str:
        return value if isinstance(value, str) else inspect.formatannotation(value)

    parts = []
    for p in signature.parameters.values():
        text = p.name if p.annotation is inspect.Parameter.empty else f"{p.name}: {annotation(p.annotation)}"
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            text = "*" + text
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            text = "**" + text
        if p.default is not inspect.Parameter.empty:
            text += f" = {p.default!r}"
        parts.append(text)
    returned = ("" if signature.return_annotation is inspect.Signature.empty
                else f" -> {annotation(signature.return_annotation)}")
    return f"({', '.join(parts)}){returned}"


def check_tools(tools: Sequence[Tool], host_call_timeout_s: float) -> list[Tool]:
    """The run's tools, refused as a whole when they cannot all be offered (the session checks them at start)."""
    tools = list(tools)
    if len(tools) > MAX_TOOLS:
        raise ToolInvalid(f"{len(tools)} tools were given; a run takes at most {MAX_TOOLS}")
    seen: set[str] = set()
    for t in tools:
        if not isinstance(t, Tool):
            raise ToolInvalid(f"{t!r} is not a Tool: wrap the function with rlmfamily.tool(fn)")
        if t.name in seen:
            raise ToolInvalid(f"two tools are named {t.name!r}; give one another name (tool(fn, name=...))")
        seen.add(t.name)
        if t.timeout_s >= host_call_timeout_s:
            raise ToolInvalid(
                f"tool {t.name!r} has timeout_s={t.timeout_s:g}, which must be below the kernel's deadline for a host "
                f"call, {host_call_timeout_s:g} s: lower timeout_s, or raise RLM_HOST_CALL_TIMEOUT_S")
    return tools


def _prelude(tools: Sequence[Tool]) -> str:
    # Monty and the host kernel both run *args/**kwargs; the host binds them to the real signature.
    return "".join(f"\ndef {t.name}(*args, **kwargs):\n    return {t.function_name}(list(args), kwargs)\n"
                   for t in tools)


def _notes(tools: Sequence[Tool]) -> str:
    lines = ["\n\nTools of this run: functions you call from your code (they run outside your sandbox; arguments "
             "and results are JSON-like and bounded; a refused call raises ValueError saying why):"]
    for t in tools:
        doc = t.doc.replace("\n", "\n    ")
        lines.append(f"- `{t.name}{t.signature}` (at most {t.timeout_s:g} s; result at most "
                     f"{t.max_result_chars:,} characters as JSON)\n    {doc}")
    return "\n".join(lines)


class _Calls:
    """One tool's calls in one run: bounds checked, the function run on a thread with its deadline."""

    def __init__(self, t: Tool, info: RunInfo) -> None:
        self.tool = t
        self.info = info
        self.__name__ = t.function_name
        self.max_running = info.settings.max_abandoned_host_calls
        self.running = 0  # threads of this tool's calls not yet returned (abandoned ones included)
        self.calls = 0
        self.failed = 0
        self._lock = threading.Lock()

    def __call__(self, args: Any = None, kwargs: Any = None) -> Any:
        t = self.tool
        args = list(args or [])
        kwargs = dict(kwargs or {})
        with self._lock:
            self.calls += 1
        outcome: dict[str, Any] = {"arguments": _preview([args, kwargs])}
        try:
            value = self._call(args, kwargs, outcome)
        except BaseException as exc:
            with self._lock:
                self.failed += 1
            outcome.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:PREVIEW_CHARS])
            self._record(outcome)
            raise
        outcome["ok"] = True
        self._record(outcome)
        return value

    def _call(self, args: list[Any], kwargs: dict[str, Any], outcome: dict[str, Any]) -> Any:
        t = self.tool
        if (problem := check_json_like([args, kwargs])) is not None:
            raise ToolCallRefused(f"the arguments of {t.name} must be JSON-like (str, int, float, bool, None, "
                                  f"lists, dicts): {problem}")
        arg_chars = len(json.dumps([args, kwargs], ensure_ascii=False))
        outcome["arg_chars"] = arg_chars
        if arg_chars > t.max_arg_chars:
            raise ToolCallRefused(f"the arguments of {t.name} are {arg_chars:,} characters as JSON; it takes at most "
                                  f"{t.max_arg_chars:,} (its max_arg_chars): pass less")
        try:
            t.parameters.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{t.name}{t.signature}: {exc}") from None
        value = self._run(args, kwargs)
        if (problem := check_json_like(value)) is not None:
            raise ToolCallRefused(f"{t.name} returned a value that cannot reach your code ({problem}); the tool must "
                                  "return JSON-like data")
        result_chars = len(json.dumps(value, ensure_ascii=False, default=str))
        outcome["result_chars"] = result_chars
        if result_chars > t.max_result_chars:
            raise ToolCallRefused(f"the result of {t.name} is {result_chars:,} characters as JSON; at most "
                                  f"{t.max_result_chars:,} reach your code (its max_result_chars): ask for less")
        return value

    def _run(self, args: list[Any], kwargs: dict[str, Any]) -> Any:
        t = self.tool
        with self._lock:
            if self.running >= self.max_running:
                raise ToolCallRefused(
                    f"{self.running} calls of {t.name} are still running past their deadline; no more are started "
                    "(RLM_MAX_ABANDONED_HOST_CALLS)", setting="max_abandoned_host_calls")
            self.running += 1
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["value"] = t.fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - carried to the caller's thread
                box["error"] = exc
            finally:
                with self._lock:
                    self.running -= 1
                done.set()

        threading.Thread(target=work, name=f"rlm-tool-{t.name}", daemon=True).start()
        if not done.wait(t.timeout_s):
            raise TimeoutError(f"{t.name} did not return within its {t.timeout_s:g} s (its timeout_s); "
                               "it was abandoned")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _record(self, outcome: dict[str, Any]) -> None:
        self.info.trajectory.write("tool_call", turn=self.info.current_turn(), name=self.tool.name, **outcome)


class ToolsExtension:
    """The run's custom tools as an extension (rlmfamily/extensions.py): host functions, prelude and notes."""

    def __init__(self, info: RunInfo, tools: Sequence[Tool]) -> None:
        self.tools = check_tools(tools, info.settings.host_call_timeout_s)
        self.calls = {t.name: _Calls(t, info) for t in self.tools}
        self.prelude = _prelude(self.tools)
        self.notes = _notes(self.tools) if self.tools else ""

    @classmethod
    def factory(cls, tools: Sequence[Tool]) -> Callable[[RunInfo], ToolsExtension]:
        return lambda info: cls(info, tools)

    def functions(self) -> dict[str, Callable[..., Any]]:
        return {t.function_name: self.calls[t.name] for t in self.tools}

    def finish(self) -> None:
        pass

    def record(self) -> dict[str, Any]:
        if not self.tools:
            return {}
        return {"tools": [{"name": name, "calls": c.calls, "failed": c.failed} for name, c in self.calls.items()]}

    def close(self) -> None:
        pass


def repeat_safe_functions(tools: Sequence[Tool]) -> frozenset[str]:
    """Host functions a resume runs again instead of answering from the journal."""
    return frozenset(t.function_name for t in tools if t.repeat_safe)


def once_only_functions(tools: Sequence[Tool]) -> frozenset[str]:
    """Host functions never run twice: a call cut off by a crash is answered ``tool_outcome_unknown`` on resume."""
    return frozenset(t.function_name for t in tools if not t.repeat_safe)


def _preview(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except ValueError:
        text = repr(value)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
