"""The ledger's operations against real PostgreSQL: outcomes, replays, once-only resolution, expiry, audit."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger import operations as ops
from ledger.errors import AdjustRefused, GrantRefused, LedgerInputInvalid, ResolutionRefused
from tests.ledger.conftest import new_customer, new_job, verified

pytestmark = pytest.mark.timeout(60)


def funded(ledger, customer, credits=100, *, now, skills=("review",), **kw):
    return ledger.grant(customer, credits, operator="test", skills=list(skills), now=now, **kw)


def lot_numbers(ledger, customer, now):
    view = ledger.account(customer, now=now)
    return {lot.lot_id: (lot.granted, lot.held, lot.spent, lot.expired, lot.removed) for lot in view.lots}


# --- grant ------------------------------------------------------------------


def test_a_grant_creates_a_lot_an_entitlement_and_an_account(ledger, customer, t0):
    granted = funded(ledger, customer, 120, now=t0, expires_at=t0 + timedelta(days=30), max_parallel=3)
    assert granted.outcome == "created" and granted.credits == 120 and granted.max_parallel == 3
    view = ledger.account(customer, now=t0)
    assert (view.available, view.held, view.open_reservations, view.max_parallel) == (120, 0, 0, 3)
    assert [(e.skill, e.active) for e in view.entitlements] == [("review", True)]
    assert ledger.verify(customer) == []


def test_a_replayed_grant_answers_exists_and_moves_nothing(ledger, customer, t0):
    first = funded(ledger, customer, 50, now=t0, idempotency_key=f"inv-{customer}", expires_in=timedelta(days=7))
    again = funded(
        ledger, customer, 50, now=t0 + timedelta(hours=3), idempotency_key=f"inv-{customer}", expires_in=timedelta(days=7)
    )
    assert (first.outcome, again.outcome) == ("created", "exists")
    assert again.grant_id == first.grant_id and again.expires_at == first.expires_at
    assert ledger.account(customer, now=t0).available == 50


def test_the_same_grant_key_with_other_inputs_is_refused(ledger, customer, t0):
    funded(ledger, customer, 50, now=t0, idempotency_key=f"k-{customer}")
    with pytest.raises(GrantRefused) as refused:
        funded(ledger, customer, 51, now=t0, idempotency_key=f"k-{customer}")
    assert refused.value.code == "grant_idempotency_mismatch"
    assert "new key" in refused.value.message
    assert ledger.account(customer, now=t0).available == 50


def test_a_second_grant_never_extends_the_first_lots_expiry(ledger, customer, t0):
    short = funded(ledger, customer, 10, now=t0, expires_at=t0 + timedelta(days=1))
    long = funded(ledger, customer, 10, now=t0, expires_at=t0 + timedelta(days=90))
    lots = {lot.lot_id: lot.expires_at for lot in ledger.account(customer, now=t0).lots}
    assert lots[short.lot_id] == t0 + timedelta(days=1)
    assert lots[long.lot_id] == t0 + timedelta(days=90)
    later = t0 + timedelta(days=2)
    assert ledger.account(customer, now=later).available == 10


def test_a_grant_that_lowers_max_parallel_below_open_reservations_is_refused(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0, max_parallel=4)
    for _ in range(3):
        assert ledger.reserve(customer, new_job(), "fp", "review", 1, now=t0).outcome == "created"
    with pytest.raises(GrantRefused) as refused:
        funded(ledger, customer, 1, now=t0, max_parallel=2)
    assert refused.value.code == "max_parallel_below_open"
    assert ledger.account(customer, now=t0).max_parallel == 4


def test_a_grant_that_expires_in_the_past_is_refused(ledger, customer, t0):
    with pytest.raises(GrantRefused) as refused:
        funded(ledger, customer, 5, now=t0, expires_at=t0 - timedelta(seconds=1))
    assert refused.value.code == "expiry_not_in_future"


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"credits": -1}, "between 0 and"),
        ({"credits": 10**13}, "SPECIALISTS_LEDGER_MAX_CREDITS_PER_OPERATION"),
        ({"customer": "Not Valid"}, "customer id"),
        ({"skills": ["bad skill"]}, "skill"),
        ({"credits": 0, "skills": []}, "credits, skills, or both"),
        ({"priority": 5000}, "priority"),
    ],
)
def test_bad_grant_inputs_are_refused_before_reaching_the_database(ledger, t0, kwargs, says):
    args = {"customer": new_customer(), "credits": 10, "skills": ["review"]} | kwargs
    with pytest.raises(LedgerInputInvalid) as invalid:
        ledger.grant(args.pop("customer"), args.pop("credits"), operator="test", now=t0, **args)
    assert says in invalid.value.message
    assert invalid.value.code == "ledger_input_invalid"


# --- reserve ----------------------------------------------------------------


def test_a_reservation_holds_credits_and_a_slot(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0, max_parallel=2)
    job = new_job()
    reserved = ledger.reserve(customer, job, "fp-1", "review", 30, now=t0)
    assert reserved.outcome == "created" and reserved.ok
    assert reserved.available == 70 and reserved.open_reservations == 1
    assert sum(h.credits for h in reserved.holds) == 30
    view = ledger.account(customer, now=t0)
    assert (view.available, view.held, view.open_reservations) == (70, 30, 1)
    assert [r.job_id for r in view.unresolved] == [job]


def test_a_replayed_reservation_returns_the_original_and_moves_nothing(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0)
    job = new_job()
    first = ledger.reserve(customer, job, "fp-1", "review", 30, now=t0)
    again = ledger.reserve(customer, job, "fp-1", "review", 45, now=t0 + timedelta(minutes=5))
    assert again.outcome == "exists" and again.ok
    assert again.credits == 30 and again.holds == first.holds and again.created_at == first.created_at
    view = ledger.account(customer, now=t0)
    assert (view.held, view.open_reservations) == (30, 1)


def test_the_same_job_with_another_fingerprint_is_refused_as_a_mismatch(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0)
    job = new_job()
    ledger.reserve(customer, job, "fp-1", "review", 30, now=t0)
    mismatch = ledger.reserve(customer, job, "fp-2", "review", 30, now=t0)
    assert mismatch.outcome == "exists_mismatch" and not mismatch.ok
    assert mismatch.refusal().code == "exists_mismatch"
    assert ledger.account(customer, now=t0).held == 30


def test_job_ids_are_global_and_another_customers_job_reveals_nothing(ledger, customer, t0):
    other = new_customer()
    funded(ledger, customer, 100, now=t0)
    funded(ledger, other, 100, now=t0)
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 30, now=t0)
    taken = ledger.reserve(other, job, "fp", "review", 30, now=t0)
    assert taken.outcome == "exists_mismatch"
    assert taken.credits is None and taken.holds == () and taken.customer_id == other
    assert ledger.account(other, now=t0).held == 0


def test_a_customer_without_the_skill_is_not_entitled(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0, skills=["review"])
    refused = ledger.reserve(customer, new_job(), "fp", "translate", 5, now=t0)
    assert refused.outcome == "not_entitled"
    assert "specialists credits grant --skill" in refused.refusal().message
    assert ledger.reserve(new_customer(), new_job(), "fp", "review", 5, now=t0).outcome == "not_entitled"


def test_an_expired_entitlement_answers_expired(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0, skill_expires_at=t0 + timedelta(hours=1))
    assert ledger.reserve(customer, new_job(), "fp", "review", 5, now=t0).outcome == "created"
    late = ledger.reserve(customer, new_job(), "fp", "review", 5, now=t0 + timedelta(hours=1))
    assert late.outcome == "expired" and late.expired_at == t0 + timedelta(hours=1)


def test_when_every_lot_has_expired_a_reservation_answers_expired(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0, expires_at=t0 + timedelta(days=1))
    refused = ledger.reserve(customer, new_job(), "fp", "review", 5, now=t0 + timedelta(days=1, seconds=1))
    assert refused.outcome == "expired" and refused.available == 0
    assert refused.expired_at == t0 + timedelta(days=1)


def test_too_few_credits_answers_insufficient_with_the_numbers(ledger, customer, t0):
    funded(ledger, customer, 40, now=t0)
    refused = ledger.reserve(customer, new_job(), "fp", "review", 50, now=t0)
    assert refused.outcome == "insufficient_credits"
    assert refused.refusal().message.startswith(f"customer {customer} has 40 credits available; this task reserves 50")
    # a spent-out but unexpired lot is "insufficient", not "expired"
    ledger.reserve(customer, new_job(), "fp", "review", 40, now=t0)
    assert ledger.reserve(customer, new_job(), "fp", "review", 1, now=t0).outcome == "insufficient_credits"


def test_the_concurrency_cap_counts_open_reservations(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0, max_parallel=2)
    jobs = [new_job() for _ in range(3)]
    assert [ledger.reserve(customer, j, "fp", "review", 1, now=t0).outcome for j in jobs] == [
        "created",
        "created",
        "concurrency_cap",
    ]
    capped = ledger.reserve(customer, jobs[2], "fp", "review", 1, now=t0)
    assert "max_parallel" in capped.refusal().message
    ledger.settle(jobs[0], 1, "done", now=t0)
    assert ledger.reserve(customer, jobs[2], "fp", "review", 1, now=t0).outcome == "created"


def test_draw_down_takes_priority_then_soonest_expiry_then_oldest(ledger, customer, t0):
    late = funded(ledger, customer, 10, now=t0, expires_at=t0 + timedelta(days=60)).lot_id
    never = funded(ledger, customer, 10, now=t0).lot_id
    soon = funded(ledger, customer, 10, now=t0, expires_at=t0 + timedelta(days=5)).lot_id
    promo = funded(ledger, customer, 10, now=t0, expires_at=t0 + timedelta(days=90), priority=10).lot_id
    fifo_a = funded(ledger, customer, 10, now=t0, expires_at=t0 + timedelta(days=5)).lot_id
    reserved = ledger.reserve(customer, new_job(), "fp", "review", 45, now=t0)
    assert [(h.lot_id, h.credits) for h in reserved.holds] == [(promo, 10), (soon, 10), (fifo_a, 10), (late, 10), (never, 5)]


def test_a_reservation_inside_the_callers_transaction_rolls_back_with_it(engine, ledger, customer, t0):
    funded(ledger, customer, 100, now=t0)
    job = new_job()
    with engine.connect() as conn:
        with conn.begin() as tx:
            assert ops.reserve(conn, customer, job, "fp", "review", 30, now=t0).outcome == "created"
            conn.execute(text("SELECT 1"))  # the caller's own writes would go here
            tx.rollback()
    assert ledger.reservation(job) is None
    assert ledger.account(customer, now=t0).held == 0
    with engine.begin() as conn:
        assert ops.reserve(conn, customer, job, "fp", "review", 30, now=t0).outcome == "created"
    assert ledger.reservation(job).state == "open"
    assert ledger.verify(customer) == []


# --- settle / void ----------------------------------------------------------


def test_settle_charges_part_and_releases_the_rest_exactly_once(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0)
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 30, now=t0)
    settled = ledger.settle(job, 12, "completed", now=t0)
    assert (settled.outcome, settled.charged, settled.released, settled.expired) == ("settled", 12, 18, 0)
    again = ledger.settle(job, 12, "completed again", now=t0)
    assert again.outcome == "exists" and again.reason == "completed"
    view = ledger.account(customer, now=t0)
    assert (view.available, view.held, view.open_reservations) == (88, 0, 0)
    assert ledger.verify(customer) == []


def test_settling_with_a_different_amount_is_refused(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0)
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 30, now=t0)
    ledger.settle(job, 12, now=t0)
    with pytest.raises(ResolutionRefused) as refused:
        ledger.settle(job, 13, now=t0)
    assert refused.value.code == "settle_mismatch"
    with pytest.raises(ResolutionRefused):
        ledger.void(job, now=t0)
    assert ledger.account(customer, now=t0).available == 88


def test_a_charge_above_the_reservation_is_refused(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0)
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 30, now=t0)
    with pytest.raises(ResolutionRefused) as refused:
        ledger.settle(job, 31, now=t0)
    assert refused.value.code == "charge_exceeds_reserved"
    assert ledger.reservation(job).state == "open"


def test_settling_an_unknown_job_id_is_refused(ledger):
    with pytest.raises(ResolutionRefused) as refused:
        ledger.settle(new_job(), 1)
    assert refused.value.code == "reservation_not_found"


def test_void_releases_everything_and_counts_as_a_zero_settlement(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0)
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 30, now=t0)
    voided = ledger.void(job, "canceled", now=t0)
    assert (voided.state, voided.charged, voided.released) == ("voided", 0, 30)
    assert ledger.settle(job, 0, now=t0).outcome == "exists"
    assert ledger.account(customer, now=t0).available == 100


def test_concurrent_settlements_of_one_job_resolve_it_once(engine, ledger, customer, t0):
    import threading

    funded(ledger, customer, 100, now=t0)
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 30, now=t0)
    barrier = threading.Barrier(8)
    answers: list[str] = []

    def settle() -> None:
        barrier.wait()
        answers.append(ledger.settle(job, 10, "done", now=t0).outcome)

    threads = [threading.Thread(target=settle) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers) == ["exists"] * 7 + ["settled"]
    assert ledger.account(customer, now=t0).available == 90
    assert ledger.verify(customer) == []


# --- expiry -----------------------------------------------------------------


def test_expiry_moves_the_unreserved_remainder_to_breakage_and_never_an_open_hold(ledger, customer, t0):
    lot = funded(ledger, customer, 100, now=t0, expires_at=t0 + timedelta(days=1)).lot_id
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 30, now=t0)
    after = t0 + timedelta(days=1, minutes=1)
    moved = [m for m in ledger.expire(now=after) if m.customer_id == customer]
    assert [(m.lot_id, m.credits) for m in moved] == [(lot, 70)]
    assert lot_numbers(ledger, customer, after)[lot] == (100, 30, 0, 70, 0)
    assert ledger.reservation(job).state == "open"
    assert [m for m in ledger.expire(now=after + timedelta(hours=1)) if m.customer_id == customer] == []
    # The hold settles normally; the released part of the expired lot goes to breakage, not back.
    settled = ledger.settle(job, 10, "done", now=after)
    assert (settled.charged, settled.released, settled.expired) == (10, 0, 20)
    assert lot_numbers(ledger, customer, after)[lot] == (100, 0, 10, 90, 0)
    assert ledger.account(customer, now=after).available == 0
    assert ledger.verify(customer) == []


def test_a_hold_released_after_expiry_but_before_the_sweep_also_goes_to_breakage(ledger, customer, t0):
    lot = funded(ledger, customer, 50, now=t0, expires_at=t0 + timedelta(hours=2)).lot_id
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 20, now=t0)
    voided = ledger.void(job, "canceled", now=t0 + timedelta(hours=3))
    assert (voided.released, voided.expired) == (0, 20)
    assert lot_numbers(ledger, customer, t0)[lot] == (50, 0, 0, 20, 0)
    moved = [m for m in ledger.expire(now=t0 + timedelta(hours=3)) if m.customer_id == customer]
    assert [(m.lot_id, m.credits) for m in moved] == [(lot, 30)]
    assert ledger.verify(customer) == []


def test_the_expiry_sweep_is_bounded_per_call(ledger, customer, t0):
    for _ in range(3):
        funded(ledger, customer, 5, now=t0, expires_at=t0 + timedelta(minutes=1))
    later = t0 + timedelta(minutes=2)
    first = ledger.expire(now=later, max_lots=1)
    assert len(first) <= 1
    for _ in range(10):
        if not ledger.expire(now=later, max_lots=2):
            break
    assert ledger.account(customer, now=later).expired_unswept == 0
    assert all(lot.expired == 5 for lot in ledger.account(customer, now=later).lots)


# --- unknown outcomes and reconcile -------------------------------------------


def test_an_unknown_reservation_keeps_its_hold_and_its_slot(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0, max_parallel=1)
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 30, now=t0)
    marked = ledger.mark_unknown(job, "worker lease expired while running", "ops-anna", now=t0)
    assert (marked.outcome, marked.state, marked.unknown_by) == ("marked", "unknown", "ops-anna")
    assert ledger.mark_unknown(job, "again", "ops-anna", now=t0).outcome == "exists"
    view = ledger.account(customer, now=t0)
    assert (view.held, view.open_reservations) == (30, 1)
    assert ledger.reserve(customer, new_job(), "fp", "review", 1, now=t0).outcome == "concurrency_cap"
    with pytest.raises(ResolutionRefused) as refused:
        ledger.settle(job, 30, now=t0)
    assert refused.value.code == "reservation_unknown"
    assert f"specialists reconcile {job}" in refused.value.message
    assert [r.job_id for r in ledger.reservations(customer_id=customer, states=("unknown",))] == [job]


def test_reconcile_resolves_an_unknown_reservation_once_with_an_audit_record(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0)
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 30, now=t0)
    ledger.mark_unknown(job, "worker crashed", "ops-anna", now=t0)
    when = t0 + timedelta(hours=2)
    done = ledger.reconcile(job, 25, "provider logs show the run completed", "ops-ben", now=when)
    assert (done.outcome, done.state, done.charged, done.released) == ("reconciled", "reconciled", 25, 5)
    assert ledger.reconcile(job, 25, "retry of the same command", "ops-ben", now=when).outcome == "exists"
    with pytest.raises(ResolutionRefused) as refused:
        ledger.reconcile(job, 0, "second thoughts", "ops-carl", now=when)
    assert refused.value.code == "reservation_already_resolved"
    audit = ledger.reservation(job)
    assert (audit.resolution_kind, audit.resolved_by, audit.resolution_reason, audit.resolved_at) == (
        "reconcile",
        "ops-ben",
        "provider logs show the run completed",
        when,
    )
    assert (audit.unknown_by, audit.unknown_reason) == ("ops-anna", "worker crashed")
    assert ledger.settle(job, 25, now=when).outcome == "exists"
    assert ledger.account(customer, now=when).available == 75
    assert ledger.verify(customer) == []


def test_reconciling_an_open_reservation_says_to_mark_it_unknown_first(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0)
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 30, now=t0)
    with pytest.raises(ResolutionRefused) as refused:
        ledger.reconcile(job, 0, "why", "ops", now=t0)
    assert refused.value.code == "reservation_not_unknown"
    assert "mark-unknown" in refused.value.message


def test_a_reconcile_needs_a_reason(ledger):
    with pytest.raises(LedgerInputInvalid) as invalid:
        ledger.reconcile(new_job(), 0, "  ", "ops")
    assert "--reason" in invalid.value.message


# --- adjust -----------------------------------------------------------------


def test_a_positive_adjustment_adds_a_lot_and_a_negative_one_removes_available_credits(ledger, customer, t0):
    funded(ledger, customer, 50, now=t0)
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 40, now=t0)
    added = ledger.adjust(customer, 15, "goodwill after incident 42", "ops", now=t0)
    assert (added.available, len(added.lots)) == (25, 1)
    removed = ledger.adjust(customer, -25, "double grant on invoice 7", "ops", now=t0)
    assert removed.available == 0 and sum(h.credits for h in removed.lots) == 25
    with pytest.raises(AdjustRefused) as refused:
        ledger.adjust(customer, -1, "too far", "ops", now=t0)
    assert refused.value.code == "adjust_exceeds_available"
    assert ledger.reservation(job).state == "open"  # the hold was never touched
    kinds = [(line.kind, line.from_account, line.to_account, line.operator) for line in ledger.history(customer, limit=3)]
    assert kinds[0] == ("adjust", "customer_available", "adjustments", "ops")
    assert ledger.verify(customer) == []


def test_adjusting_a_customer_without_an_account_is_refused(ledger):
    with pytest.raises(AdjustRefused) as refused:
        ledger.adjust(new_customer(), 5, "why", "ops")
    assert refused.value.code == "account_not_found"


# --- journal and verify -------------------------------------------------------


def test_every_journal_entry_balances_and_totals_sum_to_zero(ledger, customer, t0):
    funded(ledger, customer, 100, now=t0)
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 30, now=t0)
    ledger.settle(job, 10, now=t0)
    assert sum(total.balance for total in ledger.totals()) == 0
    history = ledger.history(customer, limit=10)
    assert [line.kind for line in reversed(history)] == ["grant", "reserve", "settle", "settle"]


def test_the_journal_is_append_only(engine, ledger, customer, t0):
    funded(ledger, customer, 100, now=t0)
    for statement in (
        "UPDATE ledger_journal SET credits = credits + 1 WHERE customer_id = :c",
        "DELETE FROM ledger_journal WHERE customer_id = :c",
        "UPDATE ledger_grants SET credits = 1 WHERE customer_id = :c",
    ):
        with pytest.raises(DBAPIError) as refused:
            with engine.begin() as conn:
                conn.execute(text(statement), {"c": customer})
        assert "append-only" in str(refused.value)


def test_the_schema_refuses_an_overspent_lot_even_from_a_buggy_caller(engine, ledger, customer, t0):
    lot = funded(ledger, customer, 10, now=t0).lot_id
    with pytest.raises(DBAPIError):
        with engine.begin() as conn:
            conn.execute(text("UPDATE ledger_lots SET held = held + 11 WHERE lot_id = :l"), {"l": lot})
    with pytest.raises(DBAPIError):
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE ledger_accounts SET open_reservations = max_parallel + 1 WHERE customer_id = :c"),
                {"c": customer},
            )


def test_verify_finds_a_planted_journal_row(engine, ledger, customer, t0):
    lot = funded(ledger, customer, 100, now=t0).lot_id
    assert ledger.verify(customer) == []
    with engine.begin() as conn:  # a posting that no operation made: the lot row does not agree
        conn.execute(
            text(
                "INSERT INTO ledger_journal (entry_id, at, kind, customer_id, lot_id, from_account, to_account, credits) "
                "VALUES (nextval('ledger_entry_seq'), now(), 'adjust', :c, :l, 'customer_available', 'revenue', 7)"
            ),
            {"c": customer, "l": lot},
        )
    checks = {(v.check, v.subject) for v in verified(ledger, customer)}
    assert ("lot_mismatch", f"lot {lot} of {customer}") in checks


def test_verify_finds_a_held_total_that_no_reservation_explains(engine, ledger, t0):
    customer = new_customer("planted")
    funded(ledger, customer, 100, now=t0)
    with engine.begin() as conn:
        conn.execute(text("UPDATE ledger_accounts SET held = 5 WHERE customer_id = :c"), {"c": customer})
    checks = {v.check for v in verified(ledger, customer)}
    assert "account_held_mismatch" in checks


def test_verify_finds_a_job_resolved_twice(engine, ledger, customer, t0):
    lot = funded(ledger, customer, 100, now=t0).lot_id
    job = new_job()
    ledger.reserve(customer, job, "fp", "review", 10, now=t0)
    ledger.settle(job, 10, now=t0)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO ledger_journal (entry_id, at, kind, customer_id, lot_id, job_id, from_account, "
                "to_account, credits) VALUES (nextval('ledger_entry_seq'), now(), 'settle', :c, :l, :j, "
                "'customer_held', 'revenue', 10)"
            ),
            {"c": customer, "l": lot, "j": job},
        )
    checks = {v.check for v in verified(ledger, customer)}
    assert {"resolved_twice", "hold_mismatch"} <= checks


def test_reads_of_an_unknown_customer_are_empty(ledger):
    assert ledger.account(new_customer()) is None
    assert ledger.history(new_customer()) == []


def test_the_same_statements_run_unchanged_on_an_async_connection(database_url, settings, ledger, customer, t0):
    """The A2A edge is async: the statement text, parameters and parsers need no async rewrite."""
    import asyncio

    from core.db import make_async_engine
    from ledger import statements as st
    from ledger.limits import default_limits

    funded(ledger, customer, 100, now=t0)
    job = new_job()

    async def reserve_and_settle() -> tuple[str, str]:
        engine = make_async_engine(database_url, settings)
        try:
            async with engine.begin() as conn:
                params = st.reserve_params(customer, job, "fp", "review", 30, now=t0, limits=default_limits())
                reserved = st.parse_reserve((await conn.exec_driver_sql(st.RESERVE_SQL, params)).mappings().one())
            async with engine.begin() as conn:
                params = st.settle_params(job, 20, "done", now=t0, limits=default_limits())
                row = (await conn.exec_driver_sql(st.SETTLE_SQL, params)).mappings().one()
                settled = st.parse_resolve(row, charged=20)
            return reserved.outcome, settled.outcome
        finally:
            await engine.dispose()

    assert asyncio.run(reserve_and_settle()) == ("created", "settled")
    assert ledger.account(customer, now=t0).available == 80


def test_available_credits_cover_every_lot_whatever_the_listing_limit(engine, ledger, customer, t0):
    from ledger import reads

    for credits in (5, 7, 11):
        funded(ledger, customer, credits, now=t0)
    with engine.connect() as conn:
        view = reads.account(conn, customer, now=t0, max_rows=1)
    assert view.available == 23 and len(view.lots) == 1


def test_an_autocommit_engine_keeps_its_mode_after_ledger_calls(database_url, settings, customer, t0):
    from sqlalchemy import create_engine

    from ledger.client import Ledger

    engine = create_engine(database_url, isolation_level="AUTOCOMMIT", pool_size=1, max_overflow=0)
    try:
        ledger = Ledger(engine)
        funded(ledger, customer, 10, now=t0)
        with engine.connect() as conn:
            assert conn.connection.driver_connection.autocommit is True
    finally:
        engine.dispose()
