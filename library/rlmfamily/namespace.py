"""The namespace the model's code sees: the prelude (sandbox side) and the bridge (host side).

The prelude is Python source in the subset both kernels run (Monty has no
inheritance, decorators, ``del`` or ``dir``). It defines ``context``,
``llm_query``, ``llm_query_batched``, ``history`` and ``final_answer`` on top
of host functions whose names start with ``_``; kernels run it before every
step, so model code that overwrites a reserved name cannot break the next step.
Objects made in an earlier step keep working because the prelude recognises
its own objects by a ``_rlm_kind`` attribute, not by class identity.

The bridge holds the host functions. Arguments and results are JSON-like.
Content stays on the host: ``search`` runs here, chunks are references
(path, start, end) that the host resolves when a sub-call needs their text.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rlmfamily.context import Context
from rlmfamily.errors import ContextError, RLMError
from rlmfamily.history import History
from rlmfamily.llm import PREVIEW_CHARS, SubcallRunner

RESERVED_NAMES = ("context", "llm_query", "llm_query_batched", "history", "final_answer")
MAX_CACHED_VIEWS = 64  # views (context.select results) the bridge keeps built; older ones are rebuilt on use
MAX_CONTEXT_DEPTH = 64  # lists in lists of a sub-call's context, as deep as a host call's value may be
MAX_SOURCES_NAMED = 8  # chunks a sub-call's record names (rlm show, the page); the rest are counted

PRELUDE = r'''
class _Chunk:
    def __init__(self, path, start, end):
        self._rlm_kind = "chunk"
        self.path = path
        self.start = start
        self.end = end

    def text(self):
        return _context_read([], self.path, self.start, self.end - self.start)

    def labelled(self):
        return "=== " + self.path + " [" + str(self.start) + ":" + str(self.end) + "] ===\n" + self.text()

    def ref(self):
        return {"path": self.path, "start": self.start, "end": self.end}

    def __repr__(self):
        return "<chunk " + self.path + " [" + str(self.start) + ":" + str(self.end) + "]>"


class _Context:
    def __init__(self, filters):
        self._rlm_kind = "context"
        self._filters = filters

    def files(self):
        return _context_files(self._filters)

    def size(self):
        return _context_size(self._filters)

    def stats(self):
        return _context_stats(self._filters)

    def read(self, path, start=None, size=None):
        return _context_read(self._filters, path, start, size)

    def search(self, pattern, limit=20):
        return _context_search(self._filters, pattern, limit)

    def select(self, *globs):
        if len(globs) == 0:
            return self
        return _Context(self._filters + [list(globs)])

    def chunk(self, size=20000, overlap=0):
        return [_Chunk(c["path"], c["start"], c["end"]) for c in _context_chunk(self._filters, size, overlap)]

    def text(self, max_chars=None):
        return _context_text(self._filters, max_chars)

    def __repr__(self):
        return _context_describe(self._filters)

    def __str__(self):
        return self.text()


class _LLMResult:
    _PREVIEW_CHARS = @PREVIEW_CHARS@  # rlmfamily.llm.PREVIEW_CHARS, as the host's LLMResult

    def __init__(self, d):
        self._rlm_kind = "llm_result"
        self.text = d["text"]
        self.ok = d["ok"]
        self.error = d["error"]
        self.error_code = d["error_code"]
        self.advice = d["advice"]
        self.truncated = d["truncated"]
        self.usage = d["usage"]

    def __repr__(self):
        if not self.ok:
            return "LLMResult(error=" + str(self.error_code) + ": " + repr(str(self.error)[:self._PREVIEW_CHARS]) + ")"
        preview = self.text[:self._PREVIEW_CHARS]
        if len(self.text) > self._PREVIEW_CHARS:
            preview = preview + "..."
        extra = ", truncated" if self.truncated else ""
        return "LLMResult(" + repr(preview) + ", " + str(len(self.text)) + " chars" + extra + ")"

    def __str__(self):
        return self.text


class _History:
    def __init__(self):
        self._rlm_kind = "history"

    def search(self, query, limit=10):
        return _history_search(query, limit)

    def read(self, entry_id, start=0, size=None):
        return _history_read(entry_id, start, size)

    def stats(self):
        return _history_stats()

    def __repr__(self):
        return "<history: search(query, limit), read(id, start, size), stats()>"


def _rlm_context_arg(c):
    kind = getattr(c, "_rlm_kind", None)
    if kind == "chunk":
        return c.ref()
    if kind == "llm_result":
        return c.text
    if kind == "context":
        return c.text()
    if isinstance(c, list) or isinstance(c, tuple):
        return [_rlm_context_arg(x) for x in c]
    return c


def llm_query(prompt, context="", model=None):
    return _LLMResult(_llm_query(prompt, _rlm_context_arg(context), model))


def llm_query_batched(prompts, contexts=None, model=None):
    if contexts is not None:
        contexts = [_rlm_context_arg(c) for c in contexts]
    return [_LLMResult(d) for d in _llm_query_batched(list(prompts), contexts, model)]


def final_answer(value):
    if getattr(value, "_rlm_kind", None) == "llm_result":
        value = value.text
    return _final_answer(value)


context = _Context([])
history = _History()
'''.replace("@PREVIEW_CHARS@", str(PREVIEW_CHARS))


@dataclass
class AnswerBox:
    """Where ``final_answer`` puts the answer; the session reads it after each step."""

    value: str | None = None
    turn: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def set(self, value: str, turn: int) -> None:
        with self._lock:
            self.value = value
            self.turn = turn

    def withdraw(self) -> None:
        """A completion gate failed: the answer no longer stands and the run goes on (rlmfamily/gates)."""
        with self._lock:
            self.value = None
            self.turn = None


def render_answer(value: Any, max_chars: int | None = None) -> str:
    """The answer as text; a structure is JSON. Past ``max_chars`` the encoding stops (the caller refuses it)."""
    if isinstance(value, str):
        return value
    encoder = json.JSONEncoder(ensure_ascii=False, indent=2, default=str)
    pieces: list[str] = []
    used = 0
    for piece in encoder.iterencode(value):
        pieces.append(piece)
        used += len(piece)
        if max_chars is not None and used > max_chars:
            break
    return "".join(pieces)


def _guest_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Our errors reach sandboxed code as ValueError with the stable code in brackets (Monty keeps builtins only)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RLMError as exc:
            raise ValueError(f"[{exc.code}] {exc.message}") from None

    wrapper.__name__ = fn.__name__
    return wrapper


class Bridge:
    """The host functions of one session, by name (what ``Kernel.start`` receives)."""

    def __init__(
        self,
        *,
        context: Context,
        subcalls: SubcallRunner,
        history: History,
        answer: AnswerBox,
        max_answer_chars: int,
        current_turn: Callable[[], int],
    ) -> None:
        self.context = context
        self.subcalls = subcalls
        self.history = history
        self.answer = answer
        self.max_answer_chars = max_answer_chars
        self.current_turn = current_turn
        self._views: dict[Any, Context] = {}
        self._views_lock = threading.Lock()

    def functions(self) -> dict[str, Callable[..., Any]]:
        names = [
            "_context_files", "_context_size", "_context_stats", "_context_read", "_context_search",
            "_context_chunk", "_context_text", "_context_describe", "_llm_query", "_llm_query_batched",
            "_final_answer", "_history_search", "_history_read", "_history_stats",
        ]
        return {name: _guest_errors(getattr(self, name)) for name in names}

    # ---------- context ----------

    def view(self, filters: Any) -> Context:
        if not filters:
            return self.context
        if not isinstance(filters, (list, tuple)) or not all(isinstance(g, (list, tuple)) for g in filters):
            raise ContextError("select() takes glob strings, e.g. context.select('*.py', 'docs/*')")
        max_globs = self.context.settings.max_select_globs
        if len(filters) > max_globs or sum(len(g) for g in filters) > max_globs:
            raise ContextError(f"a view of more than {max_globs} globs (RLM_MAX_SELECT_GLOBS); select with fewer",
                               setting="max_select_globs")
        key = tuple(tuple(p if isinstance(p, str) else str(p) for p in g) for g in filters)
        with self._views_lock:
            view = self._views.get(key)
        if view is None:
            view = self.context
            for globs in key:
                view = view.select(*globs)
            with self._views_lock:
                # Each view holds a list of its paths: keep the most recent few, not every view ever asked for.
                while len(self._views) >= MAX_CACHED_VIEWS:
                    self._views.pop(next(iter(self._views)))
                self._views[key] = view
        return view

    def _context_files(self, filters: Any) -> list[str]:
        return self.view(filters).files()

    def _context_size(self, filters: Any) -> int:
        return self.view(filters).size()

    def _context_stats(self, filters: Any) -> dict[str, Any]:
        return self.view(filters).stats()

    def _context_read(self, filters: Any, path: str, start: int | None = None, size: int | None = None) -> str:
        return self.view(filters).read(str(path), start, size)

    def _context_search(self, filters: Any, pattern: str, limit: int = 20) -> list[dict[str, Any]]:
        return self.view(filters).search(str(pattern), int(limit))

    def _context_chunk(self, filters: Any, size: int = 20_000, overlap: int = 0) -> list[dict[str, Any]]:
        return [c.ref() for c in self.view(filters).chunk(int(size), int(overlap))]

    def _context_text(self, filters: Any, max_chars: int | None = None) -> str:
        return self.view(filters).text(max_chars)

    def _context_describe(self, filters: Any) -> str:
        return self.view(filters).describe()

    def resolve_context(self, value: Any) -> str:
        """Text for a sub-call's ``context``: a string, a chunk reference, a search hit, or a list of them.

        Resolved against ``max_prompt_chars``: a list of a million chunk references stops at the cap with
        an error naming the setting, instead of reading them all first and refusing afterwards.
        """
        cap = self.context.settings.max_prompt_chars
        parts: list[str] = []
        used = 0
        for part in self._context_parts(value, depth=0):
            used += len(part) + (2 if parts else 0)
            if used > cap:
                raise ContextError(
                    f"the context is over {cap:,} characters; a sub-call takes at most {cap:,} (RLM_MAX_PROMPT_CHARS)",
                    setting="max_prompt_chars",
                )
            parts.append(part)
        return "\n\n".join(parts)

    def sources_of(self, value: Any) -> tuple[str, ...]:
        """Which part of the corpus a sub-call's ``context`` is, for the record: ``path:first-last`` lines of each
        chunk or search hit, the type of any other handle; plain text names none. At most MAX_SOURCES_NAMED are
        named, then how many more. Called on a context ``resolve_context`` accepted, so its size is bounded."""
        found: list[str] = []
        more = 0
        todo = [value]
        while todo:
            item = todo.pop()
            if isinstance(item, (list, tuple)):
                todo.extend(reversed(item))
                continue
            if item is None or isinstance(item, str):
                continue
            if len(found) >= MAX_SOURCES_NAMED:
                more += 1
            elif isinstance(item, dict) and {"path", "start", "end"} <= set(item):
                found.append(self.context.where(str(item["path"]), int(item["start"]), int(item["end"])))
            elif all(hasattr(item, name) for name in ("labelled", "path", "start", "end")):  # a Chunk
                found.append(self.context.where(item.path, item.start, item.end))
            else:
                found.append(f"a {type(item).__name__} handle")
        return (*found, f"+{more} more") if more else tuple(found)

    def _context_parts(self, value: Any, depth: int) -> Iterator[str]:
        if depth > MAX_CONTEXT_DEPTH:
            raise ContextError(f"a context nested deeper than {MAX_CONTEXT_DEPTH} lists")
        if value is None:
            yield ""
        elif isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            if not {"path", "start", "end"} <= set(value):
                raise ContextError("a dict context must be a chunk reference (path, start, end) "
                                   "or a search hit (path, line, start, end)")
            path, start, end = str(value["path"]), int(value["start"]), int(value["end"])
            # A search hit (it has a line) sends its lines, not only the matched characters.
            if "line" in value:
                yield self.context.hit_text(path, start, end)
            else:
                yield self.context.chunk_text(path, start, end)
        elif isinstance(value, (list, tuple)):
            for item in value:
                yield from self._context_parts(item, depth + 1)
        elif hasattr(value, "labelled"):
            yield str(value.labelled())
        else:
            yield str(value)

    # ---------- sub-calls ----------

    def _llm_query(self, prompt: Any, context: Any = "", model: str | None = None) -> dict[str, Any]:
        return self.subcalls.query(prompt, context, model).to_dict()

    def _llm_query_batched(self, prompts: Any, contexts: Any = None, model: str | None = None) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.subcalls.query_batched(prompts, contexts, model)]

    # ---------- the answer ----------

    def _final_answer(self, value: Any) -> str:
        if value is None:
            raise ValueError("final_answer needs a value: final_answer('the answer')")
        text = render_answer(value, self.max_answer_chars)
        if len(text) > self.max_answer_chars:
            raise ValueError(
                f"the answer is over {self.max_answer_chars:,} characters, the most accepted "
                "(RLM_MAX_ANSWER_CHARS). Summarise it"
            )
        self.answer.set(text, self.current_turn())
        return "final answer recorded; the run ends after this step"

    # ---------- history ----------

    def _history_search(self, query: str, limit: int = 10) -> list[dict[str, Any]]:
        return self.history.search(str(query), int(limit))

    def _history_read(self, entry_id: int, start: int = 0, size: int | None = None) -> str:
        return self.history.read(int(entry_id), int(start or 0), size)

    def _history_stats(self) -> dict[str, Any]:
        return self.history.stats()
