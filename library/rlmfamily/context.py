"""The corpus as data: a repository, a single document, or an evidence bundle.

``Context`` owns loading (git-tracked files only, binaries and oversized files
skipped and reported, caps on files and bytes), narrowed views (``select``),
search, chunking and a bounded, labelled text form for prompts. Offsets are
character offsets in the original file, also for bundle items, so every chunk
and search hit points back at its source.

Sizes come from the file system at load time; ``size()`` and ``stats()`` never
read content. Text is read lazily and cached (the total is capped by
``max_total_bytes``).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from rlmfamily.errors import (
    BundleInvalid,
    ContextError,
    ContextSourceMissing,
    FileNotInContext,
    ReadTooLarge,
    SearchTimeout,
)
from rlmfamily.patterns import compile_pattern
from rlmfamily.settings import RLMSettings

BINARY_SNIFF_BYTES = 8192
MAX_SKIPPED_EXAMPLES = 50
LARGEST_FILES_SHOWN = 5  # in stats()
MAX_SUGGESTIONS = 3  # same-named paths a FileNotInContext suggests
MAX_BUNDLE_PATH_CHARS = 4096  # a bundle item's path: Linux's PATH_MAX, so any real file's path fits
Filters = tuple[tuple[str, ...], ...]


@dataclass
class Document:
    """One file (or bundle item) of the corpus. ``origin`` is the offset of its first character in the source file."""

    path: str
    size_bytes: int
    origin: int = 0
    source_path: Path | None = None
    _text: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str  # binary | too_large | max_files | max_total_bytes | missing | symlink | unreadable
    size_bytes: int | None = None


@dataclass(frozen=True)
class Chunk:
    """A slice of one file. ``text()`` reads it; ``labelled()`` is the form to put in a prompt."""

    path: str
    start: int
    end: int
    _context: Context = field(repr=False, compare=False)

    def text(self) -> str:
        return self._context.read(self.path, self.start, self.end - self.start)

    def labelled(self) -> str:
        return label(self.path, self.start, self.end) + "\n" + self.text()

    def ref(self) -> dict[str, Any]:
        return {"path": self.path, "start": self.start, "end": self.end}


class BundleItem(BaseModel):
    """One piece of evidence handed to a session: text taken from ``path`` at [start, end)."""

    model_config = ConfigDict(extra="forbid")
    path: str
    start: int
    end: int
    text: str

    @model_validator(mode="after")
    def _consistent(self) -> BundleItem:
        if len(self.path) > MAX_BUNDLE_PATH_CHARS:
            raise ValueError(f"a path is {len(self.path):,} characters; at most {MAX_BUNDLE_PATH_CHARS} are accepted")
        if self.start < 0 or self.end < self.start:
            raise ValueError(f"{self.path}: need 0 <= start <= end, got start={self.start} end={self.end}")
        if self.end - self.start != len(self.text):
            raise ValueError(
                f"{self.path}: end - start is {self.end - self.start} but the text has {len(self.text)} "
                "characters (offsets are character offsets)"
            )
        return self


def label(path: str, start: int, end: int) -> str:
    return f"=== {path} [{start}:{end}] ==="


def _glob_matcher(globs: Sequence[str]) -> Callable[[str], bool]:
    """Whether a path matches any of ``globs``: fnmatch's syntax, compiled once per view.

    fnmatch's "*" already crosses "/", so "*.py" finds nested files; "**/x" also matches a top-level "x".
    Compiled through ``re`` (whose cache keeps 512 patterns) rather than ``fnmatch.fnmatchcase``, whose
    cache keeps 32,768: distinct globs from the sandbox must not pile up in this process. fnmatch's
    translation uses atomic groups, so one match is linear in the path and the glob.
    """
    sources = []
    for pattern in globs:
        sources.append(fnmatch.translate(pattern))
        if pattern.startswith("**/"):
            sources.append(fnmatch.translate(pattern.removeprefix("**/")))
    regex = re.compile("|".join(sources))
    return lambda path: regex.match(path) is not None


class Context:
    """The corpus, or a narrowed view of it (``select``). Views share the loaded documents."""

    def __init__(
        self,
        documents: Sequence[Document],
        *,
        settings: RLMSettings,
        source: str,
        root: str,
        skipped: Sequence[Skipped] = (),
        notes: Sequence[str] = (),
        filters: Filters = (),
        _shared: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.source = source
        self.root = root
        self.filters = filters
        if _shared is None:
            _shared = {
                "docs": {d.path: d for d in documents},
                "skipped": list(skipped),
                "notes": list(notes),
                "lock": threading.Lock(),
            }
        self._shared = _shared
        self._docs: dict[str, Document] = _shared["docs"]
        matchers = [_glob_matcher(g) for g in filters]
        self._paths = [p for p in self._docs if all(match(p) for match in matchers)]
        self._in_view = set(self._paths)

    # ---------- construction ----------

    @classmethod
    def from_repository(cls, path: str | Path, settings: RLMSettings) -> Context:
        """Git-tracked files of the repository at ``path`` (or, outside git, every file under it)."""
        root = Path(path).expanduser().resolve()
        if not root.is_dir():
            raise ContextSourceMissing(f"repository folder {root} does not exist or is not a folder")
        notes: list[str] = []
        listed = _git_tracked(root)
        if listed is None:
            notes.append("not a git work tree: every file under the folder was listed (dot-folders skipped)")
            listed = _walk(root)
        elif not listed:
            # An untracked folder inside someone's work tree (an installed package in a project's .venv,
            # a download in a checkout): git lists nothing, yet the folder is the corpus the user named.
            notes.append("no git-tracked file under the folder: every file under it was listed (dot-folders skipped)")
            listed = _walk(root)
        documents: list[Document] = []
        skipped: list[Skipped] = []
        total = 0
        for rel in listed:
            full = root / rel
            if full.is_symlink():
                skipped.append(Skipped(rel, "symlink"))
                continue
            try:
                size = full.stat().st_size
            except FileNotFoundError:
                skipped.append(Skipped(rel, "missing"))
                continue
            except OSError:
                skipped.append(Skipped(rel, "unreadable"))
                continue
            if not full.is_file():
                continue  # submodules and other non-files listed by git
            if size > settings.max_file_bytes:
                skipped.append(Skipped(rel, "too_large", size))
                continue
            if len(documents) >= settings.max_files:
                skipped.append(Skipped(rel, "max_files", size))
                continue
            if total + size > settings.max_total_bytes:
                skipped.append(Skipped(rel, "max_total_bytes", size))
                continue
            if _is_binary(full):
                skipped.append(Skipped(rel, "binary", size))
                continue
            documents.append(Document(rel, size, 0, full))
            total += size
        if any(s.reason in ("max_files", "max_total_bytes") for s in skipped):
            notes.append(
                f"caps reached: at most {settings.max_files} files (RLM_MAX_FILES) and "
                f"{settings.max_total_bytes:,} bytes (RLM_MAX_TOTAL_BYTES) are loaded"
            )
        return cls(documents, settings=settings, source="repository", root=str(root), skipped=skipped, notes=notes)

    @classmethod
    def from_document(cls, path: str | Path, settings: RLMSettings) -> Context:
        """One file as the whole corpus."""
        full = Path(path).expanduser().resolve()
        if not full.is_file():
            raise ContextSourceMissing(f"document {full} does not exist or is not a file")
        size = full.stat().st_size
        if size > settings.max_total_bytes or size > settings.max_file_bytes:
            cap = min(settings.max_total_bytes, settings.max_file_bytes)
            raise ContextError(
                f"document is {size:,} bytes; at most {cap:,} are accepted "
                "(raise RLM_MAX_FILE_BYTES and RLM_MAX_TOTAL_BYTES)",
                setting="max_file_bytes",
            )
        if _is_binary(full):
            raise ContextError(f"document {full.name} looks binary (it contains NUL bytes); give a text file")
        doc = Document(full.name, size, 0, full)
        return cls([doc], settings=settings, source="document", root=str(full))

    @classmethod
    def from_bundle_file(cls, path: str | Path, settings: RLMSettings) -> Context:
        """A bundle from a JSON file: a list of items, or ``{"items": [...]}`` (``rlm run --bundle``)."""
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ContextError(f"bundle {path} cannot be read as JSON: {exc}") from None
        items = raw.get("items") if isinstance(raw, dict) else raw
        if not isinstance(items, list):
            raise ContextError(f"bundle {path} must be a JSON list of items (or {{\"items\": [...]}})")
        return cls.from_bundle(items, settings)

    @classmethod
    def from_bundle(cls, items: Iterable[dict[str, Any] | BundleItem], settings: RLMSettings) -> Context:
        """An explicit evidence bundle of ``{path, start, end, text}`` items, in the given order.

        Linear in the items: the count is checked while reading (an endless iterable stops at
        ``max_bundle_items`` + 1), names are checked against a set.
        """
        cap = settings.max_bundle_items
        parsed: list[BundleItem] = []
        for index, raw in enumerate(items):
            if index >= cap:
                raise BundleInvalid(
                    f"bundle has more than {cap:,} items; at most {cap:,} are accepted (RLM_MAX_BUNDLE_ITEMS)",
                    setting="max_bundle_items",
                )
            try:
                parsed.append(raw if isinstance(raw, BundleItem) else BundleItem.model_validate(raw))
            except ValidationError as exc:
                first = exc.errors()[0]
                raise BundleInvalid(f"bundle item {index}: {first['msg']}") from None
        sizes = [_utf8_bytes(item.text) for item in parsed]
        total = sum(sizes)
        if total > settings.max_total_bytes:
            raise BundleInvalid(
                f"bundle is {total:,} bytes; at most {settings.max_total_bytes:,} are accepted (RLM_MAX_TOTAL_BYTES)",
                setting="max_total_bytes",
            )
        counts = Counter(item.path for item in parsed)
        documents: list[Document] = []
        names: set[str] = set()
        for item, size in zip(parsed, sizes):
            # A path quoted twice becomes two documents, each named with its range.
            name = item.path if counts[item.path] == 1 else f"{item.path}:{item.start}-{item.end}"
            if name in names:
                raise BundleInvalid(f"bundle quotes {name} twice with the same range")
            names.add(name)
            documents.append(Document(name, size, item.start, None, item.text))
        return cls(documents, settings=settings, source="bundle", root="(evidence bundle)")

    # ---------- the view ----------

    def select(self, *globs: str) -> Context:
        """A narrowed view: files matching any of ``globs`` (fnmatch; ``*`` crosses folders). Views nest."""
        if not globs:
            return self
        self._check_globs(globs)
        return Context(
            (),
            settings=self.settings,
            source=self.source,
            root=self.root,
            filters=self.filters + (tuple(globs),),
            _shared=self._shared,
        )

    def _check_globs(self, globs: Sequence[str]) -> None:
        # Every path is matched against every glob of a view: bound both, at the boundary.
        max_globs, max_chars = self.settings.max_select_globs, self.settings.max_glob_chars
        count = sum(len(g) for g in self.filters) + len(globs)
        if count > max_globs:
            raise ContextError(
                f"this view would match paths against {count} globs; at most {max_globs} are accepted "
                "(RLM_MAX_SELECT_GLOBS). Select with fewer, wider globs",
                setting="max_select_globs",
            )
        for glob in globs:
            if not isinstance(glob, str):
                raise ContextError(f"select() takes glob strings, e.g. select('*.py'), not {type(glob).__name__}")
            if len(glob) > max_chars:
                raise ContextError(
                    f"a glob of {len(glob):,} characters; at most {max_chars} are accepted (RLM_MAX_GLOB_CHARS)",
                    setting="max_glob_chars",
                )

    def files(self) -> list[str]:
        return list(self._paths)

    def size(self) -> int:
        """Total bytes of the files in view, from the file system: nothing is read."""
        return sum(self._docs[p].size_bytes for p in self._paths)

    def stats(self) -> dict[str, Any]:
        """The corpus's shape (counts, bytes, top folders and extensions, skips), never its content."""
        folders: Counter[str] = Counter()
        folder_bytes: Counter[str] = Counter()
        exts: Counter[str] = Counter()
        ext_bytes: Counter[str] = Counter()
        for p in self._paths:
            size = self._docs[p].size_bytes
            parts = PurePosixPath(p).parts
            top = parts[0] + "/" if len(parts) > 1 else "(top level)"
            folders[top] += 1
            folder_bytes[top] += size
            ext = PurePosixPath(p).suffix.lower() or "(none)"
            exts[ext] += 1
            ext_bytes[ext] += size
        largest = sorted(self._paths, key=lambda p: -self._docs[p].size_bytes)[:LARGEST_FILES_SHOWN]
        skipped = self._shared["skipped"]
        return {
            "source": self.source,
            "root": self.root,
            "view": [list(g) for g in self.filters],
            "files": len(self._paths),
            "bytes": self.size(),
            "top_folders": [
                {"folder": f, "files": n, "bytes": folder_bytes[f]} for f, n in folders.most_common(10)
            ],
            "extensions": [{"ext": e, "files": n, "bytes": ext_bytes[e]} for e, n in exts.most_common(10)],
            "largest_files": [{"path": p, "bytes": self._docs[p].size_bytes} for p in largest],
            "skipped": dict(Counter(s.reason for s in skipped)),
            "skipped_examples": [
                {"path": s.path, "reason": s.reason, "bytes": s.size_bytes} for s in skipped[:MAX_SKIPPED_EXAMPLES]
            ],
            "notes": list(self._shared["notes"]),
        }

    def describe(self) -> str:
        view = " view " + " & ".join("|".join(g) for g in self.filters) if self.filters else ""
        return f"<context {self.source} {self.root}{view}: {len(self._paths)} files, {self.size():,} bytes>"

    __repr__ = describe

    # ---------- content ----------

    def _doc(self, path: str) -> Document:
        doc = self._docs.get(path)
        if doc is None or path not in self._in_view:
            where = "this view" if self.filters else "the context"
            if len(path) > MAX_BUNDLE_PATH_CHARS:  # no path is that long: do not echo it, nor look for its name
                raise FileNotInContext(f"a path of {len(path):,} characters is not in {where}; context.files() "
                                       "lists the paths")
            close = [p for p in self._paths if PurePosixPath(p).name == PurePosixPath(path).name][:MAX_SUGGESTIONS]
            hint = f"; did you mean {', '.join(close)}?" if close else "; context.files() lists the paths"
            raise FileNotInContext(f"{path!r} is not in {where}{hint}")
        return doc

    def _full_text(self, doc: Document) -> str:
        if doc._text is None:
            with self._shared["lock"]:
                if doc._text is None:
                    assert doc.source_path is not None
                    doc._text = doc.source_path.read_bytes().decode("utf-8", errors="replace")
        return doc._text

    def length(self, path: str) -> int:
        """Characters in ``path`` (reads it)."""
        return len(self._full_text(self._doc(path)))

    def read(self, path: str, start: int | None = None, size: int | None = None) -> str:
        """Text of ``path`` from offset ``start`` (default: its beginning), at most ``size`` characters."""
        doc = self._doc(path)
        text = self._full_text(doc)
        begin = doc.origin if start is None else int(start)
        if begin < doc.origin:
            raise ContextError(f"{path} starts at offset {doc.origin}; start={begin} is before it")
        local = begin - doc.origin
        remaining = max(0, len(text) - local)
        want = remaining if size is None else max(0, min(int(size), remaining))
        cap = self.settings.max_read_chars
        if want > cap:
            raise ReadTooLarge(
                f"{path} has {remaining:,} characters from offset {begin}; one read returns at most {cap:,} "
                f"(RLM_MAX_READ_CHARS). Read a slice with read(path, start, size) or use chunk()",
                setting="max_read_chars",
            )
        return text[local : local + want]

    def search(self, pattern: str, limit: int = 20) -> list[dict[str, Any]]:
        """Regex hits in the view, in file order: path, line, start, end, match and a one-line snippet.

        The pattern is RE2 syntax, MULTILINE, run in linear time (rlmfamily/patterns.py says what it refuses).
        At most ``limit`` hits (capped by RLM_MAX_SEARCH_HITS); past RLM_SEARCH_TIMEOUT_S (or the host
        call's deadline, if shorter) it stops between two matches with SearchTimeout.
        """
        regex = compile_pattern(pattern, self.settings)
        limit = max(1, min(int(limit), self.settings.max_search_hits))
        timeout_s = min(self.settings.search_timeout_s, self.settings.host_call_timeout_s)
        deadline = time.monotonic() + timeout_s
        hits: list[dict[str, Any]] = []
        for index, path in enumerate(self._paths):
            doc = self._docs[path]
            text = self._full_text(doc)
            line, counted = 1, 0  # lines are counted incrementally: each character once per file
            for start, end in regex.spans(text):
                line += text.count("\n", counted, start)
                counted = start
                hits.append(self._hit(path, doc, text, start, end, line))
                if len(hits) >= limit:
                    return hits
                if time.monotonic() > deadline:
                    raise self._search_timeout(timeout_s, index, len(hits))
            if time.monotonic() > deadline and index + 1 < len(self._paths):
                raise self._search_timeout(timeout_s, index + 1, len(hits))
        return hits

    def _hit(self, path: str, doc: Document, text: str, start: int, end: int, line: int) -> dict[str, Any]:
        # The snippet is the hit's line when it fits in search_snippet_chars, else a window around the hit;
        # only that many characters on either side are looked at, however long the line.
        width = self.settings.search_snippet_chars
        low, high = max(0, start - width), min(len(text), start + width + 1)
        before = text.rfind("\n", low, start)
        line_start = before + 1 if before != -1 else (0 if low == 0 else None)
        after = text.find("\n", start, high)
        line_end = after if after != -1 else (len(text) if high == len(text) else None)
        if line_start is not None and line_end is not None and line_end - line_start <= width:
            snippet = text[line_start:line_end]
        else:
            left = max(line_start or 0, start - width // 2)
            snippet = text[left : left + width]
        return {
            "path": path,
            "line": line,
            "start": doc.origin + start,
            "end": doc.origin + end,
            "match": text[start : min(end, start + width)],
            "snippet": snippet,
        }

    def _search_timeout(self, timeout_s: float, files_done: int, hits: int) -> SearchTimeout:
        return SearchTimeout(
            f"search stopped after {timeout_s:g} s (RLM_SEARCH_TIMEOUT_S, or RLM_HOST_CALL_TIMEOUT_S if shorter) "
            f"with {hits} hits in {files_done} of {len(self._paths)} files; select() fewer files, or search for a "
            "more specific pattern",
            setting="search_timeout_s",
        )

    def chunk(self, size: int = 20_000, overlap: int = 0) -> list[Chunk]:
        """Slices of at most ``size`` characters per file, ``overlap`` characters shared by neighbours."""
        size, overlap = int(size), int(overlap)
        if size < 1 or overlap < 0 or overlap >= size:
            raise ContextError(f"chunk needs size >= 1 and 0 <= overlap < size (got size={size}, overlap={overlap})")
        chunks: list[Chunk] = []
        step = size - overlap
        for path in self._paths:
            doc = self._docs[path]
            length = len(self._full_text(doc))
            local = 0
            while True:
                end = min(local + size, length)
                chunks.append(Chunk(path, doc.origin + local, doc.origin + end, self))
                if len(chunks) > self.settings.max_chunks:
                    raise ContextError(
                        f"chunk(size={size}) makes more than {self.settings.max_chunks:,} chunks (RLM_MAX_CHUNKS); "
                        "select() fewer files or use a larger size",
                        setting="max_chunks",
                    )
                if end >= length:
                    break
                local += step
        return chunks

    def text(self, max_chars: int | None = None) -> str:
        """The view as labelled text for a prompt, bounded by ``max_chars`` (default RLM_MAX_CONTEXT_TEXT_CHARS)."""
        cap = self.settings.max_context_text_chars
        budget = cap if max_chars is None else max(0, min(int(max_chars), cap))
        parts: list[str] = []
        used = 0
        for index, path in enumerate(self._paths):
            doc = self._docs[path]
            body = self._full_text(doc)
            head = label(path, doc.origin, doc.origin + len(body)) + "\n"
            room = budget - used - len(head) - 1
            if room <= 0:
                rest = len(self._paths) - index
                parts.append(f"[... {rest} more files not shown; read() or chunk() them]")
                break
            shown = body[:room]
            parts.append(head + shown + ("\n" if len(shown) == len(body) else "\n[... file continues]\n"))
            used += len(head) + len(shown) + 1
        return "".join(parts)

    def chunk_text(self, path: str, start: int, end: int) -> str:
        """Labelled text of a chunk reference (what llm_query receives for a chunk)."""
        return label(path, start, end) + "\n" + self.read(path, start, end - start)

    def where(self, path: str, start: int, end: int) -> str:
        """``path:first-last``: the lines of the file that characters [start, end) span (what a sub-call answered)."""
        doc = self._doc(path)
        text = self._full_text(doc)
        local_start = min(max(int(start) - doc.origin, 0), len(text))
        local_last = min(max(int(end) - doc.origin - 1, local_start), len(text))
        first, last = text.count("\n", 0, local_start) + 1, text.count("\n", 0, local_last) + 1
        return f"{path}:{first}" if first == last else f"{path}:{first}-{last}"

    def hit_text(self, path: str, start: int, end: int) -> str:
        """Labelled text of a search hit (what llm_query receives for one): its path, line numbers and lines.

        The hit's own lines and RLM_HIT_CONTEXT_LINES lines either side, read from the corpus (not from the
        hit's snippet, which the model's code may have changed), within RLM_HIT_CONTEXT_CHARS characters.
        """
        doc = self._doc(path)
        text = self._full_text(doc)
        local_start, local_end = int(start) - doc.origin, int(end) - doc.origin
        if not 0 <= local_start <= local_end <= len(text):
            raise ContextError(f"a search hit at [{start}:{end}] is outside {path} "
                               f"[{doc.origin}:{doc.origin + len(text)}]; pass the hit context.search returned")
        settings = self.settings
        begin, stop, clipped = _line_window(text, local_start, local_end, settings.hit_context_lines,
                                            settings.hit_context_chars)
        hit_line = text.count("\n", 0, local_start) + 1
        first = hit_line - text.count("\n", begin, local_start)
        last = hit_line + text.count("\n", local_start, stop)
        lines = f"line {first}" if first == last else f"lines {first}-{last}"
        cut = ", lines cut at RLM_HIT_CONTEXT_CHARS" if clipped else ""
        return (f"=== {path} {lines} (hit on line {hit_line} at [{start}:{end}]{cut}) ===\n"
                + text[begin:stop])


def _line_window(text: str, start: int, end: int, lines: int, max_chars: int) -> tuple[int, int, bool]:
    """[begin, end) of the lines holding text[start:end] plus ``lines`` lines either side, within ``max_chars``.

    Only max_chars characters are looked at, however long the lines: a quarter before the hit, at most half
    for the hit itself, a quarter after. The flag says a line was cut at that bound.
    """
    quarter = max_chars // 4
    end = min(end, start + 2 * quarter)
    floor, ceiling = max(0, start - quarter), min(len(text), end + quarter)
    begin, clipped = start, False
    for _ in range(lines + 1):
        newline = text.rfind("\n", floor, begin)
        if newline == -1:
            begin, clipped = floor, floor > 0
            break
        begin = newline
    else:
        begin += 1  # just after the newline that ends the line before the window
    stop, search_from = end, end
    for _ in range(lines + 1):
        newline = text.find("\n", search_from, ceiling)
        if newline == -1:
            stop, clipped = ceiling, clipped or ceiling < len(text)
            break
        stop, search_from = newline, newline + 1
    return begin, stop, clipped


def _utf8_bytes(text: str) -> int:
    # A bundle's text comes from JSON, which can carry a lone surrogate (\ud800): count it, do not crash.
    return len(text.encode("utf-8", "surrogatepass"))


def _git_tracked(root: Path) -> list[str] | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached"],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return sorted({p for p in proc.stdout.decode("utf-8", errors="replace").split("\0") if p})


def _walk(root: Path) -> list[str]:
    found: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            found.append(Path(folder, name).relative_to(root).as_posix())
    return sorted(found)


def _is_binary(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return b"\0" in fh.read(BINARY_SNIFF_BYTES)
    except OSError:
        return True
