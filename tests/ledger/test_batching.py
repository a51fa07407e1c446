"""Concurrent reserves and settles of one customer share one transaction, and each keeps its own answer.

The batches are made with real concurrency: a test holds the customer's lock in a
transaction of its own, so the first two calls (the statements a customer may have in
flight) block in the database while the others queue behind them; releasing the lock
lets the queue go in ``ledger_batch`` calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from ledger import statements as st
from ledger.batching import STATEMENTS_IN_FLIGHT_PER_CUSTOMER, Call, CustomerBatches
from ledger.client import Ledger
from ledger.errors import LedgerInputInvalid, ResolutionRefused
from ledger.limits import SCHEMA_MAX_OPERATIONS_PER_BATCH, default_limits
from tests.ledger.conftest import new_customer, new_job

pytestmark = pytest.mark.timeout(120)

WAIT_S = 60  # a guard against a hang, never a figure


@contextmanager
def customer_locked(engine, customer_id: str) -> Iterator[None]:
    """Hold the customer's ledger lock until the block ends (a transaction that commits nothing)."""
    with engine.connect() as conn:
        conn.execute(text("SELECT ledger_lock_customer(:c)"), {"c": customer_id})
        yield
        conn.rollback()


def run_queued(batches: CustomerBatches, customer_id: str, engine, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run calls[0] and calls[1] blocked on the customer's lock, queue the rest, then release: each one's answer."""
    answers: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            answers[index] = calls[index]()
        except Exception as problem:  # compared by the test: a refusal is this call's answer
            answers[index] = problem

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    in_flight = STATEMENTS_IN_FLIGHT_PER_CUSTOMER
    with customer_locked(engine, customer_id):
        for index, thread in enumerate(threads[:in_flight]):
            thread.start()
            assert batches.wait_until(customer_id, running=index + 1, waiting=0, timeout_s=WAIT_S)
        for thread in threads[in_flight:]:
            thread.start()
        assert batches.wait_until(customer_id, running=in_flight, waiting=len(calls) - in_flight, timeout_s=WAIT_S)
    for thread in threads:
        thread.join(WAIT_S)
    return answers


def test_calls_that_queue_behind_a_running_one_go_as_one_batch_and_each_gets_its_own_answer(engine):
    ledger = Ledger(engine)
    customer = new_customer()
    ledger.grant(customer, 20, operator="test", skills=["review"], max_parallel=8)
    open_jobs = [new_job() for _ in range(3)]
    for job in open_jobs:
        ledger.reserve(customer, job, "fp", "review", 5)
    first, fits, too_much, unentitled = new_job(), new_job(), new_job(), new_job()

    answers = run_queued(
        ledger.batches,
        customer,
        engine,
        [
            lambda: ledger.reserve(customer, first, "fp", "review", 1).outcome,  # runs alone, blocked
            lambda: ledger.settle(open_jobs[0], 5, "done", customer_id=customer).outcome,  # runs alone, blocked
            lambda: ledger.settle(open_jobs[1], 99, "too much", customer_id=customer),  # refused
            lambda: ledger.reserve(customer, fits, "fp", "review", 4).outcome,
            lambda: ledger.reserve(customer, too_much, "fp", "review", 50).outcome,  # refused
            lambda: ledger.reserve(customer, unentitled, "fp", "translate", 1).outcome,  # refused
            lambda: ledger.settle(new_job(), 1, "no such job", customer_id=customer),  # refused
            lambda: ledger.reserve(customer, open_jobs[2], "fp", "review", 5).outcome,  # a replay
        ],
    )

    # Six queued calls, two statement slots freed when the lock goes: one batch carries at least three.
    assert ledger.batches.largest_batch >= 3
    assert answers[0:2] == ["created", "settled"]
    assert isinstance(answers[2], ResolutionRefused) and answers[2].code == "charge_exceeds_reserved"
    assert answers[3:6] == ["created", "insufficient_credits", "not_entitled"]
    assert isinstance(answers[6], ResolutionRefused) and answers[6].code == "reservation_not_found"
    assert answers[7] == "exists"
    view = ledger.account(customer)
    assert (view.held, view.open_reservations, view.available) == (5 + 5 + 1 + 4, 4, 0)
    assert ledger.verify(customer) == []


def test_a_batch_runs_its_settlements_first_then_its_reservations_in_order(ledger, customer, t0):
    ledger.grant(customer, 20, operator="test", skills=["review"], max_parallel=3, now=t0)
    held = [new_job(), new_job()]
    for job in held:
        ledger.reserve(customer, job, "fp", "review", 5, now=t0)
    third, fourth = new_job(), new_job()
    operations = [
        ("reserve", st.reserve_params(customer, third, "fp", "review", 10, now=t0, limits=ledger.limits)),
        ("reserve", st.reserve_params(customer, fourth, "fp", "review", 1, now=t0, limits=ledger.limits)),
        ("settle", st.settle_params(held[0], 5, "done", now=t0, limits=ledger.limits)),
        ("settle", st.settle_params(held[0], 4, "again, differently", now=t0, limits=ledger.limits)),
        ("settle", st.settle_params(held[0], 5, "again, the same", now=t0, limits=ledger.limits)),
    ]
    rows = ledger.run_batch(operations)

    # The settlement came first: its slot and its credits were free for the reservations.
    assert [rows[0]["outcome"], rows[1]["outcome"]] == ["created", "insufficient_credits"]
    assert st.parse_resolve(rows[2], charged=5).outcome == "settled"
    with pytest.raises(ResolutionRefused) as refused:
        st.parse_resolve(rows[3], charged=4)
    assert refused.value.code == "settle_mismatch"
    assert st.parse_resolve(rows[4], charged=5).outcome == "exists"
    view = ledger.account(customer, now=t0)
    assert (view.held, view.open_reservations, view.available) == (15, 2, 0)
    assert ledger.verify(customer) == []


def test_a_batch_of_several_customers_moves_each_customers_own_money(ledger, t0):
    owner, other = new_customer(), new_customer()
    for customer in (owner, other):
        ledger.grant(customer, 10, operator="test", skills=["review"], now=t0)
    job, new = new_job(), new_job()
    ledger.reserve(owner, job, "fp", "review", 4, now=t0)
    settled, reserved = ledger.run_batch(
        [
            ("settle", st.settle_params(job, 3, "done", now=t0, limits=ledger.limits)),
            ("reserve", st.reserve_params(other, new, "fp", "review", 6, now=t0, limits=ledger.limits)),
        ]
    )
    assert (settled["outcome"], settled["customer_id"], settled["charged"], settled["released"]) == ("settled", owner, 3, 1)
    assert (reserved["outcome"], reserved["customer_id"], reserved["available"]) == ("created", other, 4)
    assert ledger.account(owner, now=t0).available == 7
    assert ledger.account(other, now=t0).available == 4
    assert ledger.verify(owner) == [] and ledger.verify(other) == []


def test_when_a_batch_statement_fails_each_call_runs_alone_and_keeps_its_own_answer(engine):
    ledger = Ledger(engine)
    customer = new_customer()
    ledger.grant(customer, 10, operator="test", skills=["review"], max_parallel=8)

    def failing_together(customer_id: str, calls: list[Call]) -> list[Any]:
        # A real failure of the batch statement: ledger_batch refuses arrays of different lengths.
        params = st.batch_params([(call.kind, call.params) for call in calls])
        params["skills"] = params["skills"][:-1]
        return ledger._rows(st.BATCH_SQL, params)

    batches = CustomerBatches(ledger._run_alone, failing_together, max_operations=8)
    jobs = [new_job() for _ in range(4)]

    def reserve(job: str, credits: int) -> Callable[[], str]:
        params = st.reserve_params(customer, job, "fp", "review", credits, now=None, limits=ledger.limits)
        return lambda: st.parse_reserve(batches.call(customer, Call("reserve", params))).outcome

    calls = [reserve(jobs[0], 1), reserve(jobs[1], 2), reserve(jobs[2], 50), reserve(jobs[3], 3)]
    answers = run_queued(batches, customer, engine, calls)

    assert answers == ["created", "created", "insufficient_credits", "created"]
    assert batches.batches_run == 0  # the one batch failed; its calls ran one by one
    assert ledger.account(customer).held == 6
    assert ledger.verify(customer) == []


def test_a_batch_carries_at_most_max_operations_per_batch_calls(engine):
    ledger = Ledger(engine, default_limits().model_copy(update={"max_operations_per_batch": 2}))
    customer = new_customer()
    ledger.grant(customer, 100, operator="test", skills=["review"], max_parallel=8)
    jobs = [new_job() for _ in range(6)]

    calls = [lambda job=job: ledger.reserve(customer, job, "fp", "review", 1).outcome for job in jobs]
    answers = run_queued(ledger.batches, customer, engine, calls)

    assert answers == ["created"] * 6
    assert ledger.batches.largest_batch == 2  # four queued behind two alone: the first batch finds at least two
    assert ledger.verify(customer) == []


def test_the_batch_ceiling_is_the_one_the_database_enforces(ledger):
    job = new_job()
    settle = ("settle", st.settle_params(job, 1, "done", now=None, limits=ledger.limits))
    with pytest.raises(LedgerInputInvalid):
        st.batch_params([settle] * (SCHEMA_MAX_OPERATIONS_PER_BATCH + 1))
    too_many = st.batch_params([settle] * SCHEMA_MAX_OPERATIONS_PER_BATCH)
    too_many = {name: values + values[:1] if isinstance(values, list) else values for name, values in too_many.items()}
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        ledger._rows(st.BATCH_SQL, too_many)
    rows = ledger._rows(st.BATCH_SQL, st.batch_params([settle] * SCHEMA_MAX_OPERATIONS_PER_BATCH))
    assert {row["outcome"] for row in rows} == {"not_found"}
