"""``taskstate.liveness`` (issue 42): a beat says a worker is alive and what it serves; a beat older than the live
bound reads dead; a clean stop deletes it; rows dead for ``DEAD_RETENTION_S`` go with a later beat, a bounded batch
at a time. Against the test database, by the database's clock."""

from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError
from sqlalchemy import text

from core.settings import Settings
from taskstate import claims, liveness


def _mine(engine, prefix: str) -> dict[str, liveness.WorkerBeat]:
    with engine.connect() as conn:
        return {w.worker_id: w for w in liveness.workers(conn, live_s=60.0) if w.worker_id.startswith(prefix)}


def test_a_beat_is_live_until_it_is_older_than_the_bound_and_a_clean_stop_deletes_it(engine):
    prefix = f"w-{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        liveness.beat(conn, f"{prefix}-a", ["reviewer", "analyst", "reviewer"])
        liveness.beat(conn, f"{prefix}-b", ["reviewer"])
        conn.execute(text("UPDATE worker_beats SET beat_at = now() - interval '61 seconds' WHERE worker_id = :w"),
                     {"w": f"{prefix}-b"})
    found = _mine(engine, prefix)
    assert found[f"{prefix}-a"].specialists == ("analyst", "reviewer") and found[f"{prefix}-a"].live
    assert not found[f"{prefix}-b"].live and found[f"{prefix}-b"].beat_age_s >= 61
    with engine.begin() as conn:  # a beat again: alive again, with what it serves now
        liveness.beat(conn, f"{prefix}-b", ["analyst"])
        liveness.forget(conn, f"{prefix}-a")
    found = _mine(engine, prefix)
    assert set(found) == {f"{prefix}-b"} and found[f"{prefix}-b"].live and found[f"{prefix}-b"].specialists == (
        "analyst",)


def test_rows_dead_for_a_day_are_pruned_by_later_beats_a_bounded_batch_at_a_time(engine):
    prefix = f"d-{uuid.uuid4().hex[:8]}"
    dead = liveness.PRUNE_BATCH + 5
    with engine.begin() as conn:
        for i in range(dead):
            liveness.beat(conn, f"{prefix}-{i:04d}", [])
        conn.execute(text("UPDATE worker_beats SET beat_at = now() - make_interval(secs => :s) "
                          "WHERE worker_id LIKE :p"), {"s": liveness.DEAD_RETENTION_S + 1, "p": f"{prefix}-%"})
    with engine.begin() as conn:
        first = liveness.beat(conn, f"{prefix}-live", ["reviewer"])
    with engine.begin() as conn:
        second = liveness.beat(conn, f"{prefix}-live", ["reviewer"])
    assert first == liveness.PRUNE_BATCH and second >= 5  # others' dead rows may be pruned with ours
    assert set(_mine(engine, prefix)) == {f"{prefix}-live"}


def test_a_beat_must_come_at_least_twice_within_the_live_bound():
    with pytest.raises(ValidationError, match="SPECIALISTS_WORKER_BEAT_S.*SPECIALISTS_HEALTH_WORKER_LIVE_S"):
        Settings(worker={"beat_s": 40.0}, health={"worker_live_s": 60.0})
    assert Settings(worker={"beat_s": 30.0}, health={"worker_live_s": 60.0}).worker.beat_s == 30.0


def test_a_worker_is_taken_for_dead_only_after_at_least_three_missed_beats():
    with pytest.raises(ValidationError, match="SPECIALISTS_WORKER_DEAD_AFTER_BEATS"):
        Settings(worker={"dead_after_beats": 2})
    assert Settings(worker={"beat_s": 0.5, "dead_after_beats": 3}).worker.dead_after_s == 1.5
    assert Settings(worker={"dead_after_beats": 0}).worker.dead_after_s is None  # off: the leases decide


def test_only_a_beat_older_than_the_bound_says_its_worker_stopped(engine):
    prefix = f"w-{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        liveness.beat(conn, f"{prefix}-old", ["reviewer"])
        liveness.beat(conn, f"{prefix}-new", ["reviewer"])
        conn.execute(text("UPDATE worker_beats SET beat_at = now() - interval '30 seconds' WHERE worker_id = :w"),
                     {"w": f"{prefix}-old"})
    stopped = text(f"SELECT {liveness.stopped_beating_sql('CAST(:w AS text)')}")
    with engine.connect() as conn:
        said = {name: conn.execute(stopped, {"w": f"{prefix}-{name}", "dead_after_s": 10.0}).scalar_one()
                for name in ("old", "new", "never")}
    assert said == {"old": True, "new": False, "never": False}  # a worker that never beat is left to its leases


def test_a_running_claim_is_recorded_unknown_for_a_dead_holder_only_while_its_beat_is_still_that_old(engine):
    # The sweeper's decision (``claims.record_unknown`` with ``holder_dead_after_s``), taken under the claim's row
    # lock: a holder whose beat came back (it was only late) keeps its claim; a dead one's is decided once, with the
    # reason, and the holder's next renewal is fenced.
    prefix = f"w-{uuid.uuid4().hex[:8]}"
    late, dead = f"{prefix}-late", f"{prefix}-dead"
    jobs = {name: f"job-{uuid.uuid4().hex[:16]}" for name in (late, dead)}
    with engine.begin() as conn:
        tokens = {name: claims.claim(conn, jobs[name], worker_id=name, lease_s=600).fencing_token
                  for name in (late, dead)}
        liveness.beat(conn, late, ["reviewer"])
        liveness.beat(conn, dead, ["reviewer"])
        conn.execute(text("UPDATE worker_beats SET beat_at = now() - interval '30 seconds' WHERE worker_id = :w"),
                     {"w": dead})
    why = "its worker stopped beating for 10 s"
    with engine.begin() as conn:
        recorded = {name: claims.record_unknown(conn, jobs[name], fencing_token=tokens[name], why=why,
                                                holder_dead_after_s=10.0) for name in (late, dead)}
    assert recorded == {late: False, dead: True}
    with engine.begin() as conn:
        assert not claims.record_unknown(conn, jobs[dead], fencing_token=tokens[dead], why=why,
                                         holder_dead_after_s=10.0)  # decided once
        dead_row, late_row = claims.get(conn, jobs[dead]), claims.get(conn, jobs[late])
        renewed = claims.renew(conn, jobs[dead], fencing_token=tokens[dead], lease_s=600)
    assert dead_row["state"] == "unknown" and dead_row["lease_expires_at"] is None
    assert why in dead_row["unknown_reason"] and dead in dead_row["unknown_reason"]
    assert late_row["state"] == "running" and late_row["unknown_at"] is None
    assert renewed.outcome == "fenced"  # the holder, were it alive after all, learns it at its next renewal
    with pytest.raises(claims.ClaimError, match="positive.*SPECIALISTS_WORKER_DEAD_AFTER_BEATS") as refused:
        with engine.begin() as conn:
            claims.record_unknown(conn, jobs[late], fencing_token=tokens[late], why=why, holder_dead_after_s=0.0)
    assert refused.value.code == "dead_after_invalid"
