"""Claims against real PostgreSQL: at most one run per job, leases, fencing, unknown outcomes."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine, text

from taskstate import claims
from tests.locks import wait_until_blocked_by, wait_until_waited

pytestmark = pytest.mark.timeout(60)

FIRST_CLAIM_WAIT_S = 0.05  # job_claim_first (0292): a first claim that waited longer counts its lease again


def new_job_id() -> str:
    return "job-" + secrets.token_hex(8)


def at_once(count: int, action) -> list:
    """Run ``action(i)`` in ``count`` threads released together; return their results."""
    barrier = threading.Barrier(count)
    results: list = [None] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = action(i)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    return results


def do(engine: Engine, fn, *args, **kwargs):
    with engine.begin() as conn:
        return fn(conn, *args, **kwargs)


def clock() -> datetime:
    """A start for the tests' own clock: the claim calls decide as of the time they are given (``now``),
    so a lease passes, or stays alive, exactly when a test says, however slow the machine is."""
    return datetime.now(timezone.utc)


def test_a_new_job_is_claimed_with_token_one_and_a_live_lease(engine: Engine) -> None:
    job = new_job_id()
    result = do(engine, claims.claim, job, worker_id="w1", lease_s=30)
    assert result.outcome == "claimed"
    assert result.fencing_token == 1
    with engine.connect() as conn:
        row = claims.get(conn, job)
        alive = conn.execute(text("SELECT lease_expires_at > clock_timestamp() FROM job_claims WHERE job_id=:j"), {"j": job}).scalar()
    assert row["state"] == "running" and row["worker_id"] == "w1" and alive


def test_five_concurrent_deliveries_of_one_job_claim_it_exactly_once(engine: Engine) -> None:
    for _ in range(10):  # several rounds: a race that loses once in a while must still be caught
        job = new_job_id()
        results = at_once(5, lambda i: do(engine, claims.claim, job, worker_id=f"w{i}", lease_s=30))
        outcomes = sorted(r.outcome for r in results)
        assert outcomes == ["busy", "busy", "busy", "busy", "claimed"]
        with engine.connect() as conn:
            row = claims.get(conn, job)
        assert row["fencing_token"] == 1 and row["claims"] == 1 and row["deliveries"] == 5


def test_a_delivery_during_a_live_lease_is_told_when_to_retry(engine: Engine) -> None:
    job = new_job_id()
    do(engine, claims.claim, job, worker_id="w1", lease_s=20)
    busy = do(engine, claims.claim, job, worker_id="w2", lease_s=20)
    assert busy.outcome == "busy"
    assert 15 < busy.retry_after_s <= 20


def test_an_expired_lease_becomes_unknown_and_the_job_never_runs_again(engine: Engine) -> None:
    job = new_job_id()
    t0 = clock()
    do(engine, claims.claim, job, worker_id="crashed", lease_s=20, now=t0)
    past_lease = t0 + timedelta(seconds=21)
    results = at_once(5, lambda i: do(engine, claims.claim, job, worker_id=f"w{i}", lease_s=30, now=past_lease))
    assert {r.outcome for r in results} == {"lease_expired_unknown"}
    assert sum(r.newly_unknown for r in results) == 1  # exactly one delivery marks it (and the ledger)
    later = do(engine, claims.claim, job, worker_id="w9", lease_s=30)
    assert later.outcome == "lease_expired_unknown" and not later.newly_unknown
    with engine.connect() as conn:
        row = claims.get(conn, job)
        unknown = claims.list_unknown(conn, limit=10_000)
    assert row["state"] == "unknown" and row["claims"] == 1 and "crashed" in row["unknown_reason"]
    assert job in {u["job_id"] for u in unknown}


def test_a_stale_fencing_token_cannot_finish_and_is_recorded_for_operators(engine: Engine) -> None:
    job = new_job_id()
    first = do(engine, claims.claim, job, worker_id="old", lease_s=30)
    assert do(engine, claims.release, job, fencing_token=first.fencing_token)
    second = do(engine, claims.claim, job, worker_id="new", lease_s=30)
    assert second.outcome == "claimed" and second.fencing_token == 2

    stale = do(engine, claims.finish, job, fencing_token=1, outcome="completed", detail={"r": "old"}, worker_id="old")
    assert stale.outcome == "stale" and not stale.accepted
    current = do(engine, claims.finish, job, fencing_token=2, outcome="failed", detail=None, worker_id="new")
    assert current.accepted
    with engine.connect() as conn:
        row = claims.get(conn, job)
        reports = claims.list_stale_reports(conn, job)
    assert row["outcome"] == "failed"
    assert [(r["fencing_token"], r["current_token"], r["outcome"], r["worker_id"]) for r in reports] == [
        (1, 2, "completed", "old")
    ]


def test_only_one_of_two_racing_finishes_is_accepted(engine: Engine) -> None:
    job = new_job_id()
    token = do(engine, claims.claim, job, worker_id="w", lease_s=30).fencing_token
    results = at_once(
        2,
        lambda i: do(
            engine, claims.finish, job, fencing_token=token, outcome=("completed", "failed")[i], detail=None, worker_id="w"
        ),
    )
    assert sorted(r.outcome for r in results) == ["finished", "stale"]


def test_a_result_arriving_after_the_lease_expired_is_refused_and_the_job_is_unknown(engine: Engine) -> None:
    job = new_job_id()
    t0 = clock()
    token = do(engine, claims.claim, job, worker_id="slow", lease_s=20, now=t0).fencing_token
    late = do(engine, claims.finish, job, fencing_token=token, outcome="completed", detail={"x": 1}, worker_id="slow",
              now=t0 + timedelta(seconds=20))
    assert late.outcome == "stale" and late.state == "unknown"
    with engine.connect() as conn:
        row = claims.get(conn, job)
        reports = claims.list_stale_reports(conn, job)
    assert row["state"] == "unknown"
    assert reports[0]["outcome"] == "completed" and "expired" in reports[0]["reason"]  # the late result is kept


def test_a_retried_finish_of_the_same_outcome_is_accepted_again_but_another_outcome_is_not(engine: Engine) -> None:
    job = new_job_id()
    token = do(engine, claims.claim, job, worker_id="w", lease_s=30).fencing_token
    args = dict(fencing_token=token, outcome="completed", detail={"n": 1}, worker_id="w")
    assert do(engine, claims.finish, job, **args).outcome == "finished"
    assert do(engine, claims.finish, job, **args).outcome == "already_finished"
    other = do(engine, claims.finish, job, **{**args, "outcome": "failed"})
    assert other.outcome == "stale"


def test_a_delivery_of_a_finished_job_gets_the_stored_outcome(engine: Engine) -> None:
    job = new_job_id()
    token = do(engine, claims.claim, job, worker_id="w", lease_s=30).fencing_token
    do(engine, claims.finish, job, fencing_token=token, outcome="completed", detail={"answer": 42}, worker_id="w")
    again = do(engine, claims.claim, job, worker_id="w2", lease_s=30)
    assert again.outcome == "finished"
    assert again.job_outcome == "completed" and again.job_outcome_detail == {"answer": 42}


def test_renewal_extends_the_lease_and_carries_a_cancel_request(engine: Engine) -> None:
    job = new_job_id()
    t0 = clock()
    token = do(engine, claims.claim, job, worker_id="w", lease_s=10, now=t0).fencing_token
    beat = timedelta(seconds=8)
    for n in range(1, 5):  # outlives the first lease (10 s) only because it is renewed every 8 s
        renewed = do(engine, claims.renew, job, fencing_token=token, lease_s=10, now=t0 + n * beat)
        assert renewed.outcome == "renewed" and not renewed.cancel_requested
        assert renewed.lease_expires_at == t0 + n * beat + timedelta(seconds=10)
    assert do(engine, claims.request_cancel, job, reason="customer asked") == "cancel_requested"
    renewed = do(engine, claims.renew, job, fencing_token=token, lease_s=10, now=t0 + 5 * beat)
    assert renewed.outcome == "renewed" and renewed.cancel_requested


def test_renewal_with_a_stale_token_is_fenced_and_after_expiry_the_job_is_unknown(engine: Engine) -> None:
    job = new_job_id()
    t0 = clock()
    token = do(engine, claims.claim, job, worker_id="w", lease_s=20, now=t0).fencing_token
    assert do(engine, claims.renew, job, fencing_token=token + 1, lease_s=30, now=t0).outcome == "fenced"
    past_lease = t0 + timedelta(seconds=20)
    assert do(engine, claims.renew, job, fencing_token=token, lease_s=30, now=past_lease).outcome == "expired"
    assert do(engine, claims.claim, job, worker_id="w2", lease_s=30).outcome == "lease_expired_unknown"


def test_a_job_canceled_before_any_claim_never_runs(engine: Engine) -> None:
    job = new_job_id()
    assert do(engine, claims.request_cancel, job, reason="customer asked") == "canceled_before_claim"
    delivery = do(engine, claims.claim, job, worker_id="w", lease_s=30)
    assert delivery.outcome == "finished" and delivery.job_outcome == "canceled" and delivery.fencing_token == 0


def test_an_operator_resolves_an_unknown_job_once_with_a_reason(engine: Engine) -> None:
    job = new_job_id()
    t0 = clock()
    do(engine, claims.claim, job, worker_id="w", lease_s=20, now=t0)
    assert do(engine, claims.claim, job, worker_id="w2", lease_s=30,
              now=t0 + timedelta(seconds=21)).outcome == "lease_expired_unknown"
    with pytest.raises(claims.ClaimError) as refused:
        do(engine, claims.resolve_unknown, job, outcome="completed", reason=" ", operator="ops")
    assert refused.value.code == "reason_required"
    assert do(engine, claims.resolve_unknown, job, outcome="completed", reason="logs show it ran", operator="ops")
    assert not do(engine, claims.resolve_unknown, job, outcome="failed", reason="again", operator="ops")
    delivery = do(engine, claims.claim, job, worker_id="w3", lease_s=30)
    assert delivery.outcome == "finished" and delivery.job_outcome_detail["resolved_by"] == "ops"


def test_a_finish_rolled_back_with_its_settlement_leaves_the_claim_running(engine: Engine) -> None:
    """The seam for exactly-once settlement: finish and settle share the caller's transaction."""
    job = new_job_id()
    token = do(engine, claims.claim, job, worker_id="w", lease_s=30).fencing_token
    with pytest.raises(RuntimeError):
        with engine.begin() as conn:
            assert claims.finish(conn, job, fencing_token=token, outcome="completed", detail=None, worker_id="w").accepted
            raise RuntimeError("the settlement failed")
    with engine.connect() as conn:
        assert claims.get(conn, job)["state"] == "running"
    assert do(engine, claims.finish, job, fencing_token=token, outcome="completed", detail=None, worker_id="w").accepted


def test_the_database_refuses_impossible_claim_rows(engine: Engine) -> None:
    with pytest.raises(Exception, match="check"):
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO job_claims (job_id, state, fencing_token, claims) VALUES ('j-bad', 'running', 1, 1)")
            )  # running without a lease


def test_the_claims_migration_rolls_back_and_forward_cleanly(server_url: str) -> None:
    """Operators can step back over revision 0020 and forward again (its own database)."""
    from alembic import command
    from sqlalchemy import create_engine

    from core import db
    from tests.conftest import empty_database

    with empty_database(server_url, "specialists_claims_migration") as url:
        probe = create_engine(url)
        try:
            db.upgrade(url, "0020")
            command.downgrade(db.alembic_config(url), "0020-1")
            with probe.connect() as conn:
                assert conn.execute(text("SELECT to_regclass('job_claims'), to_regproc('job_claim')")).one() == (None, None)
            db.upgrade(url, "0020")
            with probe.begin() as conn:  # the 0020 signature, as the code of its time called it
                assert conn.execute(text("SELECT outcome FROM job_claim('job-after-roundtrip', 'w', 5)")).scalar_one() \
                    == "claimed"
            db.upgrade(url)
            with probe.begin() as conn:
                assert claims.claim(conn, "job-at-head", worker_id="w", lease_s=5).outcome == "claimed"
        finally:
            probe.dispose()


def test_stepping_back_over_0293_restores_both_job_claims_as_0292_left_them(server_url: str) -> None:
    """0293 rewrites ``job_claim``'s first-claim branch as a call of ``job_claim_first``, and the signature without
    ``p_now`` as a call of the one with it: its downgrade gives back both signatures' definitions character for
    character, and at head the signature without ``p_now`` (the code before 0100) still claims a new job once and
    tells a second delivery it is busy (its own database)."""
    from alembic import command
    from sqlalchemy import create_engine

    from core import db
    from tests.conftest import empty_database

    definitions = text("SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid) FROM pg_proc p "
                       "WHERE p.proname = 'job_claim' ORDER BY 1")
    with empty_database(server_url, "specialists_first_claim_migration") as url:
        probe = create_engine(url)
        try:
            db.upgrade(url, "0292")
            with probe.connect() as conn:
                before = conn.execute(definitions).all()
            assert [signature for signature, _ in before] == [
                "job_claim(text,text,double precision)",
                "job_claim(text,text,double precision,timestamp with time zone)"]
            db.upgrade(url, "0293")
            with probe.connect() as conn:
                without_now, with_now = (body for _, body in conn.execute(definitions).all())
            assert "job_claim_first(" in with_now  # the first claim's one definition
            assert "job_claim(p_job_id, p_worker_id, p_lease_s, NULL::timestamptz)" in without_now
            command.downgrade(db.alembic_config(url), "0292")
            with probe.connect() as conn:
                assert conn.execute(definitions).all() == before
            db.upgrade(url)
            with probe.begin() as conn:
                assert conn.execute(text("SELECT outcome, fencing_token FROM job_claim('job-old-code', 'w1', 5)")) \
                    .one() == ("claimed", 1)
                assert conn.execute(text("SELECT outcome FROM job_claim('job-old-code', 'w2', 5)")).scalar_one() \
                    == "busy"
        finally:
            probe.dispose()


def first_claim(engine: Engine, job_id: str, **kwargs) -> claims.ClaimResult | None:
    """``claim_first`` as a worker sends it: one statement in autocommit."""
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        return claims.claim_first(conn, job_id, **kwargs)


def delivered(engine: Engine, job_id: str, **kwargs) -> claims.ClaimResult:
    """A delivery as a worker claims it (``workers.server``): the first claim alone, else the claim in a transaction."""
    return first_claim(engine, job_id, **kwargs) or do(engine, claims.claim, job_id, **kwargs)


def test_a_first_claim_is_one_statement_and_any_later_delivery_is_decided_by_the_claim(engine: Engine) -> None:
    job = new_job_id()
    first = first_claim(engine, job, worker_id="w1", lease_s=30)
    assert first is not None and (first.outcome, first.fencing_token, first.newly_unknown) == ("claimed", 1, False)
    with engine.connect() as conn:
        row = claims.get(conn, job)
    assert (row["state"], row["worker_id"], row["claims"], row["deliveries"]) == ("running", "w1", 1, 1)
    assert row["lease_expires_at"] == first.lease_expires_at
    # Claimed before: the first claim gives way (changes nothing), and the claim in a transaction says busy.
    assert first_claim(engine, job, worker_id="w2", lease_s=30) is None
    with engine.connect() as conn:
        assert claims.get(conn, job)["deliveries"] == 1
    assert do(engine, claims.claim, job, worker_id="w2", lease_s=30).outcome == "busy"
    # A finished job, or one whose lease expired, is never claimed first again: the claim decides, as before.
    t0 = clock()
    expired = new_job_id()
    assert first_claim(engine, expired, worker_id="crashed", lease_s=20, now=t0).outcome == "claimed"
    late = t0 + timedelta(seconds=21)
    assert first_claim(engine, expired, worker_id="w3", lease_s=20, now=late) is None
    found = delivered(engine, expired, worker_id="w3", lease_s=20, now=late)
    assert (found.outcome, found.newly_unknown) == ("lease_expired_unknown", True)


def test_five_concurrent_first_deliveries_of_one_job_claim_it_exactly_once(engine: Engine) -> None:
    for _ in range(10):
        job = new_job_id()
        results = at_once(5, lambda i: delivered(engine, job, worker_id=f"w{i}", lease_s=30))
        assert sorted(r.outcome for r in results) == ["busy", "busy", "busy", "busy", "claimed"]
        with engine.connect() as conn:
            row = claims.get(conn, job)
        assert row["fencing_token"] == 1 and row["claims"] == 1 and row["deliveries"] == 5


def claimed_in_a_transaction(engine: Engine, job_id: str, **kwargs) -> claims.ClaimResult:
    """``claim`` as a worker sends it once a first claim gave way: in a transaction of its own."""
    return do(engine, claims.claim, job_id, **kwargs)


@pytest.mark.parametrize("claim_path", [claimed_in_a_transaction, first_claim], ids=[
    "claimed_in_a_transaction_by_job_claim", "claimed_first_in_autocommit_by_job_claim_first"])
def test_a_claim_that_waited_for_an_aborted_concurrent_claim_gets_its_whole_lease(
    engine: Engine, claim_path: Callable[..., claims.ClaimResult | None],
) -> None:
    job_id = new_job_id()
    first = engine.connect()
    first.begin()
    assert claims.claim(first, job_id, worker_id="stalls", lease_s=2.0).outcome == "claimed"  # not committed yet
    waited: dict = {}
    first_pid = first.execute(text("SELECT pg_backend_pid()")).scalar_one()
    thread = threading.Thread(target=lambda: waited.update(claim=claim_path(engine, job_id, worker_id="second",
                                                                            lease_s=2.0)))
    thread.start()
    wait_until_blocked_by(engine, first_pid, "the second claim never waited on the first's insert")
    # What this tests is a claim that waited longer than job_claim_first's 50 ms before its lease is counted again:
    # the first holds its insert until the second's wait is twice that by the database's clock.
    wait_until_waited(engine, first_pid, 2 * FIRST_CLAIM_WAIT_S, "the second claim never waited 0.1 s")
    stalled_until = first.execute(text("SELECT clock_timestamp()")).scalar_one()
    first.rollback()  # the stalled claim's transaction fails
    first.close()
    thread.join(10)
    result = waited["claim"]
    assert result is not None and result.outcome == "claimed" and result.fencing_token == 1
    # Counted from when it was claimed (after the rollback), not from when its delivery began to wait.
    assert result.lease_expires_at >= stalled_until + timedelta(seconds=2.0)
