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



def test_a_sweep_reads_in_autocommit_and_ends_no_transaction(database_url: str) -> None:
    """A sweep with nothing to record sends its reads alone, counted on the wire: no BEGIN, no ROLLBACK. A ROLLBACK
    would also make psycopg forget every statement it prepared on that pooled connection, the take of every round
    among them, and send DEALLOCATE ALL at the connection's next use."""
    from core import db
    from core.settings import Settings
    from taskstate.updates import TaskEvents
    from tests.pg_wire import StatementCounter
    from workers.dispatch.sweeper import LeaseSweeper
    from workers.settlement import TaskSettlement

    counter = StatementCounter(database_url)
    engine = db.make_engine(counter.url, Settings(database={"url": counter.url}))
    try:
        sweeper = LeaseSweeper(engine, TaskSettlement(TaskEvents(engine), operator="tests"), dead_after_s=10,
                               abandoned_after_s=3600)
        sweeper.sweep()  # the pool's first connection, and its start-up questions, before the count
        before = counter.snapshot()[2]
        assert sweeper.sweep() == [] and sweeper.give_up_abandoned() == []
        kinds = counter.snapshot()[2] - before
    finally:
        engine.dispose()
        counter.close()
    assert kinds == {"SELECT": 3}, kinds
