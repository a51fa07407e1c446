"""``workers.beat.WorkerBeat`` (issue 42, issue 44 §4): a worker's beat goes on while the worker's other work holds
every pooled connection, because the dispatchers' sweeper takes a worker whose beat is late for dead; a clean stop
deletes the row. Against the test database."""

from __future__ import annotations

import uuid
from contextlib import ExitStack

from sqlalchemy import text

from core import db
from core.settings import Settings
from tests.rlm.holds import wait_until
from workers.beat import WorkerBeat

POOL_SIZE = 2


def _beat_rows(engine, worker_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM worker_beats WHERE worker_id = :w"), {"w": worker_id}).scalar_one()


def test_a_beat_goes_on_while_every_pooled_connection_is_taken_and_a_clean_stop_deletes_it(database_url, engine):
    # A pool of two and no overflow; the test takes every connection the beat does not hold, as claims, renewals and
    # finishes would on a busy worker.
    small = Settings(database={"url": database_url, "pool_size": POOL_SIZE, "max_overflow": 0})
    pooled = db.make_engine(database_url, small)
    worker_id = f"w-{uuid.uuid4().hex[:8]}"
    beat = WorkerBeat(pooled, worker_id=worker_id, specialists=["reviewer"], beat_s=0.05)
    beat.start()
    try:
        wait_until(lambda: beat.beats >= 1, "the first beat")
        assert _beat_rows(engine, worker_id) == 1
        with ExitStack() as held:  # every connection the pool has left: a checkout now waits for the pool's timeout
            for _ in range(POOL_SIZE - pooled.pool.checkedout()):
                held.enter_context(pooled.connect())
            assert pooled.pool.checkedout() == POOL_SIZE
            written = beat.beats
            wait_until(lambda: beat.beats >= written + 3, "three beats while the pool has no connection left")
    finally:
        beat.stop(timeout_s=5.0)
        checked_out_after_stop = pooled.pool.checkedout()
        pooled.dispose()
    assert _beat_rows(engine, worker_id) == 0  # gone at once, not after the live bound
    assert checked_out_after_stop == 0  # the stop gave the beat's connection back
