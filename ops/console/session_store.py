"""The owner of ``console_sessions`` (migration 0260): which console sessions are live, kept on the server.

A session cookie names a session id; the session is live while its row has no ``ended_at`` and its
``expires_at`` is ahead. Logging out ends it for every copy of the cookie, on every console instance (they
share the database). Expired rows are deleted in bounded batches (``PRUNE_BATCH``) as sessions are opened, so
the table holds about the sessions of one TTL.
"""

from __future__ import annotations

from sqlalchemy import Engine, text

MAX_OPERATOR_CHARS = 200  # migration 0260's CHECK
PRUNE_BATCH = 100  # expired rows deleted at each session opened: more than one login makes

_OPEN = text(
    "INSERT INTO console_sessions (session_id, operator, via, expires_at) "
    "VALUES (:s, :o, :v, now() + make_interval(secs => :ttl))"
)
_PRUNE = text(
    "DELETE FROM console_sessions WHERE session_id IN "
    "(SELECT session_id FROM console_sessions WHERE expires_at < now() ORDER BY expires_at LIMIT :n)"
)
_LIVE = text("SELECT 1 FROM console_sessions WHERE session_id = :s AND ended_at IS NULL AND expires_at > now()")
_END = text("UPDATE console_sessions SET ended_at = now() WHERE session_id = :s AND ended_at IS NULL")


def open_session(engine: Engine, session_id: str, *, operator: str, via: str, ttl_s: int) -> None:
    assert 0 < len(operator) <= MAX_OPERATOR_CHARS and via in ("local", "iap") and ttl_s > 0
    with engine.begin() as conn:
        conn.execute(_PRUNE, {"n": PRUNE_BATCH})
        conn.execute(_OPEN, {"s": session_id, "o": operator, "v": via, "ttl": ttl_s})


def is_live(engine: Engine, session_id: str) -> bool:
    with engine.connect() as conn:
        return conn.execute(_LIVE, {"s": session_id}).first() is not None


def end_session(engine: Engine, session_id: str) -> bool:
    """End the session for every copy of its cookie; False when it had already ended."""
    with engine.begin() as conn:
        return conn.execute(_END, {"s": session_id}).rowcount == 1
