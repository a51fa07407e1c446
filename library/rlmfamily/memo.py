"""Memoised sub-calls: within one family, a sub-call asked again is answered from the durable record, not paid again.

A family (a root run, its children and their follow-ups) shares one root id. A
sub-call with the same root id, the same model, the same messages sent (system
and user, SHA-256 of their canonical JSON) and the same context (SHA-256 of the
context text) as one already answered gets that answer back: no budget call,
no tokens, no provider round trip. The record lives in ``memo.sqlite3`` in the
data dir, shared by the family's processes (WAL, one ``BEGIN IMMEDIATE`` per
write), and keeps at most ``max_memoised_subcalls`` answers per family, the
least recently used going first.

Only complete answers are kept: not errors, not timeouts, not answers cut at
``max_response_chars``. Two identical calls in flight at the same moment are
both paid (the first answer to land is kept); the memo saves repeats, it does
not coalesce. Hits are counted per run (``memo_hits``), so ``rlm usage`` and
``rlm show`` can say what was answered without being paid.

The memo is an optimisation: when its file cannot be used, a sub-call is paid
as usual rather than failed.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmfamily.errors import SettingsInvalid, StoreUnavailable
from rlmfamily.settings import RLMSettings
from rlmfamily.sqlite_file import SQLiteFile

SCHEMA = """
CREATE TABLE IF NOT EXISTS memo (
    root_id          TEXT NOT NULL,
    model            TEXT NOT NULL,
    messages_sha256  TEXT NOT NULL,
    context_sha256   TEXT NOT NULL,
    response         TEXT NOT NULL,
    answered_model   TEXT,
    usage            TEXT,              -- the paid call's usage (JSON), returned again with the answer
    tokens           INTEGER CHECK (tokens IS NULL OR tokens >= 0),  -- what a hit does not spend; NULL: unknown
    cost_usd         REAL CHECK (cost_usd IS NULL OR cost_usd >= 0),
    paid_by_run      TEXT NOT NULL,
    budget_entry     INTEGER,
    used_seq         INTEGER NOT NULL,  -- per family, raised on every store and hit: the eviction order
    created_at       REAL NOT NULL,
    PRIMARY KEY (root_id, model, messages_sha256, context_sha256)
);
CREATE INDEX IF NOT EXISTS memo_by_use ON memo (root_id, used_seq);
CREATE TABLE IF NOT EXISTS memo_hits (
    root_id      TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    hits         INTEGER NOT NULL CHECK (hits >= 0),
    tokens_saved INTEGER NOT NULL CHECK (tokens_saved >= 0),  -- known tokens of the answers served
    usd_saved    REAL NOT NULL CHECK (usd_saved >= 0),
    PRIMARY KEY (root_id, run_id)
);
"""


@dataclass(frozen=True)
class MemoKey:
    """What makes two sub-calls of one family the same call."""

    model: str
    messages_sha256: str
    context_sha256: str

    @classmethod
    def of(cls, model: str | None, messages: list[dict[str, Any]], context_text: str) -> MemoKey:
        canonical = json.dumps(messages, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return cls(model or "", _sha256(canonical), _sha256(context_text))


@dataclass(frozen=True)
class MemoHit:
    """A stored answer, and who paid for it."""

    response: str
    model: str | None
    usage: dict[str, Any] | None
    paid_by_run: str
    budget_entry: int | None


@dataclass(frozen=True)
class MemoUsage:
    """What one family's memo served: hits and the known tokens and USD they did not spend, per run."""

    hits: int
    tokens_saved: int
    usd_saved: float
    by_run: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"hits": self.hits, "tokens_saved": self.tokens_saved, "usd_saved": self.usd_saved,
                "by_run": self.by_run}


class MemoFile(SQLiteFile):
    """``memo.sqlite3``: every family's memoised answers and hit counts."""

    SCHEMA = SCHEMA

    def usage(self, root_id: str) -> MemoUsage:
        with self.reading() as conn:
            rows = conn.execute(
                "SELECT run_id, hits, tokens_saved, usd_saved FROM memo_hits WHERE root_id = ? ORDER BY run_id",
                (root_id,),
            ).fetchall()
        by_run = {r["run_id"]: {"hits": r["hits"], "tokens_saved": r["tokens_saved"], "usd_saved": r["usd_saved"]}
                  for r in rows}
        return MemoUsage(sum(r["hits"] for r in rows), sum(r["tokens_saved"] for r in rows),
                         sum(r["usd_saved"] for r in rows), by_run)

    def entries(self, root_id: str) -> int:
        with self.reading() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM memo WHERE root_id = ?", (root_id,)).fetchone()[0])


class SubcallMemo:
    """One run's use of its family's memo: look up before paying, store after a complete answer."""

    def __init__(self, file: MemoFile, *, root_id: str, run_id: str, max_entries: int) -> None:
        if max_entries < 1:
            raise SettingsInvalid("max_memoised_subcalls must be at least 1 (RLM_MAX_MEMOISED_SUBCALLS)",
                                  setting="max_memoised_subcalls")
        self.file = file
        self.root_id = root_id
        self.run_id = run_id
        self.max_entries = max_entries

    def lookup(self, key: MemoKey) -> MemoHit | None:
        """The stored answer for ``key``, counted as a hit of this run; None when there is none (or no usable file)."""
        try:
            with self.file.transaction() as conn:
                row = conn.execute(
                    "SELECT * FROM memo WHERE root_id = ? AND model = ? AND messages_sha256 = ? AND context_sha256 = ?",
                    (self.root_id, key.model, key.messages_sha256, key.context_sha256),
                ).fetchone()
                if row is None:
                    return None
                conn.execute(
                    "UPDATE memo SET used_seq = ? WHERE root_id = ? AND model = ? AND messages_sha256 = ? "
                    "AND context_sha256 = ?",
                    (_next_seq(conn, self.root_id), self.root_id, key.model, key.messages_sha256, key.context_sha256),
                )
                conn.execute(
                    "INSERT INTO memo_hits (root_id, run_id, hits, tokens_saved, usd_saved) VALUES (?, ?, 1, ?, ?) "
                    "ON CONFLICT (root_id, run_id) DO UPDATE SET hits = hits + 1, "
                    "tokens_saved = tokens_saved + excluded.tokens_saved, usd_saved = usd_saved + excluded.usd_saved",
                    (self.root_id, self.run_id, row["tokens"] or 0, row["cost_usd"] or 0.0),
                )
        except StoreUnavailable:
            return None
        return MemoHit(response=row["response"], model=row["answered_model"],
                       usage=json.loads(row["usage"]) if row["usage"] else None,
                       paid_by_run=row["paid_by_run"], budget_entry=row["budget_entry"])

    def store(self, key: MemoKey, *, response: str, model: str | None, usage: dict[str, Any] | None,
              budget_entry: int | None) -> bool:
        """Keep a complete answer (the first one for a key stays), then drop the family's least recently used
        answers beyond ``max_entries``. False when the file cannot be used: the answer is simply not kept."""
        usage = usage or {}
        try:
            with self.file.transaction() as conn:
                conn.execute(
                    "INSERT OR IGNORE INTO memo (root_id, model, messages_sha256, context_sha256, response, "
                    "answered_model, usage, tokens, cost_usd, paid_by_run, budget_entry, used_seq, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (self.root_id, key.model, key.messages_sha256, key.context_sha256, response, model,
                     json.dumps(usage) if usage else None, usage.get("total_tokens"), usage.get("cost_usd"),
                     self.run_id, budget_entry, _next_seq(conn, self.root_id), time.time()),
                )
                conn.execute(
                    "DELETE FROM memo WHERE root_id = ? AND used_seq <= (SELECT used_seq FROM memo WHERE root_id = ? "
                    "ORDER BY used_seq DESC LIMIT 1 OFFSET ?)",
                    (self.root_id, self.root_id, self.max_entries),
                )
        except StoreUnavailable:
            return False
        return True


def open_memo(settings: RLMSettings, *, root_id: str, run_id: str) -> SubcallMemo | None:
    """The memo of a run of the family ``root_id``, or None when memoisation is off (RLM_MEMOISE_SUBCALLS)."""
    if not settings.memoise_subcalls:
        return None
    try:
        file = MemoFile(settings.memo_path)
    except StoreUnavailable:
        return None  # the run goes on without a memo: every sub-call is paid, as with memoisation off
    return SubcallMemo(file, root_id=root_id, run_id=run_id, max_entries=settings.max_memoised_subcalls)


def memo_usage(path: Path, root_id: str) -> MemoUsage:
    """What the memo served family ``root_id`` (nothing, when no run ever used a memo)."""
    if not path.is_file():
        return MemoUsage(0, 0, 0.0, {})
    return MemoFile(path).usage(root_id)


def _next_seq(conn: Any, root_id: str) -> int:
    row = conn.execute("SELECT COALESCE(MAX(used_seq), 0) + 1 FROM memo WHERE root_id = ?", (root_id,)).fetchone()
    return int(row[0])


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
