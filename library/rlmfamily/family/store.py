"""The durable records of families: who is in a family, every child run, and family messages.

One SQLite file (``family.sqlite3``, WAL) beside the budget and the history,
shared by the root's process and every child process. Writes that check before
they change (admission, a run's end, delivery) run in one ``BEGIN IMMEDIATE``
transaction, so concurrent processes never both pass a check.

- ``families``: one row per root run, with the spec a child process needs to
  rebuild its session (settings, kernel, model, context, provider).
- ``agents``: the root (depth 0) and every child agent, with its parent; routing
  and depth follow these links.
- ``runs``: one row per piece of child work (the first run of an agent, or a
  follow-up), with the process that admitted it (``owner_pid``, its start
  time: it spawns the run next), the run's process identity (pid, its start
  time, a random token) and, once it ends, the result. A terminal row is never
  changed again.
- ``messages``: family messages, unique per (family, sender, delivery id).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlmfamily.family import procs
from rlmfamily.sqlite_file import SQLiteFile


ACTIVE_STATES = ("admitted", "running")
TERMINAL_STATES = ("completed", "failed", "cancelled", "interrupted")

SCHEMA = """
CREATE TABLE IF NOT EXISTS families (
    root_id     TEXT PRIMARY KEY,
    spec        TEXT,
    created_at  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS agents (
    agent_id    TEXT PRIMARY KEY,
    root_id     TEXT NOT NULL REFERENCES families(root_id),
    parent_id   TEXT REFERENCES agents(agent_id),
    depth       INTEGER NOT NULL CHECK (depth >= 0),
    filters     TEXT NOT NULL DEFAULT '[]',
    created_at  REAL NOT NULL,
    CHECK ((parent_id IS NULL) = (depth = 0))
);
CREATE INDEX IF NOT EXISTS agents_by_parent ON agents (root_id, parent_id);
CREATE TABLE IF NOT EXISTS runs (
    run_id       TEXT PRIMARY KEY,
    agent_id     TEXT NOT NULL REFERENCES agents(agent_id),
    root_id      TEXT NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('run', 'follow_up')),
    follows      TEXT REFERENCES runs(run_id),
    prompt       TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('admitted', 'running', 'completed', 'failed', 'cancelled',
                                                'interrupted')),
    token        TEXT NOT NULL,
    owner_pid    INTEGER,
    owner_start  TEXT,
    pid          INTEGER,
    pid_start    TEXT,
    kernel_pid   INTEGER,
    kernel_start TEXT,
    answer       TEXT,
    stop_reason  TEXT,
    error        TEXT,
    result       TEXT,
    note         TEXT,
    admitted_at  REAL NOT NULL,
    started_at   REAL,
    finished_at  REAL,
    CHECK (state IN ('admitted', 'running') OR finished_at IS NOT NULL)
);
CREATE INDEX IF NOT EXISTS runs_by_root ON runs (root_id, state);
CREATE INDEX IF NOT EXISTS runs_by_agent ON runs (agent_id, admitted_at);
CREATE TABLE IF NOT EXISTS messages (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    root_id      TEXT NOT NULL,
    sender       TEXT NOT NULL,
    recipient    TEXT NOT NULL,
    delivery_id  TEXT NOT NULL,
    body         TEXT NOT NULL,
    created_at   REAL NOT NULL,
    acked_at     REAL,
    UNIQUE (root_id, sender, delivery_id)
);
CREATE INDEX IF NOT EXISTS messages_by_recipient ON messages (root_id, recipient, acked_at, id);
"""
# Columns added after the first release: a file written before them gets them when it is opened.
ADDED_COLUMNS = {"runs": (("owner_pid", "INTEGER"), ("owner_start", "TEXT"))}


@dataclass(frozen=True)
class Agent:
    agent_id: str
    root_id: str
    parent_id: str | None
    depth: int
    filters: list[list[str]]


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    agent_id: str
    root_id: str
    kind: str  # run | follow_up
    follows: str | None
    prompt: str
    state: str  # admitted | running | completed | failed | cancelled | interrupted
    token: str
    owner_pid: int | None  # the process that admitted the run and spawns it
    owner_start: str | None
    pid: int | None
    pid_start: str | None
    kernel_pid: int | None
    kernel_start: str | None
    answer: str | None
    stop_reason: str | None
    error: str | None
    result: dict[str, Any] | None
    note: str | None
    admitted_at: float
    started_at: float | None
    finished_at: float | None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("token")  # proves identity; nobody else needs it
        return data


def _agent(row: sqlite3.Row) -> Agent:
    return Agent(row["agent_id"], row["root_id"], row["parent_id"], row["depth"], json.loads(row["filters"]))


def _run(row: sqlite3.Row) -> RunRecord:
    data = dict(row)
    data["result"] = json.loads(data["result"]) if data["result"] else None
    return RunRecord(**data)


class FamilyStore(SQLiteFile):
    """The SQLite file of every family under one data dir."""

    SCHEMA = SCHEMA
    ADDED_COLUMNS = ADDED_COLUMNS

    # ---------- families and agents ----------

    def ensure_root(self, root_id: str) -> None:
        """Register a root run as a family of one (idempotent)."""
        with self.transaction() as conn:
            now = time.time()
            conn.execute("INSERT OR IGNORE INTO families (root_id, spec, created_at) VALUES (?, NULL, ?)",
                         (root_id, now))
            conn.execute(
                "INSERT OR IGNORE INTO agents (agent_id, root_id, parent_id, depth, filters, created_at) "
                "VALUES (?, ?, NULL, 0, '[]', ?)",
                (root_id, root_id, now),
            )

    def family_exists(self, root_id: str) -> bool:
        with self.reading() as conn:
            return conn.execute("SELECT 1 FROM families WHERE root_id = ?", (root_id,)).fetchone() is not None

    def spec(self, root_id: str) -> dict[str, Any] | None:
        with self.reading() as conn:
            row = conn.execute("SELECT spec FROM families WHERE root_id = ?", (root_id,)).fetchone()
        return json.loads(row["spec"]) if row is not None and row["spec"] else None

    def set_spec(self, root_id: str, spec: dict[str, Any]) -> None:
        with self.transaction() as conn:
            conn.execute("UPDATE families SET spec = ? WHERE root_id = ?", (json.dumps(spec), root_id))

    def agent(self, agent_id: str) -> Agent | None:
        with self.reading() as conn:
            row = conn.execute("SELECT * FROM agents WHERE agent_id = ?", (agent_id,)).fetchone()
        return _agent(row) if row is not None else None

    def agents(self, root_id: str) -> list[Agent]:
        with self.reading() as conn:
            rows = conn.execute("SELECT * FROM agents WHERE root_id = ? ORDER BY depth, created_at, agent_id",
                                (root_id,)).fetchall()
        return [_agent(r) for r in rows]

    @staticmethod
    def insert_agent(conn: sqlite3.Connection, agent: Agent) -> None:
        conn.execute(
            "INSERT INTO agents (agent_id, root_id, parent_id, depth, filters, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (agent.agent_id, agent.root_id, agent.parent_id, agent.depth, json.dumps(agent.filters), time.time()),
        )

    # ---------- runs ----------

    @staticmethod
    def insert_run(conn: sqlite3.Connection, *, run_id: str, agent_id: str, root_id: str, kind: str,
                   follows: str | None, prompt: str, token: str) -> None:
        """An admitted run, owned by this process until it records the run's process (``set_spawned``)."""
        owner = os.getpid()
        conn.execute(
            "INSERT INTO runs (run_id, agent_id, root_id, kind, follows, prompt, state, token, owner_pid, "
            "owner_start, admitted_at) VALUES (?, ?, ?, ?, ?, ?, 'admitted', ?, ?, ?, ?)",
            (run_id, agent_id, root_id, kind, follows, prompt, token, owner, procs.start_time(owner), time.time()),
        )

    def run(self, run_id: str) -> RunRecord | None:
        with self.reading() as conn:
            row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return _run(row) if row is not None else None

    def runs(self, root_id: str, *, agent_id: str | None = None, parent_id: str | None = None,
             active_only: bool = False) -> list[RunRecord]:
        sql = "SELECT r.* FROM runs r JOIN agents a ON a.agent_id = r.agent_id WHERE r.root_id = ?"
        args: list[Any] = [root_id]
        if agent_id is not None:
            sql += " AND r.agent_id = ?"
            args.append(agent_id)
        if parent_id is not None:
            sql += " AND a.parent_id = ?"
            args.append(parent_id)
        if active_only:
            sql += " AND r.state IN ('admitted', 'running')"
        with self.reading() as conn:
            return [_run(r) for r in conn.execute(sql + " ORDER BY r.admitted_at, r.run_id", args)]

    def set_spawned(self, run_id: str, pid: int, pid_start: str | None) -> None:
        with self.transaction() as conn:
            conn.execute("UPDATE runs SET pid = ?, pid_start = ? WHERE run_id = ? AND state = 'admitted'",
                         (pid, pid_start, run_id))

    def confirm_start(self, run_id: str, token: str, pid: int, pid_start: str | None) -> bool:
        """The child process's own proof that it runs: only the holder of the run's token can write it."""
        with self.transaction() as conn:
            cursor = conn.execute(
                "UPDATE runs SET state = 'running', pid = ?, pid_start = ?, started_at = ? "
                "WHERE run_id = ? AND token = ? AND state = 'admitted'",
                (pid, pid_start, time.time(), run_id, token),
            )
            return cursor.rowcount == 1

    def set_kernel(self, run_id: str, pid: int | None, start: str | None) -> None:
        with self.transaction() as conn:
            conn.execute("UPDATE runs SET kernel_pid = ?, kernel_start = ? WHERE run_id = ?", (pid, start, run_id))

    def finish(self, run_id: str, state: str, *, answer: str | None = None, stop_reason: str | None = None,
               error: str | None = None, result: dict[str, Any] | None = None, note: str | None = None) -> bool:
        """Move an active run to a terminal state; False if it had already ended (the first end wins)."""
        assert state in TERMINAL_STATES, state
        with self.transaction() as conn:
            cursor = conn.execute(
                "UPDATE runs SET state = ?, answer = ?, stop_reason = ?, error = ?, result = ?, note = ?, "
                "finished_at = ? WHERE run_id = ? AND state IN ('admitted', 'running')",
                (state, answer, stop_reason, error, json.dumps(result, default=str) if result is not None else None,
                 note, time.time(), run_id),
            )
            return cursor.rowcount == 1


def family_root(family_path: Path, run_id: str) -> str:
    """The root of the family ``run_id`` belongs to: its own id for a root, or a run outside any family."""
    if family_path.is_file():
        member = FamilyStore(family_path).run(run_id)
        if member is not None:
            return member.root_id
    return run_id
