"""The embedded dispatcher's statements of every job, its take and its delivered mark, on the driver (issue 44)."""

from __future__ import annotations

from sqlalchemy import Engine

from tests.statements import Statements
from tests.taskstate.test_fair_order import Queue


def test_the_dispatchers_take_and_delivered_mark_skip_sqlalchemys_execution_and_take_the_same_rows(
    engine: Engine,
) -> None:
    """Every round's take and every job's delivered mark run on the connection's driver (``core.db.hot_rows``),
    not through SQLAlchemy's execution (its context and result metadata, a fifth to a third of a statement's CPU);
    while a hook watches the statements they go through SQLAlchemy and it sees them. The rows are taken either way."""
    queue = Queue(engine)

    def took_and_delivered() -> list[str]:
        queue.queue("A", 2)
        queue.queue("B", 1)
        rows = queue.take(3)
        for row in rows:
            queue.finish(row)
        return [queue.letter(row) for row in rows]

    try:
        with Statements(engine) as statements:
            unwatched = took_and_delivered()
            assert not [sql for sql in statements.executed if "UPDATE dispatch_outbox" in sql]
            with statements.watching():
                watched = took_and_delivered()
    finally:
        queue.close_all()
    assert sorted(unwatched) == sorted(watched) == ["A", "A", "B"]
    assert sum("SET attempts = o.attempts + 1" in sql for sql in statements.seen) == 1  # the take, seen by the hook
    assert sum("SET status = 'done'" in sql for sql in statements.seen) == 3  # each delivered mark
