"""Durable, searchable history of a run: every tool output in full, every sub-call's prompt and answer.

What the model was shown is bounded; what is stored here is not (beyond the
kernel's own output cap), so a truncated observation names an entry the model
can read in bounded slices with ``history.read(id, start, size)``. Entries are
scoped to a run (a branch of a family): one run never reads another's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rlmfamily.errors import HistoryEntryNotFound, HistoryQueryTooLong, ReadTooLarge
from rlmfamily.sqlite_file import SQLiteFile

MAX_TITLE_CHARS = 200  # an entry's title is kept to this many characters (the body is kept whole)
SQLITE_MAX_INTEGER = 2**63 - 1  # no id is larger (sqlite3 raises OverflowError past it)
SQLITE_MAX_TEXT_CHARS = 2**31 - 1  # no body is longer: offsets past it are clipped to it (substr would overflow)

SCHEMA = """
CREATE TABLE IF NOT EXISTS history (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    scope      TEXT NOT NULL,
    kind       TEXT NOT NULL,
    turn       INTEGER,
    title      TEXT NOT NULL DEFAULT '',
    body       TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS history_by_scope ON history (scope, id);
"""


class History(SQLiteFile):
    """One run's history, stored in a SQLite file shared by all runs (WAL)."""

    SCHEMA = SCHEMA

    def __init__(self, path: str | Path, scope: str, *, max_read_chars: int = 20_000, max_hits: int = 50,
                 max_query_words: int = 16) -> None:
        super().__init__(path)
        self.scope = scope
        self.max_read_chars = max_read_chars
        self.max_hits = max_hits
        self.max_query_words = max_query_words

    def add(self, kind: str, body: str, *, turn: int | None = None, title: str = "") -> int:
        with self.transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO history (scope, kind, turn, title, body, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (self.scope, kind, turn, title[:MAX_TITLE_CHARS], body, time.time()),
            )
            return int(cursor.lastrowid or 0)

    def read(self, entry_id: int, start: int = 0, size: int | None = None) -> str:
        """Characters [start, start+size) of an entry; at most ``max_read_chars`` (RLM_MAX_HISTORY_READ_CHARS)."""
        size = self.max_read_chars if size is None else int(size)
        if size > self.max_read_chars:
            raise ReadTooLarge(
                f"history.read returns at most {self.max_read_chars:,} characters at once "
                f"(RLM_MAX_HISTORY_READ_CHARS); asked for {size:,}. Read it in slices",
                setting="max_history_read_chars",
            )
        start, entry_id = max(0, int(start)), int(entry_id)
        if not 0 <= entry_id <= SQLITE_MAX_INTEGER:
            raise HistoryEntryNotFound(f"history has no entry {entry_id} in this run; history.search() finds entries")
        start = min(start, SQLITE_MAX_TEXT_CHARS)
        with self.reading() as conn:
            row = conn.execute(
                "SELECT substr(body, ?, ?) AS part FROM history WHERE id = ? AND scope = ?",
                (start + 1, max(0, size), int(entry_id), self.scope),
            ).fetchone()
        if row is None:
            raise HistoryEntryNotFound(f"history has no entry {entry_id} in this run; history.search() finds entries")
        return str(row["part"])

    def entry(self, entry_id: int) -> dict[str, Any]:
        with self.reading() as conn:
            row = conn.execute(
                "SELECT id, kind, turn, title, length(body) AS chars FROM history WHERE id = ? AND scope = ?",
                (int(entry_id), self.scope),
            ).fetchone()
        if row is None:
            raise HistoryEntryNotFound(f"history has no entry {entry_id} in this run")
        return dict(row)

    def search(self, query: str, limit: int = 10) -> list[dict[str, Any]]:
        """Entries containing every word of ``query`` (case-insensitive), newest first, with a snippet."""
        words = [w.lower() for w in str(query).split() if w]
        if not words:
            return []
        # Each word is one scan of every entry's body: bound them (and sqlite's parameter count).
        if len(words) > self.max_query_words:
            raise HistoryQueryTooLong(
                f"history.search takes at most {self.max_query_words} words (RLM_MAX_HISTORY_QUERY_WORDS); "
                f"the query has {len(words)}. Search for the few most specific words",
                setting="max_history_query_words",
            )
        limit = max(1, min(int(limit), self.max_hits))
        where = " AND ".join("instr(lower(body), ?) > 0" for _ in words)
        with self.reading() as conn:
            rows = conn.execute(
                f"SELECT id, kind, turn, title, length(body) AS chars, "
                f"substr(body, max(1, instr(lower(body), ?) - 80), 240) AS snippet "
                f"FROM history WHERE scope = ? AND {where} ORDER BY id DESC LIMIT ?",
                (words[0], self.scope, *words, limit),
            ).fetchall()
        return [dict(r) for r in rows]

    def stats(self) -> dict[str, Any]:
        with self.reading() as conn:
            rows = conn.execute(
                "SELECT kind, COUNT(*) AS n, COALESCE(SUM(length(body)), 0) AS chars FROM history "
                "WHERE scope = ? GROUP BY kind ORDER BY kind",
                (self.scope,),
            ).fetchall()
        return {
            "entries": sum(r["n"] for r in rows),
            "chars": sum(r["chars"] for r in rows),
            "by_kind": {r["kind"]: {"entries": r["n"], "chars": r["chars"]} for r in rows},
        }
