"""A job whose records were pruned is never claimed again: its outbox row is what makes it claimable.

Cloud Tasks delivers at least once and may deliver a job's body late; the claim row is the at-most-once guarantee.
Once the retention has passed, the pruner deletes a finished job's outbox row, then its claim. These tests show
that a delivery that comes after that claims nothing, and that a claim racing the prune either sees the job's
claim (the prune waits for it, or skips the row) or finds no row: never a new claim of a job that ran.
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine, text

from taskstate import claims, ids, outbox
from tests.job_history import one_job
from tests.locks import wait_until_blocked_by
from workers.dispatch.pruner import OUTBOX_PRUNE_SQL, prune_finished_claims, prune_finished_outbox

pytestmark = pytest.mark.timeout(60)

DAY_S = 86_400.0
RETENTION_S = 14 * DAY_S


def finished_long_ago(engine: Engine) -> ids.TaskRef:
    """A job that completed 20 days ago, its task ended: past a 14-day retention."""
    with engine.begin() as conn:
        task_id, dispatch_id = one_job(conn, task_state="completed", row_status="done", claim_state="finished",
                                       days_ago=20)
    return ids.TaskRef(task_id, dispatch_id, "owner-one", task_id)


def claim_of(engine: Engine, ref: ids.TaskRef) -> dict | None:
    with engine.connect() as conn:
        return claims.get(conn, ref.job_id)


def prune_both(engine: Engine) -> None:
    while prune_finished_outbox(engine, retention_s=RETENTION_S, batch=1000):
        pass
    while prune_finished_claims(engine, retention_s=RETENTION_S, batch=1000):
        pass


def test_a_late_delivery_of_a_pruned_job_claims_nothing_and_writes_no_claim(engine: Engine) -> None:
    ref = finished_long_ago(engine)
    with engine.begin() as conn:  # before the prune: the claim answers from the finished claim
        assert claims.claim(conn, ref.job_id, worker_id="late", lease_s=30, ref=ref).outcome == "finished"
    prune_both(engine)
    assert claim_of(engine, ref) is None
    with engine.begin() as conn:
        assert claims.claim(conn, ref.job_id, worker_id="late", lease_s=30, ref=ref).outcome == "gone"
        resumable = claims.claim_resumable(conn, ref.job_id, worker_id="late", lease_s=30, max_resumes=2, ref=ref)
        assert (resumable.claim.outcome, resumable.resumed) == ("gone", False)
    assert claim_of(engine, ref) is None  # nothing was claimed, so nothing can run


def test_a_claim_in_progress_keeps_the_prune_off_its_job_until_it_commits(engine: Engine) -> None:
    ref = finished_long_ago(engine)
    with engine.connect() as claiming:
        with claiming.begin():
            assert claims.claim(claiming, ref.job_id, worker_id="w", lease_s=30, ref=ref).outcome == "finished"
            # The claim holds the row's key-share lock: the prune skips the row, it does not wait or delete it.
            prune_both(engine)
            with engine.connect() as conn:
                assert outbox.row_of_job(conn, ref.job_id).dispatch_id == ref.dispatch_id
        prune_both(engine)
    assert claim_of(engine, ref) is None


def test_a_claim_that_comes_while_the_prune_deletes_the_row_waits_for_it_and_finds_no_row(engine: Engine) -> None:
    ref = finished_long_ago(engine)
    answered: list[str] = []
    with engine.connect() as pruning:
        pruning.begin()
        page = pruning.execute(text(OUTBOX_PRUNE_SQL), {"retention_s": RETENTION_S, "batch": 100_000,
                                                        "after_at": outbox.PRUNE_START[0], "after_id": 0}).one()
        assert page.deleted >= 1
        pid = pruning.execute(text("SELECT pg_backend_pid()")).scalar_one()

        def deliver() -> None:
            with engine.begin() as conn:
                answered.append(claims.claim(conn, ref.job_id, worker_id="w", lease_s=30, ref=ref).outcome)

        late = threading.Thread(target=deliver)
        late.start()
        wait_until_blocked_by(engine, pid, "the claim never waited for the prune")
        pruning.commit()
    late.join(30)
    assert answered == ["gone"]
    prune_both(engine)
    assert claim_of(engine, ref) is None


def test_a_job_still_open_is_claimed_as_before(engine: Engine) -> None:
    with engine.begin() as conn:
        task_id, dispatch_id = one_job(conn, task_state="submitted", row_status="pending", claim_state=None,
                                       days_ago=0)
    ref = ids.TaskRef(task_id, dispatch_id, "owner-one", task_id)
    with engine.begin() as conn:
        claimed = claims.claim(conn, ref.job_id, worker_id="w", lease_s=30, ref=ref)
    assert (claimed.outcome, claimed.fencing_token, claimed.message) == ("claimed", 1, b"\x0a\x00")
