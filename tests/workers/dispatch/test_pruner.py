"""Retention: what a prune deletes (only what ended longer ago than its retention), what it never deletes (what is
running, unknown, or still needed), in bounded rounds that converge."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine, create_engine, text

from core.settings import DispatchSettings, Settings, describe_invalid
from tests.job_history import one_job
from tests.workers.system import drop_database, fresh_database
from workers.dispatch.pruner import (Pruner, outbox_walk, prune_finished_claims, prune_finished_outbox,
                                     prune_idempotency_keys, prune_task_events, task_events_walk)

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


def test_only_tasks_finished_longer_ago_than_the_retention_lose_their_events(own):
    # On a database of its own: a walk from the start passes every ended task older than the retention, and
    # another file's tens of thousands of them (tests/app/test_list_tasks_cost.py) took whole rounds that deleted
    # nothing, which ended this loop before it reached these tasks.
    engine = own
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


def test_a_prune_round_deletes_at_most_its_batch(own):
    engine = own  # a database of its own, as above: the round's first page is this test's
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


# --- finished jobs: outbox rows and claims ----------------------------------------------------------------

RETENTION_S = 14 * DAY


@pytest.fixture(scope="module")
def own(server_url: str) -> Iterator[Engine]:
    """A database of this module's own: what a prune leaves is counted exactly."""
    url = fresh_database(server_url)
    own_engine = create_engine(url)
    try:
        yield own_engine
    finally:
        own_engine.dispose()
        drop_database(server_url, url)


def jobs(engine: Engine, **kinds: dict) -> dict[str, tuple[str, int]]:
    with engine.begin() as conn:
        return {name: one_job(conn, **spec) for name, spec in kinds.items()}


def rows_left(engine: Engine, made: dict[str, tuple[str, int]]) -> set[str]:
    with engine.connect() as conn:
        kept = set(conn.execute(text("SELECT dispatch_id FROM dispatch_outbox WHERE dispatch_id = ANY(:d)"),
                                {"d": [d for _, d in made.values()]}).scalars())
    return {name for name, (_, d) in made.items() if d in kept}


def claims_left(engine: Engine, made: dict[str, tuple[str, int]]) -> set[str]:
    with engine.connect() as conn:
        kept = set(conn.execute(text("SELECT job_id FROM job_claims WHERE job_id = ANY(:j)"),
                                {"j": [f"{t}.{d}" for t, d in made.values()]}).scalars())
    return {name for name, (t, d) in made.items() if f"{t}.{d}" in kept}


def until_done(prune, **options) -> int:  # noqa: ANN001
    """Prune rounds until one deletes nothing; how many were deleted in all."""
    total = 0
    while (deleted := prune(**options)) > 0:
        assert deleted <= options["batch"], "a round deleted more than its batch"
        total += deleted
    return total


def test_only_finished_jobs_of_ended_tasks_past_the_retention_are_pruned_and_running_or_unknown_never(own):
    made = jobs(
        own,
        completed=dict(task_state="completed", row_status="done", claim_state="finished", days_ago=20),
        canceled_before_claim=dict(task_state="canceled", row_status="canceled", claim_state="finished", days_ago=15),
        undeliverable=dict(task_state="failed", row_status="undeliverable", claim_state="finished", days_ago=30),
        recent=dict(task_state="completed", row_status="done", claim_state="finished", days_ago=1),
        waiting_for_input=dict(task_state="input_required", row_status="done", claim_state="finished", days_ago=40),
        unknown=dict(task_state="canceled", row_status="done", claim_state="unknown", days_ago=40),
        running=dict(task_state="canceled", row_status="done", claim_state="running", days_ago=40),
        never_sent=dict(task_state="submitted", row_status="pending", claim_state=None, days_ago=40),
        sent_unknown=dict(task_state="working", row_status="sent", claim_state="unknown", days_ago=40),
    )
    until_done(prune_finished_outbox, engine=own, retention_s=RETENTION_S, batch=100)
    pruned = {"completed", "canceled_before_claim", "undeliverable"}
    assert rows_left(own, made) == set(made) - pruned
    assert claims_left(own, made) == set(made) - {"never_sent"}  # no claim is pruned with its row

    until_done(prune_finished_claims, engine=own, retention_s=RETENTION_S, batch=100)
    assert claims_left(own, made) == set(made) - pruned - {"never_sent"}
    assert rows_left(own, made) == set(made) - pruned


def test_a_claim_is_pruned_only_once_its_outbox_row_is_gone_and_an_unknown_or_running_one_never(own):
    with own.begin() as conn:  # claims without a row (a test's raw job), all of them long finished or held
        for job_id, state in (("raw-finished", "finished"), ("raw-unknown", "unknown"), ("raw-running", "running")):
            conn.execute(text(
                "INSERT INTO job_claims (job_id, state, fencing_token, claims, lease_expires_at, finished_at, "
                "outcome, unknown_at, claimed_at) VALUES (:j, :s, 1, 1, "
                "CASE WHEN CAST(:s AS text) = 'running' THEN now() - interval '40 days' END, "
                "CASE WHEN CAST(:s AS text) = 'finished' THEN now() - interval '40 days' END, "
                "CASE WHEN CAST(:s AS text) = 'finished' THEN 'completed' END, "
                "CASE WHEN CAST(:s AS text) = 'unknown' THEN now() - interval '40 days' END, now() - interval '40 days')"),
                {"j": job_id, "s": state})
    made = jobs(own, kept_row=dict(task_state="completed", row_status="done", claim_state="finished", days_ago=40))
    until_done(prune_finished_claims, engine=own, retention_s=RETENTION_S, batch=100)
    with own.connect() as conn:
        left = set(conn.execute(text("SELECT job_id FROM job_claims WHERE job_id LIKE 'raw-%'")).scalars())
    assert left == {"raw-unknown", "raw-running"}
    assert claims_left(own, made) == {"kept_row"}  # its row is still there: the outbox prune goes first
    until_done(prune_finished_outbox, engine=own, retention_s=RETENTION_S, batch=100)
    until_done(prune_finished_claims, engine=own, retention_s=RETENTION_S, batch=100)
    assert claims_left(own, made) == set()


def test_prune_rounds_are_bounded_by_their_batch_and_repeated_rounds_converge(own):
    made = jobs(own, **{f"job{i}": dict(task_state="completed", row_status="done", claim_state="finished",
                                        days_ago=20 + i) for i in range(25)})
    assert prune_finished_outbox(own, retention_s=RETENTION_S, batch=10) == 10
    assert len(rows_left(own, made)) == 15
    assert until_done(prune_finished_outbox, engine=own, retention_s=RETENTION_S, batch=10) == 15
    assert prune_finished_claims(own, retention_s=RETENTION_S, batch=10) == 10
    assert until_done(prune_finished_claims, engine=own, retention_s=RETENTION_S, batch=10) == 15
    assert rows_left(own, made) == claims_left(own, made) == set()
    # The oldest went first (the 15 left after the first round were the newest).


def test_the_dispatchers_pruner_round_prunes_every_table_with_the_settings(own):
    made = jobs(own, old=dict(task_state="completed", row_status="done", claim_state="finished", days_ago=40,
                              events=3),
                young=dict(task_state="completed", row_status="done", claim_state="finished", days_ago=2))
    pruner = Pruner(own, Settings(dispatch={"outbox_retention_days": 10, "job_claims_retention_days": 20}))
    while any(pruner.round().values()):
        pass
    assert rows_left(own, made) == claims_left(own, made) == {"young"}
    assert events_of(own, made["old"][0]) == 0 and events_of(own, made["young"][0]) == 2


def test_the_events_walk_keeps_its_place_and_reaches_tasks_that_end_later(own):
    while task_events_walk(own, retention_s=RETENTION_S, batch=1000).round():
        pass  # what the module's other tests left
    with own.begin() as conn:
        first = [one_job(conn, task_state="completed", row_status="done", claim_state="finished",
                         days_ago=60 - i, events=10)[0] for i in range(30)]
    walk = task_events_walk(own, retention_s=RETENTION_S, batch=100)
    assert [walk.round() for _ in range(4)] == [100, 100, 100, 0]
    assert sum(events_of(own, t) for t in first) == 0
    with own.connect() as conn:  # the walk stands past the last of them: it does not read them again
        newest = conn.execute(text("SELECT last_updated FROM tasks WHERE id = :t"), {"t": first[-1]}).scalar_one()
    assert walk.after[0] >= newest
    with own.begin() as conn:  # ends within the retention: kept, until the clock moves on past it
        later = one_job(conn, task_state="failed", row_status="done", claim_state="finished", days_ago=13.5,
                        events=4)[0]
    assert walk.round() == 0 and events_of(own, later) == 4
    later_walk = task_events_walk(own, retention_s=RETENTION_S - DAY, batch=100)  # a day later, as the cut sees it
    later_walk.after = walk.after  # where the walk stood
    assert later_walk.round() == 4 and events_of(own, later) == 0


@pytest.mark.parametrize("setting", ["outbox_retention_days", "job_claims_retention_days"])
def test_a_retention_shorter_than_the_longest_a_delivery_can_still_arrive_stops_start_up(setting):
    # 2 days of body lifetime + 600 s of dispatch deadline: a retention of 2 days would let a late delivery of a
    # pruned job arrive after its records are gone.
    with pytest.raises(ValidationError) as refused:
        Settings(worker={"job_max_age_s": 2 * 86_400}, dispatch={setting: 2})
    message = describe_invalid(refused.value)
    assert DispatchSettings.env_name(setting) in message
    assert "SPECIALISTS_WORKER_JOB_MAX_AGE_S" in message and "SPECIALISTS_DISPATCH_DEADLINE_S" in message
    Settings(worker={"job_max_age_s": 2 * 86_400}, dispatch={setting: 2.01})  # past it: accepted


def test_a_walk_passes_what_it_must_keep_and_finds_it_again_on_its_rescan_once_it_has_ended(own):
    until_done(prune_finished_outbox, engine=own, retention_s=RETENTION_S, batch=1000)  # what earlier tests left
    made = jobs(own, waiting=dict(task_state="input_required", row_status="done", claim_state="finished", days_ago=40),
                done=dict(task_state="completed", row_status="done", claim_state="finished", days_ago=30))
    walk = outbox_walk(own, retention_s=RETENTION_S, batch=100, rescan_s=3600)
    assert walk.round() == 1 and rows_left(own, made) == {"waiting"}
    with own.begin() as conn:  # the customer answers, and the task ends: its first job's row may go now
        conn.execute(text("UPDATE tasks SET status = CAST('{\"state\": \"TASK_STATE_COMPLETED\"}' AS json) "
                          "WHERE id = :t"), {"t": made["waiting"][0]})
    assert walk.round() == 0  # passed: the walk does not read it again every round
    walk.rescan_s = 0  # the rescan interval has passed
    walk.round()  # reaches the edge and starts again from the oldest
    assert walk.round() == 1 and rows_left(own, made) == set()
