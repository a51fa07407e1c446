"""The durable record of delegations and of each root family's credit allowance (SQLite, WAL).

A delegation is admitted in one ``BEGIN IMMEDIATE`` transaction *before* its
message is sent: idempotency by (root, request_id), the peer's task and
concurrency limits, the family's delegation cap, and for a paid peer the
credit draw (credits held by the family + this tariff <= the root's
allowance). Threads and processes sharing the file therefore never admit more
than the limits allow. The allowance is stored once per root: a child or a
restart reopening it with another figure is refused, never refilled.

A row in state ``sending`` whose owning process is gone becomes ``unknown``:
the message may have reached the peer, so it is never resent automatically.
Credentials are never stored: only the *name* of the peer's key variable.

A paid delegation's hold is settled in the transaction that records its
finished state, once: ``update(..., charge_reported=...)`` applies
``rlmfamily.a2a.charge.settle`` only to a row whose charge is still ``held``,
so a second poll, a second process or a resumed run never settles it again.
What the family has drawn is the sum of ``credits_held``: a settled row holds
its charge, the rest is back in the allowance.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from rlmfamily.a2a.charge import CHARGE_STATES, settle
from rlmfamily.a2a.errors import (
    A2AError,
    CreditAllowanceExhausted,
    CreditAllowanceMismatch,
    DelegationLimitReached,
    DelegationNotFound,
)
from rlmfamily.budget import _owner, _owner_alive  # the same live-owner test the inference budget uses
from rlmfamily.sqlite_file import SQLiteFile

STATES = ("sending", "submitted", "working", "input_required", "auth_required", "completed", "failed",
          "canceled", "rejected", "unknown")
OPEN_STATES = ("sending", "submitted", "working", "input_required", "auth_required", "unknown")
TERMINAL_STATES = ("completed", "failed", "canceled", "rejected")
# The charge's columns, added to files written before the charge came back (``ADDED_COLUMNS``).
CHARGE_COLUMNS = (
    ("charge_state", "TEXT NOT NULL DEFAULT 'held' CHECK (charge_state IN "
                     f"({', '.join(repr(s) for s in CHARGE_STATES)}))"),
    ("credits_charged", "INTEGER CHECK (credits_charged IS NULL OR credits_charged >= 0)"),
    ("charge_note", "TEXT NOT NULL DEFAULT ''"),
)

_CHARGE_COLUMNS_DDL = ",\n    ".join(f"{name} {definition}" for name, definition in CHARGE_COLUMNS)
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS credit_allowances (
    root_id          TEXT PRIMARY KEY,
    credits_allowed  INTEGER NOT NULL CHECK (credits_allowed >= 0),
    created_at       REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS delegations (
    id               TEXT PRIMARY KEY,
    root_id          TEXT NOT NULL,
    agent_id         TEXT NOT NULL,
    request_id       TEXT NOT NULL,
    fingerprint      TEXT NOT NULL,
    peer_alias       TEXT NOT NULL,
    peer_origin      TEXT NOT NULL,
    interface_url    TEXT NOT NULL,
    protocol_binding TEXT NOT NULL,
    protocol_version TEXT NOT NULL,
    credential_env   TEXT,
    message_id       TEXT NOT NULL UNIQUE,
    task_preview     TEXT NOT NULL,
    request_bytes    INTEGER NOT NULL CHECK (request_bytes >= 0),
    required         INTEGER NOT NULL CHECK (required IN (0, 1)),
    follow_up_of     TEXT REFERENCES delegations(id),
    remote_context_id TEXT,
    remote_task_id   TEXT,
    direct_reply     INTEGER NOT NULL DEFAULT 0 CHECK (direct_reply IN (0, 1)),
    state            TEXT NOT NULL CHECK (state IN ({", ".join(repr(s) for s in STATES)})),
    credits_held     INTEGER NOT NULL DEFAULT 0 CHECK (credits_held >= 0),
    credit_ceiling   INTEGER CHECK (credit_ceiling IS NULL OR credit_ceiling >= 0),
    max_result_bytes INTEGER NOT NULL,
    deadline_at      REAL NOT NULL,
    owner            TEXT NOT NULL,
    status_text      TEXT NOT NULL DEFAULT '',
    result_text      TEXT NOT NULL DEFAULT '',
    references_json  TEXT NOT NULL DEFAULT '[]',
    error_code       TEXT,
    error_message    TEXT,
    cancel_outcome   TEXT,
    reconcile_reason TEXT,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    {_CHARGE_COLUMNS_DDL},
    UNIQUE (root_id, request_id),
    -- a direct Message reply has no task id, and nobody invents one
    CHECK (direct_reply = 0 OR remote_task_id IS NULL),
    -- a settled hold holds its charge, which is never more than the ceiling stated to the peer
    CHECK (charge_state != 'settled' OR (credits_charged = credits_held AND credits_charged <= credit_ceiling)),
    CHECK (charge_state != 'free' OR credits_held = 0)
);
CREATE INDEX IF NOT EXISTS delegations_by_root ON delegations (root_id, peer_alias, state);
CREATE TABLE IF NOT EXISTS delegation_events (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    delegation_id  TEXT NOT NULL REFERENCES delegations(id),
    at             REAL NOT NULL,
    kind           TEXT NOT NULL,
    detail         TEXT NOT NULL DEFAULT ''
);
"""


@dataclass(frozen=True)
class Delegation:
    """One row of ``delegations``."""

    id: str
    root_id: str
    agent_id: str
    request_id: str
    fingerprint: str
    peer_alias: str
    peer_origin: str
    interface_url: str
    protocol_binding: str
    protocol_version: str
    credential_env: str | None
    message_id: str
    task_preview: str
    request_bytes: int
    required: bool
    follow_up_of: str | None
    remote_context_id: str | None
    remote_task_id: str | None
    direct_reply: bool
    state: str
    credits_held: int
    credit_ceiling: int | None
    max_result_bytes: int
    deadline_at: float
    owner: str
    status_text: str
    result_text: str
    references_json: str
    error_code: str | None
    error_message: str | None
    cancel_outcome: str | None
    reconcile_reason: str | None
    created_at: float
    updated_at: float
    charge_state: str = "free"  # rlmfamily.a2a.charge: free, held, settled, unknown, released
    credits_charged: int | None = None  # what the peer reported, once settled
    charge_note: str = ""  # how the charge was settled, or why it is unknown

    @property
    def references(self) -> list[dict[str, Any]]:
        return list(json.loads(self.references_json or "[]"))

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Admission:
    """What the admission transaction checks, beside the row itself."""

    max_tasks_for_peer: int
    max_concurrent_for_peer: int
    max_delegations_for_root: int
    credits_allowed: int | None  # None: a free peer draws nothing
    tariff_credits: int


_COLUMNS = [f.name for f in fields(Delegation)]
MAX_EVENT_DETAIL_CHARS = 2000  # of an event's detail kept in delegation_events


def _row(row: sqlite3.Row) -> Delegation:
    data = dict(row)
    data["required"] = bool(data["required"])
    data["direct_reply"] = bool(data["direct_reply"])
    return Delegation(**data)


class DelegationStore(SQLiteFile):
    """The SQLite file that holds every root family's delegations (what ``rlm delegations`` reads)."""

    SCHEMA = SCHEMA
    FOREIGN_KEYS = True
    ADDED_COLUMNS = {"delegations": CHARGE_COLUMNS}

    def _backfill(self, conn: sqlite3.Connection, table: str, added: list[str]) -> None:
        if "charge_state" in added:
            # Rows from before the charge came back: a free peer's, a released hold, or a hold still drawn (a
            # finished one is settled at its next poll).
            conn.execute("UPDATE delegations SET charge_state = CASE WHEN credit_ceiling IS NULL THEN 'free' "
                         "WHEN credits_held = 0 THEN 'released' ELSE 'held' END")

    # ---------- reads ----------

    def get(self, delegation_id: str) -> Delegation:
        self._expire_dead_senders()
        with self.reading() as conn:
            row = conn.execute("SELECT * FROM delegations WHERE id = ?", (delegation_id,)).fetchone()
        if row is None:
            raise DelegationNotFound(f"no delegation {delegation_id!r}; a2a.tasks() or `rlm delegations` lists them")
        return _row(row)

    def find(self, root_id: str, request_id: str) -> Delegation | None:
        with self.reading() as conn:
            row = conn.execute("SELECT * FROM delegations WHERE root_id = ? AND request_id = ?",
                               (root_id, request_id)).fetchone()
        return _row(row) if row else None

    def list(self, root_id: str | None = None) -> list[Delegation]:
        self._expire_dead_senders()
        with self.reading() as conn:
            if root_id is None:
                rows = conn.execute("SELECT * FROM delegations ORDER BY created_at, id").fetchall()
            else:
                rows = conn.execute("SELECT * FROM delegations WHERE root_id = ? ORDER BY created_at, id",
                                    (root_id,)).fetchall()
        return [_row(r) for r in rows]

    def roots(self) -> list[str]:
        with self.reading() as conn:
            return [r[0] for r in conn.execute(
                "SELECT root_id FROM delegations GROUP BY root_id ORDER BY MIN(created_at)")]

    def events(self, delegation_id: str) -> list[dict[str, Any]]:
        with self.reading() as conn:
            return [dict(r) for r in conn.execute(
                "SELECT at, kind, detail FROM delegation_events WHERE delegation_id = ? ORDER BY id", (delegation_id,))]

    def credits(self, root_id: str) -> dict[str, int | None]:
        """The root's allowance and what its family has drawn from it (holds, and settled charges)."""
        with self.reading() as conn:
            allowed = conn.execute("SELECT credits_allowed FROM credit_allowances WHERE root_id = ?",
                                   (root_id,)).fetchone()
            held = conn.execute("SELECT COALESCE(SUM(credits_held), 0) FROM delegations WHERE root_id = ?",
                                (root_id,)).fetchone()[0]
        return {"credits_allowed": allowed[0] if allowed else None, "credits_held": int(held)}

    # ---------- admission ----------

    def open_allowance(self, conn: sqlite3.Connection, root_id: str, credits_allowed: int) -> int:
        row = conn.execute("SELECT credits_allowed FROM credit_allowances WHERE root_id = ?", (root_id,)).fetchone()
        if row is None:
            conn.execute("INSERT INTO credit_allowances (root_id, credits_allowed, created_at) VALUES (?, ?, ?)",
                         (root_id, credits_allowed, time.time()))
            return credits_allowed
        if row[0] != credits_allowed:
            # A child or a restart reopening the family must never get a fresh or larger allowance.
            raise CreditAllowanceMismatch(
                f"root {root_id} already has a credit allowance of {row[0]}; it was reopened with "
                f"{credits_allowed}. An allowance is never refilled: reopen with RLM_A2A_CREDIT_ALLOWANCE={row[0]} "
                "or start a new root run", setting="a2a_credit_allowance")
        return int(row[0])

    def admit(self, row: Delegation, admission: Admission) -> tuple[Delegation, bool]:
        """Insert ``row`` in state ``sending`` if every limit allows it.

        Returns ``(delegation, created)``; ``created`` is False when the same (root, request_id) already
        exists (the caller compares fingerprints).
        """
        with self.transaction() as conn:
            existing = conn.execute("SELECT * FROM delegations WHERE root_id = ? AND request_id = ?",
                                    (row.root_id, row.request_id)).fetchone()
            if existing is not None:
                return _row(existing), False
            total = conn.execute("SELECT COUNT(*) FROM delegations WHERE root_id = ?", (row.root_id,)).fetchone()[0]
            if total >= admission.max_delegations_for_root:
                raise DelegationLimitReached(
                    f"this root family has made {total} delegations, the most allowed (RLM_A2A_MAX_DELEGATIONS)",
                    setting="a2a_max_delegations")
            to_peer = conn.execute("SELECT COUNT(*) FROM delegations WHERE root_id = ? AND peer_alias = ?",
                                   (row.root_id, row.peer_alias)).fetchone()[0]
            if to_peer >= admission.max_tasks_for_peer:
                raise DelegationLimitReached(
                    f"this root family has sent {to_peer} tasks to peer {row.peer_alias!r}, its max_tasks "
                    "(peers file)", setting="a2a_peers_file")
            open_count = conn.execute(
                f"SELECT COUNT(*) FROM delegations WHERE root_id = ? AND peer_alias = ? AND state IN "
                f"({', '.join('?' * len(OPEN_STATES))})", (row.root_id, row.peer_alias, *OPEN_STATES)).fetchone()[0]
            if open_count >= admission.max_concurrent_for_peer:
                raise DelegationLimitReached(
                    f"{open_count} delegations to peer {row.peer_alias!r} are still open, its max_concurrent "
                    "(peers file); wait for one, cancel one, or reconcile an unknown one", setting="a2a_peers_file")
            if admission.credits_allowed is not None:
                allowed = self.open_allowance(conn, row.root_id, admission.credits_allowed)
                held = conn.execute("SELECT COALESCE(SUM(credits_held), 0) FROM delegations WHERE root_id = ?",
                                    (row.root_id,)).fetchone()[0]
                if held + admission.tariff_credits > allowed:
                    raise CreditAllowanceExhausted(
                        f"peer {row.peer_alias!r} costs {admission.tariff_credits} credits; this root family has "
                        f"drawn {held} of its {allowed} (RLM_A2A_CREDIT_ALLOWANCE, set when the root started; "
                        "never refilled)", setting="a2a_credit_allowance")
            conn.execute(f"INSERT INTO delegations ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                         [getattr(row, c) for c in _COLUMNS])
            self._event(conn, row.id, "admitted", f"credits_held={row.credits_held}")
            created = conn.execute("SELECT * FROM delegations WHERE id = ?", (row.id,)).fetchone()
            return _row(created), True

    # ---------- updates ----------

    def update(self, delegation_id: str, *, event: str, detail: str = "", only_if_state: tuple[str, ...] | None = None,
               charge_reported: Any = None, **values: Any) -> Delegation:
        """Set columns and append an event in one transaction (``only_if_state`` guards a transition).

        When the row ends up finished with its charge still ``held``, the hold is settled in the same
        transaction from ``charge_reported`` (what the peer's finished task said at ``CHARGE_METADATA_KEY``;
        None: nothing), once: a row already settled or unknown is left as it is.
        """
        bad = set(values) - set(_COLUMNS)
        if bad:
            raise A2AError(f"unknown delegation columns: {sorted(bad)} (a bug in the caller: the columns are {_COLUMNS})")
        with self.transaction() as conn:
            row = conn.execute("SELECT * FROM delegations WHERE id = ?", (delegation_id,)).fetchone()
            if row is None:
                raise DelegationNotFound(f"no delegation {delegation_id!r}")
            if only_if_state is None or row["state"] in only_if_state:
                values["updated_at"] = time.time()
                assignments = ", ".join(f"{k} = ?" for k in values)
                conn.execute(f"UPDATE delegations SET {assignments} WHERE id = ?", (*values.values(), delegation_id))
                self._event(conn, delegation_id, event, detail)
                self._settle_if_finished(conn, delegation_id, charge_reported)
            return _row(conn.execute("SELECT * FROM delegations WHERE id = ?", (delegation_id,)).fetchone())

    def _settle_if_finished(self, conn: sqlite3.Connection, delegation_id: str, reported: Any) -> None:
        row = conn.execute("SELECT state, charge_state, credits_held FROM delegations WHERE id = ?",
                           (delegation_id,)).fetchone()
        if row["charge_state"] != "held" or row["state"] not in TERMINAL_STATES:
            return
        outcome = settle(int(row["credits_held"]), reported)
        conn.execute("UPDATE delegations SET charge_state = ?, credits_held = ?, credits_charged = ?, charge_note = ? "
                     "WHERE id = ? AND charge_state = 'held'",
                     (outcome.charge_state, outcome.credits_held, outcome.credits_charged, outcome.note, delegation_id))
        self._event(conn, delegation_id, f"charge_{outcome.charge_state}", outcome.note)

    def add_event(self, delegation_id: str, kind: str, detail: str = "") -> None:
        with self.transaction() as conn:
            self._event(conn, delegation_id, kind, detail)

    @staticmethod
    def _event(conn: sqlite3.Connection, delegation_id: str, kind: str, detail: str) -> None:
        conn.execute("INSERT INTO delegation_events (delegation_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                     (delegation_id, time.time(), kind, detail[:MAX_EVENT_DETAIL_CHARS]))

    def _expire_dead_senders(self) -> None:
        with self.reading() as conn:
            rows = conn.execute("SELECT id, owner FROM delegations WHERE state = 'sending'").fetchall()
        for row in rows:
            if not _owner_alive(row["owner"]):
                self.update(row["id"], event="unknown",
                            detail="the process ended while the message was being sent; it is not resent",
                            only_if_state=("sending",), state="unknown", error_code="sender_died",
                            error_message="the process that sent this delegation ended before the peer's answer "
                                          "was recorded; reconcile it with `rlm reconcile`")


def owner() -> str:
    return _owner()
