"""Customers opened by an operator and caps changed without a grant (migration 0220), against real PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger import operations as ops
from ledger.errors import AccountRefused, CustomerNotFound, LedgerInputInvalid
from tests.ledger.conftest import new_customer, new_job, verified

pytestmark = pytest.mark.timeout(60)


def changes(engine, customer: str) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(
            text("SELECT kind::text, max_parallel_before, max_parallel, operator, reason FROM ledger_account_changes "
                 "WHERE customer_id = :c ORDER BY change_id"), {"c": customer})]


def test_an_operators_grant_to_a_customer_nobody_added_writes_nothing(ledger, engine, customer, t0):
    with pytest.raises(CustomerNotFound) as unknown:
        ledger.grant(customer, 10, operator="ops", skills=["review"], require_customer=True, now=t0)
    assert unknown.value.code == "customer_not_found" and f"customers add --customer {customer}" in unknown.value.message
    with engine.begin() as conn:  # the same statement inside a caller's transaction
        with pytest.raises(CustomerNotFound):
            ops.grant(conn, customer, 10, operator="ops", skills=["review"], require_customer=True, now=t0)
    assert ledger.account(customer) is None
    with pytest.raises(CustomerNotFound):
        ledger.require_customer(customer)  # not even a customer row was left behind
    with pytest.raises(LedgerInputInvalid):
        ledger.require_customer("BAD NAME")

    opened = ledger.open_account(customer, operator="ops", reason="contract 7", now=t0)
    granted = ledger.grant(customer, 10, operator="ops", skills=["review"], require_customer=True, now=t0)
    assert (granted.outcome, granted.max_parallel, opened.max_parallel) == ("created", 8, 8)
    assert verified(ledger, customer) == []


def test_an_account_is_opened_once_and_recorded_with_who_and_why(ledger, engine, customer, t0):
    opened = ledger.open_account(customer, operator="alice", max_parallel=3, reason="contract 7", now=t0)
    assert (opened.outcome, opened.max_parallel, opened.open_reservations, opened.at) == ("created", 3, 0, t0)
    again = ledger.open_account(customer, operator="bob", max_parallel=5, now=t0)
    assert (again.outcome, again.max_parallel, again.change_id) == ("exists", 3, None)  # nothing changed
    view = ledger.account(customer, now=t0)
    assert (view.max_parallel, view.available, view.lots) == (3, 0, ())
    assert changes(engine, customer) == [("opened", None, 3, "alice", "contract 7")]


def test_the_cap_changes_without_a_grant_never_below_the_open_reservations_and_is_recorded(ledger, engine, customer,
                                                                                           t0):
    ledger.open_account(customer, operator="ops", now=t0)
    ledger.grant(customer, 100, operator="ops", skills=["review"], now=t0)
    jobs = [new_job() for _ in range(3)]
    for job in jobs[:2]:
        assert ledger.reserve(customer, job, "fp", "review", 10, now=t0).outcome == "created"
    ledger.mark_unknown(jobs[1], "worker lost", "ops", now=t0)  # an unknown one keeps its slot

    with pytest.raises(AccountRefused) as below:
        ledger.set_max_parallel(customer, 1, operator="ops", reason="downgrade", now=t0)
    assert below.value.code == "max_parallel_below_open"
    changed = ledger.set_max_parallel(customer, 2, operator="alice", reason="tier 2", now=t0)
    assert (changed.outcome, changed.max_parallel_before, changed.max_parallel) == ("changed", 8, 2)
    assert ledger.reserve(customer, jobs[2], "fp", "review", 10, now=t0).outcome == "concurrency_cap"
    same = ledger.set_max_parallel(customer, 2, operator="alice", reason="again", now=t0)
    assert (same.outcome, same.change_id) == ("unchanged", None)
    for wrong in (0, -1, True, 100_001):
        with pytest.raises(LedgerInputInvalid) as invalid:
            ledger.set_max_parallel(customer, wrong, operator="ops", reason="x", now=t0)
        assert "--max-parallel" in invalid.value.message
    with pytest.raises(LedgerInputInvalid):
        ledger.set_max_parallel(customer, 4, operator="ops", reason=" ", now=t0)  # a change needs a reason
    with pytest.raises(AccountRefused) as none:
        ledger.set_max_parallel(new_customer(), 4, operator="ops", reason="x", now=t0)
    assert none.value.code == "account_not_found"

    assert changes(engine, customer) == [("opened", None, 8, "ops", ""), ("max_parallel", 8, 2, "alice", "tier 2")]
    with pytest.raises(DBAPIError, match="append-only"), engine.begin() as conn:
        conn.execute(text("UPDATE ledger_account_changes SET reason = 'rewritten' WHERE customer_id = :c"),
                     {"c": customer})
    assert verified(ledger, customer) == []


def test_a_grant_refuses_a_cap_of_0_naming_the_flag_and_what_stops_a_customer(ledger, customer, t0):
    with pytest.raises(LedgerInputInvalid) as zero:
        ledger.grant(customer, 10, operator="ops", skills=["review"], max_parallel=0, now=t0)
    assert "--max-parallel" in zero.value.message and "specialists keys revoke" in zero.value.message
    assert ledger.account(customer) is None
