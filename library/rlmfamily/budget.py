"""One durable inference allowance per root family: calls, tokens and USD, in SQLite (WAL).

Every model call (root turn or sub-call) is admitted first: one ``BEGIN
IMMEDIATE`` transaction checks the allowance and records a reservation, so
threads and processes sharing the file never admit more than the limits allow.
The call then resolves its entry exactly once:

- ``settled``: the provider reported usage (a cost of NULL means the model has
  no price: unknown USD);
- ``failed``: the provider refused before doing any work (nothing billed);
- ``unknown``: nobody can know what it cost (timeout, broken connection, no
  usage in the answer, or the process died while the call was in flight).

Unknown usage is never counted as zero. For admission an unknown entry counts
at the estimate it was admitted with (the request's characters / 4 plus the
completion it may return); in the books it stays ``unknown`` until an operator
reconciles it with the real figures and an audit reason (``rlm usage``). An
unknown entry admitted without an estimate blocks a token limit, and unknown
USD blocks a USD limit, until reconciled.

The call kept for a run's final answer is admitted with ``final=True``: the
other calls leave ``keep_calls`` calls and ``keep_tokens`` tokens unused for it,
and it is refused only by the calls limit, so a spent, underestimated or unknown
allowance never keeps a run from asking for its answer. It is the one call that
may take a family past ``max_tokens`` or ``max_usd`` (when earlier calls cost
more than estimated, or the final request is larger than the reserve).
Each live member of a family keeps its own final call: a member opens its
``Budget`` with its run id and a row in ``kept_finals`` holds one call and its
token reserve until the member asks for its answer, ends, or its process dies.
Every other call leaves what all the other live members keep as well, so a child
that spends the family's calls down cannot take the root's last call (a parent
keeps a child's row from the moment it starts the child's process; the child's
process takes it over).
The allowance is keyed by root id, so reopening it after a restart keeps the count.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlmfamily.errors import (
    BudgetExhausted,
    BudgetLimitsMismatch,
    BudgetUnknownUsage,
    ReconcileRefused,
    UsageEntryNotFound,
)
from rlmfamily.providers.base import Usage
from rlmfamily.sqlite_file import SQLiteFile


SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    root_id     TEXT PRIMARY KEY,
    max_calls   INTEGER CHECK (max_calls IS NULL OR max_calls >= 0),
    max_tokens  INTEGER CHECK (max_tokens IS NULL OR max_tokens >= 0),
    max_usd     REAL    CHECK (max_usd IS NULL OR max_usd >= 0),
    created_at  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS usage (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    root_id           TEXT NOT NULL REFERENCES budgets(root_id),
    purpose           TEXT NOT NULL,
    state             TEXT NOT NULL CHECK (state IN ('reserved', 'settled', 'failed', 'unknown', 'reconciled')),
    tokens_estimate   INTEGER NOT NULL DEFAULT 0 CHECK (tokens_estimate >= 0),
    prompt_tokens     INTEGER CHECK (prompt_tokens IS NULL OR prompt_tokens >= 0),
    completion_tokens INTEGER CHECK (completion_tokens IS NULL OR completion_tokens >= 0),
    tokens            INTEGER CHECK (tokens IS NULL OR tokens >= 0),
    cost_usd          REAL CHECK (cost_usd IS NULL OR cost_usd >= 0),
    owner             TEXT NOT NULL,
    admitted_at       REAL NOT NULL,
    resolved_at       REAL,
    note              TEXT,
    reason            TEXT,
    -- a resolved entry knows its tokens unless it is 'unknown'
    CHECK (state IN ('reserved', 'unknown') OR tokens IS NOT NULL)
);
CREATE INDEX IF NOT EXISTS usage_by_root ON usage (root_id, state);
-- The final call each live family member keeps (one call, and its token reserve), until it is used.
CREATE TABLE IF NOT EXISTS kept_finals (
    root_id  TEXT NOT NULL REFERENCES budgets(root_id),
    member   TEXT NOT NULL,  -- the member's run id
    tokens   INTEGER NOT NULL CHECK (tokens >= 0),
    owner    TEXT NOT NULL,  -- the process that keeps it: a dead owner's row is dropped
    PRIMARY KEY (root_id, member)
);
"""


@dataclass(frozen=True)
class BudgetLimits:
    max_calls: int | None = None
    max_tokens: int | None = None
    max_usd: float | None = None


@dataclass(frozen=True)
class UsageEntry:
    id: int
    root_id: str
    purpose: str
    state: str
    prompt_tokens: int | None
    completion_tokens: int | None
    tokens: int | None
    cost_usd: float | None
    admitted_at: float
    resolved_at: float | None
    note: str | None
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BudgetSnapshot:
    root_id: str
    limits: BudgetLimits
    calls: int  # admitted calls, whatever their outcome
    in_flight: int
    tokens: int  # known tokens (unknown entries excluded, and listed in unknown_tokens)
    usd: float  # known USD
    unknown_tokens: int  # entries whose tokens nobody knows
    unknown_usd: int  # entries whose cost nobody knows
    unknown_tokens_estimate: int = 0  # what admission counts the unknown entries at (their admission estimates)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["limits"] = asdict(self.limits)
        return data


def _process_start(pid: int) -> str:
    # The start time tells a live owner from a recycled pid (Linux); elsewhere the pid alone is used.
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except (OSError, IndexError):
        return ""


_HOST = socket.gethostname()
MAX_NOTE_CHARS = 500  # of the note kept on a failed or unknown usage entry
FINAL_PURPOSE = "root_final"  # the purpose of a run's final-answer request, admitted with final=True


def _owner() -> str:
    pid = os.getpid()
    return f"{_HOST}:{pid}:{_process_start(pid)}"


def _owner_alive(owner: str) -> bool:
    host, _, rest = owner.partition(":")
    pid_text, _, start = rest.partition(":")
    if host != _HOST:
        return True  # another machine's call: only its own process may resolve it
    try:
        pid = int(pid_text)
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        pass
    return _process_start(pid) == start


class BudgetLedger(SQLiteFile):
    """The SQLite file that holds every root's allowance (what ``rlm usage`` reads)."""

    SCHEMA = SCHEMA
    # What a call may cost at list prices, counted against max_usd while it is in flight (files made before it
    # have NULL there: nothing to count).
    ADDED_COLUMNS = {"usage": (("usd_estimate", "REAL CHECK (usd_estimate IS NULL OR usd_estimate >= 0)"),)}

    def roots(self) -> list[str]:
        with self.reading() as conn:
            return [r["root_id"] for r in conn.execute("SELECT root_id FROM budgets ORDER BY created_at")]

    def entries(self, root_id: str | None = None, *, unresolved_only: bool = False) -> list[UsageEntry]:
        """Usage entries, oldest first.

        ``unresolved_only``: entries whose tokens are unknown, and those whose cost is unknown
        under a USD limit (without one, an unpriced model's cost is unknown but blocks nothing).
        """
        self._expire_dead_reservations(root_id)
        sql = "SELECT u.* FROM usage u JOIN budgets b ON b.root_id = u.root_id WHERE 1=1"
        args: list[Any] = []
        if root_id is not None:
            sql += " AND u.root_id = ?"
            args.append(root_id)
        if unresolved_only:
            sql += (" AND (u.state = 'unknown' OR (u.state IN ('settled', 'reconciled') AND u.cost_usd IS NULL"
                    " AND b.max_usd IS NOT NULL))")
        with self.reading() as conn:
            return [_entry(r) for r in conn.execute(sql + " ORDER BY u.id", args)]

    def raise_usd_limit(self, root_id: str, max_usd: float) -> float | None:
        """Raise a root's USD limit to ``max_usd``, an operator's explicit choice (``rlm eval run`` with a higher
        ``--max-usd`` on the same results folder); returns the limit it had. Never lowers it, nor lifts it."""
        with self.transaction() as conn:
            row = conn.execute("SELECT max_usd FROM budgets WHERE root_id = ?", (root_id,)).fetchone()
            if row is None:
                raise UsageEntryNotFound(f"no inference budget for run {root_id!r}; `rlm usage` lists them")
            before = row["max_usd"]
            if before is None or max_usd < before:
                raise BudgetLimitsMismatch(
                    f"the USD limit of {root_id} is {'none' if before is None else f'{before:g}'}; it can only be "
                    f"raised, not set to {max_usd:g}", setting="max_usd")
            conn.execute("UPDATE budgets SET max_usd = ? WHERE root_id = ?", (max_usd, root_id))
        return float(before)

    def blocking(self, root_id: str) -> list[UsageEntry]:
        """The entries whose unknown usage refuses every call but the final answer under the root's limits (as
        ``_refusal`` counts them): unknown tokens with no estimate under a token limit, unknown cost under a USD one."""
        self._expire_dead_reservations(root_id)
        with self.reading() as conn:
            rows = conn.execute(
                "SELECT u.* FROM usage u JOIN budgets b ON b.root_id = u.root_id WHERE u.root_id = ? AND ("
                "(b.max_tokens IS NOT NULL AND u.state = 'unknown' AND u.tokens_estimate = 0) OR "
                "(b.max_usd IS NOT NULL AND u.state != 'reserved' AND u.cost_usd IS NULL)) ORDER BY u.id",
                (root_id,)).fetchall()
        return [_entry(r) for r in rows]

    def reconcile(self, entry_id: int, *, tokens: int, usd: float | None, reason: str) -> UsageEntry:
        """Record the real usage of an entry whose usage was unknown, with an audit reason."""
        if not reason or not reason.strip():
            raise ReconcileRefused("reconciling usage needs a reason (who checked what, where)")
        if tokens < 0 or (usd is not None and usd < 0):
            raise ReconcileRefused("reconciled tokens and USD cannot be negative")
        with self.transaction() as conn:
            row = conn.execute("SELECT * FROM usage WHERE id = ?", (entry_id,)).fetchone()
            if row is None:
                raise UsageEntryNotFound(f"no usage entry {entry_id}; `rlm usage` lists them")
            if row["state"] == "reserved" and _owner_alive(row["owner"]):
                raise ReconcileRefused(f"usage entry {entry_id} is still in flight; reconcile it once it ends")
            unknown_cost = row["state"] in ("settled", "reconciled") and row["cost_usd"] is None
            if row["state"] not in ("reserved", "unknown") and not unknown_cost:
                raise ReconcileRefused(
                    f"usage entry {entry_id} is {row['state']} with known usage; only unknown usage is reconciled"
                )
            cost = usd if usd is not None else row["cost_usd"]
            conn.execute(
                "UPDATE usage SET state = 'reconciled', tokens = ?, cost_usd = ?, resolved_at = ?, reason = ? "
                "WHERE id = ?",
                (tokens, cost, time.time(), reason.strip(), entry_id),
            )
            return _entry(conn.execute("SELECT * FROM usage WHERE id = ?", (entry_id,)).fetchone())

    def entries_admitted_by(self, root_id: str, pid: int, pid_start: str | None) -> list[int]:
        """Ids of the entries that the process ``pid`` (started at ``pid_start``) of this host admitted for
        ``root_id``: what a resumed run's earlier process used (its children's processes are others)."""
        with self.reading() as conn:
            rows = conn.execute("SELECT id FROM usage WHERE root_id = ? AND owner = ? ORDER BY id",
                                (root_id, f"{_HOST}:{pid}:{pid_start or ''}")).fetchall()
        return [int(r["id"]) for r in rows]

    def limits(self, root_id: str) -> BudgetLimits:
        with self.reading() as conn:
            row = conn.execute("SELECT * FROM budgets WHERE root_id = ?", (root_id,)).fetchone()
        if row is None:
            raise UsageEntryNotFound(f"no inference budget for run {root_id!r}; `rlm usage` lists them")
        return BudgetLimits(row["max_calls"], row["max_tokens"], row["max_usd"])

    def snapshot(self, root_id: str) -> BudgetSnapshot:
        limits = self.limits(root_id)
        self._expire_dead_reservations(root_id)
        with self.reading() as conn:
            t = _totals(conn, root_id)
        return BudgetSnapshot(root_id, limits, t.calls, t.in_flight, t.tokens, t.usd, t.unknown_tokens,
                              t.unknown_usd, t.unknown_tokens_estimate)

    def keep_final(self, root_id: str, member: str, tokens: int) -> None:
        """Keep one call (and ``tokens``) for ``member``'s final answer; this process keeps it until it is
        used, released, or taken over by the member's own process (which calls this again)."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO kept_finals (root_id, member, tokens, owner) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (root_id, member) DO UPDATE SET owner = excluded.owner, tokens = excluded.tokens",
                (root_id, member, max(0, int(tokens)), _owner()),
            )

    def release_final(self, root_id: str, member: str) -> None:
        """``member`` no longer needs its kept call (it ended, or never started)."""
        with self.transaction() as conn:
            conn.execute("DELETE FROM kept_finals WHERE root_id = ? AND member = ?", (root_id, member))

    def kept_calls(self, root_id: str) -> int:
        """How many calls the family's live members keep for their final answers."""
        self._expire_dead_reservations(root_id)
        with self.reading() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM kept_finals WHERE root_id = ?", (root_id,)).fetchone()[0])

    def overshoot(self, root_id: str) -> dict[str, dict[str, Any]]:
        """The limits the family went past, by axis ("tokens", "usd"): used, limit, how far over, and whether the
        final-answer requests took it there (the rest of the family's known usage is within the limit)."""
        limits = self.limits(root_id)
        with self.reading() as conn:
            row = conn.execute(
                "SELECT COALESCE(SUM(tokens), 0) AS tokens, COALESCE(SUM(cost_usd), 0) AS usd, "
                f"COALESCE(SUM(CASE WHEN purpose = '{FINAL_PURPOSE}' THEN 0 ELSE tokens END), 0) AS tokens_before, "
                f"COALESCE(SUM(CASE WHEN purpose = '{FINAL_PURPOSE}' THEN 0 ELSE cost_usd END), 0) AS usd_before "
                "FROM usage WHERE root_id = ?",
                (root_id,),
            ).fetchone()
        over: dict[str, dict[str, Any]] = {}
        for axis, limit in (("tokens", limits.max_tokens), ("usd", limits.max_usd)):
            used = row[axis]
            if limit is not None and used > limit:
                over[axis] = {"used": used, "limit": limit, "over": used - limit,
                              "by_final_answer": row[f"{axis}_before"] <= limit}
        return over

    def _expire_dead_reservations(self, root_id: str | None) -> None:
        with self.reading() as conn:
            sql = "SELECT id, owner FROM usage WHERE state = 'reserved'"
            rows = conn.execute(sql + (" AND root_id = ?" if root_id else ""), (root_id,) if root_id else ()).fetchall()
            kept_sql = "SELECT root_id, member, owner FROM kept_finals"
            kept = conn.execute(kept_sql + (" WHERE root_id = ?" if root_id else ""),
                                (root_id,) if root_id else ()).fetchall()
        dead = [r["id"] for r in rows if not _owner_alive(r["owner"])]
        dead_kept = [(r["root_id"], r["member"], r["owner"]) for r in kept if not _owner_alive(r["owner"])]
        if dead_kept:
            with self.transaction() as tx:  # the owner that might still have asked is gone
                tx.executemany("DELETE FROM kept_finals WHERE root_id = ? AND member = ? AND owner = ?", dead_kept)
        if not dead:
            return
        with self.transaction() as tx:
            tx.executemany(
                "UPDATE usage SET state = 'unknown', resolved_at = ?, "
                "note = 'the process ended while the call was in flight' WHERE id = ? AND state = 'reserved'",
                [(time.time(), i) for i in dead],
            )


class Budget:
    """The allowance of one root family. Root turns and sub-calls all draw on it."""

    def __init__(self, ledger: BudgetLedger | str | Path, root_id: str, limits: BudgetLimits, *,
                 member: str | None = None, final_reserve_tokens: int = 0) -> None:
        """``member``: the run id of the family member that draws on the allowance; it keeps one call
        and ``final_reserve_tokens`` for its final answer until ``admit(final=True)`` or ``release()``."""
        self.ledger = ledger if isinstance(ledger, BudgetLedger) else BudgetLedger(ledger)
        self.root_id = root_id
        self.member = member
        self.entry_ids: list[int] = []  # the calls this holder admitted (one run of the family)
        with self.ledger.transaction() as conn:
            row = conn.execute("SELECT * FROM budgets WHERE root_id = ?", (root_id,)).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO budgets (root_id, max_calls, max_tokens, max_usd, created_at) VALUES (?, ?, ?, ?, ?)",
                    (root_id, limits.max_calls, limits.max_tokens, limits.max_usd, time.time()),
                )
            else:
                stored = BudgetLimits(row["max_calls"], row["max_tokens"], row["max_usd"])
                if stored != limits:
                    # Reopening must never hand out a fresh or larger allowance by accident.
                    raise BudgetLimitsMismatch(
                        f"root {root_id} already has the allowance {stored}; it was reopened with {limits}. "
                        "Reopen it with the same max_calls/max_tokens/max_usd",
                        setting="max_calls",
                    )
        self.limits = limits
        if member is not None:
            self.ledger.keep_final(root_id, member, final_reserve_tokens)

    def release(self) -> None:
        """This member's run ended: the call it kept for its final answer goes back to the family."""
        if self.member is not None:
            self.ledger.release_final(self.root_id, self.member)

    # ---------- admission ----------

    def admit(self, purpose: str, *, tokens_estimate: int = 0, keep_calls: int = 0, keep_tokens: int = 0,
              final: bool = False, usd_estimate: float | None = None) -> int:
        """Admit one call and return its usage entry id, or raise BudgetExhausted / BudgetUnknownUsage.

        ``tokens_estimate``: what the call may use (its request's characters / 4 plus its completion); it
        counts while the call is in flight, and afterwards if its usage stays unknown.
        ``keep_calls`` / ``keep_tokens``: left unused for the final answer (the session keeps 1 call and
        RLM_FINAL_RESERVE_TOKENS). ``final``: the kept call itself, refused only by the calls limit.
        ``usd_estimate``: what the call may cost at list prices (``None``: no price); the calls in flight
        count at their estimates against max_usd, so calls admitted together cannot all spend what one
        could (a batch of sub-calls admitted before any answer came back went past the cap).
        What the family's other live members keep for their final answers is left unused as well.
        """
        self.ledger._expire_dead_reservations(self.root_id)
        estimate = max(0, int(tokens_estimate))
        with self.ledger.transaction() as conn:
            others = conn.execute(
                "SELECT COUNT(*) AS calls, COALESCE(SUM(tokens), 0) AS tokens FROM kept_finals "
                "WHERE root_id = ? AND member IS NOT ?", (self.root_id, self.member),
            ).fetchone()
            refusal = _refusal(self.limits, _totals(conn, self.root_id), estimate, keep_calls + int(others["calls"]),
                               keep_tokens + int(others["tokens"]), final)
            if refusal is not None:
                raise refusal
            if final and self.member is not None:
                conn.execute("DELETE FROM kept_finals WHERE root_id = ? AND member = ?", (self.root_id, self.member))
            cursor = conn.execute(
                "INSERT INTO usage (root_id, purpose, state, tokens_estimate, usd_estimate, owner, admitted_at) "
                "VALUES (?, ?, 'reserved', ?, ?, ?, ?)",
                (self.root_id, purpose, estimate, None if usd_estimate is None else max(0.0, float(usd_estimate)),
                 _owner(), time.time()),
            )
            entry_id = int(cursor.lastrowid or 0)
        self.entry_ids.append(entry_id)
        return entry_id

    # ---------- resolution (each entry once; a late answer may still settle an unknown one) ----------

    def settle(self, entry_id: int, usage: Usage | None) -> None:
        """Record what the provider reported. ``None`` or missing token counts make the entry unknown."""
        if usage is None or usage.total_tokens is None:
            self.mark_unknown(entry_id, "the provider did not report usage")
            return
        with self.ledger.transaction() as conn:
            conn.execute(
                "UPDATE usage SET state = 'settled', prompt_tokens = ?, completion_tokens = ?, tokens = ?, "
                "cost_usd = ?, resolved_at = ?, note = CASE WHEN state = 'unknown' THEN 'settled by a late answer' "
                "ELSE note END WHERE id = ? AND root_id = ? AND state IN ('reserved', 'unknown')",
                (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens, usage.cost_usd, time.time(),
                 entry_id, self.root_id),
            )

    def fail(self, entry_id: int, note: str) -> None:
        """The provider refused before doing any work: the call counts, its usage is a known zero.

        A refusal that arrives after the caller gave up (entry already unknown) still resolves it.
        """
        with self.ledger.transaction() as conn:
            conn.execute(
                "UPDATE usage SET state = 'failed', prompt_tokens = 0, completion_tokens = 0, tokens = 0, "
                "cost_usd = 0, resolved_at = ?, note = ? WHERE id = ? AND root_id = ? AND state IN ('reserved', 'unknown')",
                (time.time(), note[:MAX_NOTE_CHARS], entry_id, self.root_id),
            )

    def mark_unknown(self, entry_id: int, note: str) -> None:
        with self.ledger.transaction() as conn:
            conn.execute(
                "UPDATE usage SET state = 'unknown', resolved_at = ?, note = ? "
                "WHERE id = ? AND root_id = ? AND state = 'reserved'",
                (time.time(), note[:MAX_NOTE_CHARS], entry_id, self.root_id),
            )

    # ---------- reading ----------

    def snapshot(self) -> BudgetSnapshot:
        return self.ledger.snapshot(self.root_id)

    def own_usage(self) -> dict[str, Any]:
        """What this holder's own calls used (a family member's share of the root's allowance)."""
        with self.ledger.reading() as conn:
            row = conn.execute(
                "SELECT COUNT(*) AS calls, COALESCE(SUM(tokens), 0) AS tokens, COALESCE(SUM(cost_usd), 0) AS usd, "
                "COALESCE(SUM(state = 'unknown'), 0) AS unknown_tokens, "
                "COALESCE(SUM(state != 'reserved' AND cost_usd IS NULL), 0) AS unknown_usd FROM usage "
                "WHERE root_id = ? AND id IN (SELECT value FROM json_each(?))",
                (self.root_id, json.dumps(self.entry_ids)),
            ).fetchone()
        return {"calls": int(row["calls"]), "tokens": int(row["tokens"]), "usd": float(row["usd"]),
                "unknown_tokens": int(row["unknown_tokens"]), "unknown_usd": int(row["unknown_usd"])}


@dataclass(frozen=True)
class _Totals:
    calls: int  # admitted, whatever their outcome
    in_flight: int
    in_flight_tokens: int  # the estimates of the calls in flight
    tokens: int  # known tokens
    usd: float  # known USD
    unknown_tokens: int  # entries whose tokens nobody knows
    unknown_tokens_estimate: int  # their admission estimates
    unknown_unestimated: int  # unknown entries admitted without an estimate: nothing to count them at
    unknown_usd: int  # entries whose cost nobody knows
    in_flight_usd: float = 0.0  # the USD estimates of the calls in flight (those admitted with one)

    @property
    def counted_tokens(self) -> int:
        """What admission counts against max_tokens: known usage, plus estimates where usage is not known yet."""
        return self.tokens + self.in_flight_tokens + self.unknown_tokens_estimate


def _totals(conn: sqlite3.Connection, root_id: str) -> _Totals:
    row = conn.execute(
        """
        SELECT COUNT(*) AS calls,
               COALESCE(SUM(state = 'reserved'), 0) AS in_flight,
               COALESCE(SUM(CASE WHEN state = 'reserved' THEN tokens_estimate END), 0) AS in_flight_tokens,
               COALESCE(SUM(tokens), 0) AS tokens,
               COALESCE(SUM(cost_usd), 0) AS usd,
               COALESCE(SUM(state = 'unknown'), 0) AS unknown_tokens,
               COALESCE(SUM(CASE WHEN state = 'unknown' THEN tokens_estimate END), 0) AS unknown_tokens_estimate,
               COALESCE(SUM(state = 'unknown' AND tokens_estimate = 0), 0) AS unknown_unestimated,
               COALESCE(SUM(state != 'reserved' AND cost_usd IS NULL), 0) AS unknown_usd,
               COALESCE(SUM(CASE WHEN state = 'reserved' THEN usd_estimate END), 0) AS in_flight_usd
        FROM usage WHERE root_id = ?
        """,
        (root_id,),
    ).fetchone()
    return _Totals(int(row["calls"]), int(row["in_flight"]), int(row["in_flight_tokens"]), int(row["tokens"]),
                   float(row["usd"]), int(row["unknown_tokens"]), int(row["unknown_tokens_estimate"]),
                   int(row["unknown_unestimated"]), int(row["unknown_usd"]), float(row["in_flight_usd"]))


def usage_text(usage: dict[str, Any]) -> str:
    """Calls, tokens and USD as ``rlm show`` and the page say them (a run_finished ``usage`` or ``budget``): usage
    no provider reported reads "unknown", as in ``rlm usage``, never 0."""
    calls = int(usage.get("calls") or 0)
    tokens = _with_unknown(f"{usage.get('tokens') or 0:,} tokens", "tokens unknown",
                           int(usage.get("unknown_tokens") or 0), calls)
    usd = _with_unknown(f"${usage.get('usd') or 0:.4f}", "USD unknown", int(usage.get("unknown_usd") or 0), calls)
    return f"{calls} calls, {tokens}, {usd}"


def _with_unknown(known: str, unknown: str, unknown_calls: int, calls: int) -> str:
    if not unknown_calls:
        return known
    if unknown_calls >= calls:
        return unknown
    return f"{known} (+{unknown_calls} call{'s' if unknown_calls != 1 else ''} unknown)"


def _refusal(limits: BudgetLimits, t: _Totals, estimate: int, keep_calls: int, keep_tokens: int,
             final: bool) -> BudgetExhausted | BudgetUnknownUsage | None:
    """Why this call may not be admitted, or None. The final-answer call is refused by the calls limit only."""
    if limits.max_calls is not None and t.calls + keep_calls >= limits.max_calls:
        return BudgetExhausted(
            f"the inference allowance of {limits.max_calls} calls is used up ({t.calls} admitted"
            + (f", {keep_calls} kept for final answers" if keep_calls else "")
            + "); raise --max-calls / RLM_MAX_CALLS for a new run",
            setting="max_calls",
        )
    if final:
        return None
    if limits.max_tokens is not None and t.unknown_unestimated:
        return BudgetUnknownUsage(
            f"{t.unknown_unestimated} earlier call(s) have unknown token usage and no estimate, and a token limit "
            "is set; reconcile them (`rlm usage --reconcile ID --tokens N --reason ...`) before more calls",
            setting="max_tokens",
        )
    if limits.max_usd is not None and t.unknown_usd:
        return BudgetUnknownUsage(
            f"{t.unknown_usd} earlier call(s) have unknown cost and a USD limit is set; "
            "reconcile them (`rlm usage --reconcile ID --tokens N --usd X --reason ...`) before more calls",
            setting="max_usd",
        )
    if limits.max_tokens is not None and t.counted_tokens + estimate + keep_tokens > limits.max_tokens:
        return BudgetExhausted(
            f"the allowance of {limits.max_tokens:,} tokens is used up ({t.tokens:,} used, "
            f"{t.in_flight_tokens:,} in flight, {t.unknown_tokens_estimate:,} estimated for "
            f"{t.unknown_tokens} call(s) of unknown usage; this call may use {estimate:,}"
            + (f", {keep_tokens:,} are kept for final answers (RLM_FINAL_RESERVE_TOKENS each)" if keep_tokens else "")
            + "); raise --max-tokens / RLM_MAX_TOKENS for a new run",
            setting="max_tokens",
        )
    if limits.max_usd is not None and t.usd + t.in_flight_usd >= limits.max_usd:
        return BudgetExhausted(
            f"the allowance of ${limits.max_usd:.4f} is used up (${t.usd:.4f} spent"
            + (f", up to ${t.in_flight_usd:.4f} in flight" if t.in_flight_usd else "")
            + "); raise --max-usd / RLM_MAX_USD for a new run",
            setting="max_usd",
        )
    return None


def _entry(row: sqlite3.Row) -> UsageEntry:
    return UsageEntry(
        id=row["id"], root_id=row["root_id"], purpose=row["purpose"], state=row["state"],
        prompt_tokens=row["prompt_tokens"], completion_tokens=row["completion_tokens"], tokens=row["tokens"],
        cost_usd=row["cost_usd"], admitted_at=row["admitted_at"], resolved_at=row["resolved_at"],
        note=row["note"], reason=row["reason"],
    )
