"""A job's COMMIT and the wake-up after it in one round trip on its own connection
(``taskstate.notify.commit_then_notify``): the wake-up still runs after the commit, in a transaction of its own."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from taskstate.notify import PUSH, TASK_EVENTS, commit_then_notify, libpq_url
from tests.pg_wire import StatementCounter

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def listening(database_url):
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute(f"LISTEN {TASK_EVENTS}")
        conn.execute(f"LISTEN {PUSH}")
        yield conn


@pytest.fixture
def counted(database_url):
    """An engine whose connections go through a statement counter, and the counter."""
    counter = StatementCounter(database_url)
    engine = create_engine(counter.url)
    try:
        yield engine, counter
    finally:
        engine.dispose()
        counter.close()


def _received(conn: psycopg.Connection, count: int) -> list[tuple[str, str]]:
    """The next ``count`` notifications, in the order they came (at most 10 s for each batch)."""
    found: list[tuple[str, str]] = []
    while len(found) < count:
        batch = [(n.channel, n.payload) for n in conn.notifies(timeout=10, stop_after=count - len(found))]
        assert batch, f"no notification within 10 s after {found}"
        found += batch
    return found


def _table(engine) -> str:
    name = f"commit_wake_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {name} (id text PRIMARY KEY)"))
    return name


def test_the_commit_and_the_wake_up_after_it_take_one_round_trip_and_the_woken_reader_sees_the_commit(
        counted, listening, engine):
    counting, counter = counted
    table, task_id = _table(engine), str(uuid.uuid4())
    with counting.begin() as conn:
        conn.execute(text(f"INSERT INTO {table} VALUES (:t)"), {"t": task_id})
        statements, trips, _, _ = counter.snapshot()
        assert commit_then_notify(conn, task_id, push=True)
        after, trips_after, _, texts = counter.snapshot()
    assert counter.snapshot()[:2] == (after, trips_after)  # SQLAlchemy's commit sent nothing more
    assert (after - statements, trips_after - trips) == (2, 1)  # COMMIT and the wake-up, one round trip
    assert set(_received(listening, 2)) == {(TASK_EVENTS, task_id), (PUSH, "")}
    with listening.cursor() as cursor:  # woken: what the transaction wrote is there to read
        assert cursor.execute(f"SELECT count(*) FROM {table} WHERE id = %s", [task_id]).fetchone() == (1,)


def test_a_commit_that_fails_raises_and_wakes_no_one(listening, engine):
    table, task_id = _table(engine), str(uuid.uuid4())
    with engine.begin() as conn:  # a constraint checked at the commit: the COMMIT itself fails
        conn.execute(text(f"ALTER TABLE {table} ADD COLUMN k int, "
                          f"ADD CONSTRAINT {table}_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED"))
    with pytest.raises(DBAPIError), engine.begin() as conn:
        conn.execute(text(f"INSERT INTO {table} VALUES ('a', 1), ('b', 1)"))
        commit_then_notify(conn, task_id)
    with engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() == 0
        conn.execute(text("SELECT pg_notify(:c, 'marker')"), {"c": TASK_EVENTS})
        conn.commit()
    assert _received(listening, 1)[0] == (TASK_EVENTS, "marker")  # in commit order: none came before it


def test_a_wake_up_that_fails_after_its_commit_leaves_the_commit_and_raises_nothing(listening, engine):
    table, too_long = _table(engine), "x" * 9000  # NOTIFY refuses a payload of 8000 bytes or more
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO {table} VALUES ('kept')"))
        assert commit_then_notify(conn, too_long)
    with engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() == 1
        conn.execute(text("INSERT INTO " + table + " VALUES ('next')"))  # the connection serves again
        conn.commit()
