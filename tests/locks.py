"""Waiting, in a test, for one session to block on a lock another holds: the observable event a race test needs
before it lets the holder go (never a sleep that hopes the other session got there)."""

from __future__ import annotations

import time

from sqlalchemy import Engine, text

# How long a session may take to reach the lock on a loaded machine: a deadline for "never", not a promised bound.
BLOCKED_TIMEOUT_S = 30.0
_POLL_S = 0.01


def wait_until_blocked_by(engine: Engine, pid: int, what: str, timeout_s: float = BLOCKED_TIMEOUT_S) -> None:
    """Until some session waits for a lock the backend ``pid`` holds; ``what`` names the wait in the failure."""
    wait_until_waited(engine, pid, 0.0, what, timeout_s)


def wait_until_waited(engine: Engine, pid: int, seconds: float, what: str,
                      timeout_s: float = BLOCKED_TIMEOUT_S) -> None:
    """Until a session blocked by the backend ``pid`` has been waiting for ``seconds`` by the database's clock (its
    statement's start against ``clock_timestamp()``, the clock the product compares a wait with). Polled: the
    database announces no lock wait; each look is a fresh snapshot of ``pg_stat_activity``."""
    deadline = time.monotonic() + timeout_s
    with engine.connect() as probe:
        while not probe.execute(text("SELECT EXISTS (SELECT 1 FROM pg_stat_activity "
                                     "WHERE :p = ANY (pg_blocking_pids(pid)) "
                                     "AND clock_timestamp() - query_start >= make_interval(secs => :s))"),
                                {"p": pid, "s": seconds}).scalar_one():
            probe.rollback()
            if time.monotonic() >= deadline:
                raise AssertionError(f"{what} within {timeout_s:g} s")
            time.sleep(_POLL_S)
