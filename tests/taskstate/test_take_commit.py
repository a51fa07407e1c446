"""The embedded dispatcher's take commits without waiting for its WAL flush; nothing else here does (issue 44).

What the take writes (a delivery lease, an attempt's count, a customer's turn) is what a lost take leaves as it
was: the row comes due again, as at the lease's end, and a repeated delivery is answered from the job's claim. So
its commit skips the flush (``outbox.UNFLUSHED_COMMIT``: ``set_config(..., true)``, until the transaction ends).
These tests read the setting inside the take's transaction and after it, on the same connection: the mechanism,
with no timing.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, text

from taskstate import outbox
from tests.taskstate.test_fair_order import Queue, jobs  # noqa: F401  (the fixture)


def _commit_mode(conn: Connection) -> str:
    return conn.execute(text("SHOW synchronous_commit")).scalar_one()


def _waiting_for_flush(conn: Connection) -> None:
    """The session's commits wait for their flush, whatever the test server's own setting (tests/embedded_pg.py
    turns it off for speed)."""
    conn.execute(text("SET synchronous_commit = on"))
    conn.commit()


def test_a_take_that_takes_a_row_commits_without_waiting_for_its_flush_and_only_that_transaction(
        jobs: Queue, engine: Engine) -> None:  # noqa: F811
    jobs.queue("A")
    with engine.connect() as conn:
        _waiting_for_flush(conn)
        before = _commit_mode(conn)
        conn.commit()
        [row] = outbox.take(conn, limit=1, lease_s=600, me="tests", order=jobs.order)
        inside = _commit_mode(conn)
        conn.commit()
        after = _commit_mode(conn)
        conn.commit()
    assert row.specialist_id == jobs.specialist
    assert (before, inside, after) == ("on", "off", "on")


def test_a_take_that_takes_nothing_leaves_the_commit_as_the_database_says(jobs: Queue, engine: Engine) -> None:  # noqa: F811
    with engine.connect() as conn:
        _waiting_for_flush(conn)
        assert outbox.take(conn, limit=1, lease_s=600, me="tests", order=jobs.order) == []
        assert _commit_mode(conn) == "on"
        conn.rollback()


def test_the_relays_lock_commits_as_the_database_says(jobs: Queue, engine: Engine) -> None:  # noqa: F811
    # The relay marks rows sent after Cloud Tasks accepted them, in the lock's transaction: that commit waits.
    jobs.queue("A")
    with engine.connect() as conn:
        _waiting_for_flush(conn)
        [row] = outbox.lock_due(conn, limit=1, max_in_flight=100, order=jobs.order)
        assert row.specialist_id == jobs.specialist
        assert _commit_mode(conn) == "on"
        conn.rollback()
