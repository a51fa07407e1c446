"""The event log of a task is pruned once the task has been finished for longer than the retention, and only then."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

from sqlalchemy import text

from workers.dispatch.pruner import prune_idempotency_keys, prune_task_events

DAY = 86_400.0


def task(engine, state: str, finished_days_ago: float, events: int = 3) -> str:
    task_id = str(uuid.uuid4())
    at = datetime.now(timezone.utc) - timedelta(days=finished_days_ago)
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO tasks (id, context_id, kind, owner, last_updated, status, artifacts, history, "
                 "protocol_version) VALUES (:id, :ctx, 'task', 'pruner-test', :at, CAST(:status AS json), "
                 "CAST('[]' AS json), CAST('[]' AS json), '1.0')"),
            {"id": task_id, "ctx": str(uuid.uuid4()), "at": at, "status": json.dumps({"state": state})},
        )
        for version in range(1, events + 1):
            conn.execute(text("INSERT INTO task_events (task_id, owner, task_version, event_data) "
                              "VALUES (:t, 'pruner-test', :v, :d)"), {"t": task_id, "v": version, "d": b"{}"})
    return task_id


def events_of(engine, task_id: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM task_events WHERE task_id = :t"), {"t": task_id}).scalar_one()


def test_only_tasks_finished_longer_ago_than_the_retention_lose_their_events(engine):
    old_done = task(engine, "TASK_STATE_COMPLETED", 20)
    old_canceled = task(engine, "TASK_STATE_CANCELED", 15)
    recent_done = task(engine, "TASK_STATE_FAILED", 1)
    old_waiting = task(engine, "TASK_STATE_INPUT_REQUIRED", 30)  # may still go on: kept
    old_working = task(engine, "TASK_STATE_WORKING", 30)  # unknown outcome, still streamable: kept

    deleted = 0
    while (pruned := prune_task_events(engine, retention_s=14 * DAY, batch=100)) > 0:
        deleted += pruned
    assert deleted >= 6
    assert (events_of(engine, old_done), events_of(engine, old_canceled)) == (0, 0)
    assert [events_of(engine, t) for t in (recent_done, old_waiting, old_working)] == [3, 3, 3]
    with engine.connect() as conn:  # the task itself stays: GetTask answers from it
        assert conn.execute(text("SELECT count(*) FROM tasks WHERE id = :t"), {"t": old_done}).scalar_one() == 1


def test_a_prune_round_deletes_at_most_its_batch(engine):
    doomed = task(engine, "TASK_STATE_COMPLETED", 40, events=250)
    assert prune_task_events(engine, retention_s=14 * DAY, batch=100) == 100
    assert events_of(engine, doomed) == 150


def key(engine, expires_in_s: float) -> str:
    """An Idempotency-Key record of a customer of its own, expiring ``expires_in_s`` from now (< 0: expired)."""
    customer = f"pruner-{uuid.uuid4()}"
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO edge_idempotency_keys (customer_key, specialist_id, idempotency_key, fingerprint, "
                 "task_id, expires_at) VALUES (:c, 'paid-echo', 'k', :f, :t, now() + make_interval(secs => :s))"),
            {"c": customer, "f": b"\0" * 32, "t": str(uuid.uuid4()), "s": expires_in_s},
        )
    return customer


def keys_left(engine, customers: list[str]) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT customer_key FROM edge_idempotency_keys WHERE customer_key = ANY(:c)"),
                                {"c": customers}).scalars())


def test_expired_idempotency_keys_are_pruned_in_bounded_rounds_and_live_ones_are_kept(engine):
    expired = [key(engine, -60 - i) for i in range(5)]
    live = [key(engine, 3600), key(engine, 60)]
    while prune_idempotency_keys(engine, batch=1000):  # other tests' expired keys of this database too
        pass
    assert keys_left(engine, expired + live) == set(live)
    more = [key(engine, -1) for _ in range(5)]
    assert prune_idempotency_keys(engine, batch=2) == 2  # a round deletes at most its batch
    while prune_idempotency_keys(engine, batch=2):
        pass
    assert keys_left(engine, more + live) == set(live)
