"""A pooled connection the server killed: its socket says so at checkout, or its first statement does.

``core.db.make_engine`` pings nothing on checkout (issue 17: a round trip before
every transaction). These tests kill the backend of a worker's pooled connection
with ``pg_terminate_backend``, as a restart or a failover would, and show that
the next operation still succeeds, on a new connection: one killed while idle in
the pool is discarded at checkout (``core.db.discard_dead_on_checkout``: its socket
has the server's goodbye to read), one killed while in use fails its statement and
the work runs once more (``core.db.retrying_once``).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from core import db
from tests.workers.harness import TestWorker, worker_settings
from taskstate import claims

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def one_connection(database_url: str) -> Iterator[Engine]:
    """A worker's engine that keeps exactly one connection, so the next checkout is the one that was killed."""
    engine = db.make_engine(database_url, worker_settings(database_url, database={"pool_size": 1, "max_overflow": 0}))
    yield engine
    engine.dispose()


def backend_pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def terminate(engine: Engine, pid: int) -> None:
    """Kill the backend and wait until the server no longer lists it (an observable event, not a sleep)."""
    with engine.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
        for _ in range(10_000):
            gone = conn.execute(text("SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = :p)"),
                                {"p": pid}).scalar_one()
            if gone:
                return
            conn.rollback()  # a new snapshot of pg_stat_activity
    raise AssertionError(f"backend {pid} is still listed after pg_terminate_backend")


def test_a_connection_killed_while_idle_is_replaced_at_checkout_without_a_failed_statement(
    one_connection: Engine, engine: Engine
) -> None:
    killed = backend_pid(one_connection)
    terminate(engine, killed)
    assert backend_pid(one_connection) != killed  # no error: the dead one never reached a statement


def test_a_connection_killed_in_use_fails_its_statement_and_retrying_once_runs_the_work_on_a_new_one(
    one_connection: Engine, engine: Engine
) -> None:
    failures: list[DBAPIError] = []
    killed: list[int] = []

    def work() -> int:
        with one_connection.connect() as conn:
            pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            if not killed:  # the first time: the server ends it after its checkout, before the next statement
                killed.append(pid)
                terminate(engine, pid)
            try:
                return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            except DBAPIError as exc:
                failures.append(exc)
                raise

    assert db.retrying_once(work) != killed[0]
    assert [failure.connection_invalidated for failure in failures] == [True]


def test_a_worker_whose_connection_was_killed_claims_runs_and_finishes_the_next_job(
    database_url: str, one_connection: Engine, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="core.db")
    with TestWorker(worker_settings(database_url), one_connection) as worker:
        first = "job-" + secrets.token_hex(8)
        assert worker.post(worker.body(first, [])).json()["code"] == "job_finished"
        killed = backend_pid(one_connection)
        terminate(engine, killed)

        second = "job-" + secrets.token_hex(8)
        answer = worker.post(worker.body(second, [{"op": "complete", "text": "after the kill"}]))
        assert answer.status_code == 200, answer.text
        assert answer.json()["code"] == "job_finished"
    with engine.connect() as conn:
        row = claims.get(conn, second)
    assert row is not None and row["state"] == "finished" and row["outcome"] == "completed"
    assert backend_pid(one_connection) != killed
    # Found at its checkout, by its socket: no statement of the claim met it, so nothing had to run again.
    assert not any("connection was dead" in record.getMessage() for record in caplog.records)
