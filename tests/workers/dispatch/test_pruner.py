"""The event log of a task is pruned once the task has been finished for longer than the retention, and only then."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

from sqlalchemy import text

from workers.dispatch.pruner import prune_task_events

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
