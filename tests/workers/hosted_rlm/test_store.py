"""Checkpoints and the journal in PostgreSQL: fenced by the claim, signed, and what a resume replays."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from tests.workers.hosted_rlm import support
from tests.workers.hosted_rlm.test_runner import FILES, RULE
from core.specs import PricingSpec
from rlmfamily.kernels.checkpoints import Checkpoint, PendingCall, RuntimeIdentity
from taskstate import charge, claims
from workers.hosted_rlm import journal
from workers.hosted_rlm.hosted import session_id_for
from workers.hosted_rlm.journal import Journal
from workers.hosted_rlm.store import ClaimLost, PgCheckpointStore

pytestmark = pytest.mark.timeout(60)


def test_a_worker_that_lost_its_claim_writes_no_checkpoint_and_no_journal(engine):
    job_id = support.new_job_id()
    old = support.claim(engine, job_id)
    store = PgCheckpointStore(engine, job_id=job_id, fencing_token=old, session_id=session_id_for(job_id))
    store.put(store.session_id, 0, b"record zero")
    with engine.begin() as conn:  # the claim moves on: released, then claimed by another worker
        assert claims.release(conn, job_id, fencing_token=old)
        assert claims.claim(conn, job_id, worker_id="other", lease_s=30).fencing_token == old + 1
    with pytest.raises(ClaimLost):
        store.put(store.session_id, 1, b"a stale worker's record")
    with pytest.raises(ClaimLost):
        Journal(engine, job_id=job_id, fencing_token=old).start_step(1, 0, 0)
    assert store.list(store.session_id) == [0]
    new = PgCheckpointStore(engine, job_id=job_id, fencing_token=old + 1, session_id=store.session_id)
    new.put(new.session_id, 1, b"the current worker's record")
    assert new.latest(new.session_id) == (1, b"the current worker's record")


def test_every_journal_write_of_a_worker_that_lost_its_claim_is_refused_and_writes_nothing(engine):
    """Each journal write is one statement with the claim's fence in it: a stale worker's writes change nothing."""
    job_id = support.new_job_id()
    old = support.claim(engine, job_id)
    live = Journal(engine, job_id=job_id, fencing_token=old)
    pricing = PricingSpec(mode="fixed")

    def open_run(journal: Journal) -> int:
        return journal.open_run(specialist_id="reviewer", route="test", pricing=pricing, reserved_credits=5,
                                session_id=session_id_for(job_id))

    assert open_run(live) == 0 and open_run(live) == 0  # opened once; found again by the same claim
    live.start_step(1, 0, 0)
    call = live.start_call(purpose="subcall", turn=1, step_index=0, after_seq=0, request_sha256=b"\x01" * 32,
                           request_text="q", model="m")
    with engine.begin() as conn:  # the claim moves on: released, then claimed by another worker
        assert claims.release(conn, job_id, fencing_token=old)
        assert claims.claim(conn, job_id, worker_id="other", lease_s=30).fencing_token == old + 1

    def snapshot() -> list:
        with engine.connect() as conn:
            return [conn.execute(text("SELECT call_id, state, replays, superseded_by FROM specialist_calls "
                                      "WHERE job_id = :j ORDER BY call_id"), {"j": job_id}).all(),
                    conn.execute(text("SELECT turn, step_index, ended_at FROM specialist_steps WHERE job_id = :j "
                                      "ORDER BY turn, step_index"), {"j": job_id}).all(),
                    conn.execute(text("SELECT state, ended_at, credits_to_settle FROM specialist_runs "
                                      "WHERE job_id = :j"), {"j": job_id}).all()]

    before = snapshot()
    stale = live  # the same journal, now behind the claim
    writes = [
        lambda: stale.start_call(purpose="subcall", turn=1, step_index=0, after_seq=0,
                                 request_sha256=b"\x02" * 32, request_text="q2", model="m", supersedes=call),
        lambda: stale.fail_call(call, billed=False, note="refused"),
        lambda: stale.fail_call(call, billed=None, note="unknown"),
        lambda: stale.replayed(call),
        lambda: stale.start_step(1, 1, 0),
        lambda: open_run(stale),
        lambda: stale.end_run(outcome="completed", stop_reason="answered", turns=1, totals=stale.totals(),
                              charged_credits=5),
    ]
    for write in writes:
        with pytest.raises(ClaimLost):
            write()
    assert snapshot() == before
    # The current claim's journal writes, superseding included, go through.
    current = Journal(engine, job_id=job_id, fencing_token=old + 1)
    replacement = current.start_call(purpose="subcall", turn=1, step_index=0, after_seq=0,
                                     request_sha256=b"\x02" * 32, request_text="q2", model="m", supersedes=call)
    calls, _, _ = snapshot()
    assert [(c.call_id, c.superseded_by) for c in calls] == [(call, replacement), (replacement, None)]
    current.end_run(outcome="completed", stop_reason="answered", turns=1, totals=current.totals(), charged_credits=5)
    [run] = snapshot()[2]
    assert run.state == "ended" and run.ended_at is not None and run.credits_to_settle == 5


def test_only_snapshots_before_paid_calls_are_written(engine):
    job_id = support.new_job_id()
    store = PgCheckpointStore(engine, job_id=job_id, fencing_token=support.claim(engine, job_id),
                              session_id=session_id_for(job_id))

    def record(seq: int, kind: str, call: str | None = None) -> bytes:
        pending = None if call is None else PendingCall(call, 1, 0, "", 0, False)
        return Checkpoint.create(session_id=store.session_id, seq=seq, kind=kind, dump=b"dump", limits={},
                                 identity=RuntimeIdentity("1", "x"), pending=pending).encode(key=support.CHECKPOINT_KEY)

    store.put(store.session_id, 0, record(0, "session"))
    store.put(store.session_id, 1, record(1, "pending_call", "_context_read"))
    store.put(store.session_id, 2, record(2, "pending_call", "_llm_query_batched"))
    store.put(store.session_id, 3, record(3, "pending_call", "_context_search"))
    store.put(store.session_id, 4, record(4, "pending_call", "_llm_query"))
    assert store.list(store.session_id) == [0, 2, 4]
    assert store.last_seq == 4


def test_a_lease_that_passed_stops_writes_even_before_anyone_else_claims(engine):
    job_id = support.new_job_id()
    with engine.begin() as conn:  # claimed a minute ago with a 20 s lease: it has passed by the database's clock
        token = claims.claim(conn, job_id, worker_id="w", lease_s=20,
                             now=datetime.now(timezone.utc) - timedelta(minutes=1)).fencing_token
    with pytest.raises(ClaimLost):
        PgCheckpointStore(engine, job_id=job_id, fencing_token=token, session_id=session_id_for(job_id)).put(
            session_id_for(job_id), 0, b"late"
        )


def finished_then_resumed(engine, tmp_path):
    """A run that answered, then its worker 'died' before finishing the claim; the lease passes (by the claim's
    clock, however long the run took); resumed."""
    spec = support.write_spec(tmp_path / "specs")
    routes = support.routes_for("review_sql.toml")
    job_id = support.new_job_id()
    token = support.claim(engine, job_id, lease_s=60)
    msg = support.message(RULE, files=FILES)
    first = support.runner(engine, spec, routes, msg).run(support.context(job_id, "reviewer", token))
    assert first.state == "completed", first
    with engine.connect() as conn:
        lease_ends = claims.get(conn, job_id)["lease_expires_at"]
    with engine.begin() as conn:
        resumed = claims.claim_resumable(conn, job_id, worker_id="second", lease_s=3600, max_resumes=2,
                                         now=lease_ends + timedelta(seconds=1))
    assert resumed.resumed
    return spec, routes, msg, job_id, resumed.claim.fencing_token, first


def test_a_run_resumed_after_it_answered_replays_everything_and_calls_no_model(engine, tmp_path):
    spec, routes, msg, job_id, token, first = finished_then_resumed(engine, tmp_path)
    with engine.connect() as conn:
        calls_before = conn.execute(text("SELECT count(*) FROM specialist_calls WHERE job_id = :j"), {"j": job_id}).scalar()
    again = support.runner(engine, spec, routes, msg).run(support.context(job_id, "reviewer", token))
    assert (again.state, again.artifacts) == (first.state, first.artifacts)
    with engine.connect() as conn:
        calls_after = conn.execute(
            text("SELECT count(*), sum(replays) FROM specialist_calls WHERE job_id = :j"), {"j": job_id}
        ).one()
    assert calls_after[0] == calls_before  # nothing new was asked of the model
    # The three root turns are replayed from the journal; the steps are replayed from their recorded results, so
    # the semantic calls inside them are not asked at all.
    assert calls_after[1] == 3
    assert again.detail["charged_credits"] == first.detail["charged_credits"]


def test_a_tampered_checkpoint_is_refused_and_the_job_fails_saying_why(engine, tmp_path):
    spec, routes, msg, job_id, token, _ = finished_then_resumed(engine, tmp_path)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE specialist_checkpoints SET data = overlay(data placing '\\x00'::bytea from length(data) - 3) "
                 "WHERE job_id = :j AND seq = (SELECT max(seq) FROM specialist_checkpoints WHERE job_id = :j)"),
            {"j": job_id},
        )
    outcome = support.runner(engine, spec, routes, msg).run(support.context(job_id, "reviewer", token))
    assert outcome.state == "failed"
    assert outcome.detail["code"] == "checkpoint_tampered"
    assert "could not be resumed" in outcome.message and "digest mismatch" in outcome.message
    assert outcome.detail["charged_credits"] == 0  # the service's failure, not the customer's


def test_the_journal_decides_what_a_job_settles_and_whether_it_may_still_be_resumed(engine, tmp_path):
    spec, routes, msg, job_id, token, first = finished_then_resumed(engine, tmp_path)
    with engine.connect() as conn:
        run = journal.run_record(conn, job_id)
        assert journal.run_record(conn, "not-a-specialist-job") is None
    assert (run.pricing, run.semantic_calls_used, run.semantic_calls_charged) == (
        charge.Pricing("metered", 4, 1), 2, 2)

    def charged(outcome: str, runner_credits: int | None) -> int | None:
        usage = charge.Usage(run.semantic_calls_charged, runner_credits=runner_credits)
        return charge.charged_credits(outcome, reserved_credits=20, pricing=run.pricing, usage=usage)

    assert charged("completed", first.detail["charged_credits"]) == 4 + 2
    assert charged("failed", None) == 4 + 2  # stopped by the worker: the journal's
    assert charged("rejected", None) == 0
    assert charged("failed", 0) == 0
    with engine.begin() as conn:  # the resumed claim's lease passes too
        conn.execute(text("UPDATE job_claims SET lease_expires_at = clock_timestamp() - interval '10 seconds' "
                          "WHERE job_id = :j"), {"j": job_id})
    with engine.connect() as conn:
        resumable = lambda resumes, window: conn.execute(  # noqa: E731
            text("SELECT specialist_resumable(:j, :m, :w)"), {"j": job_id, "m": resumes, "w": window}
        ).scalar()
        assert resumable(2, 60) is True
        assert resumable(1, 60) is False  # resumed once already: the limit is reached
        assert resumable(2, 5) is False  # the lease expired longer ago than the window


def test_the_warm_up_ahead_of_a_job_runs_a_runs_statements_on_its_connection_and_writes_nothing(engine):
    """Issue 44: a job's process waiting for its job runs each statement of a run once (``runner.warm``, from
    ``workers.assembly.connect_ahead``), so that the run's first statements do not pay for a new server process's
    first parse and plan. As a job no claim holds: beside a live claim, not a row of any journal table moves, and
    the one connection it used waits in the pool for the run."""
    from sqlalchemy import create_engine, event

    from workers.hosted_rlm.runner import WARM_JOB_ID, warm

    job_id = support.new_job_id()
    live = Journal(engine, job_id=job_id, fencing_token=support.claim(engine, job_id))
    live.open_run(specialist_id="reviewer", route="test", pricing=PricingSpec(mode="fixed"), reserved_credits=5,
                  session_id=session_id_for(job_id))
    tables = ("specialist_runs", "specialist_calls", "specialist_steps", "specialist_checkpoints", "job_claims")

    def rows() -> dict:
        with engine.connect() as conn:
            return {table: conn.execute(text(f"SELECT count(*), count(*) FILTER (WHERE job_id = :w) FROM {table}"),
                                        {"w": WARM_JOB_ID}).one() for table in tables}

    before = rows()
    fresh = create_engine(engine.url)  # a job process's: prepared without a connection
    statements: list[tuple[int, str]] = []
    event.listen(fresh, "before_cursor_execute",
                 lambda conn, cursor, sql, *rest: statements.append((id(conn.connection.driver_connection), sql)))
    try:
        warm(fresh)
        assert fresh.pool.checkedin() == 1
    finally:
        fresh.dispose()
    assert rows() == before and all(warmed == 0 for _, warmed in before.values())
    ran = " ".join(sql for _, sql in statements)
    for table in tables[:4]:
        assert f"INTO {table}" in ran or f"UPDATE {table}" in ran or f"FROM {table}" in ran, table
    assert len({connection for connection, _ in statements}) == 1
