"""64 threads racing on one account: never overspent, exactly the affordable number succeed, the cap holds."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import pytest

from tests.ledger.conftest import new_job

pytestmark = pytest.mark.timeout(120)

RACERS = 64


def race(action: Callable[[int], str], racers: int = RACERS) -> Counter:
    """Run ``action(i)`` in ``racers`` threads released at the same instant; count the answers."""
    barrier = threading.Barrier(racers)
    answers: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run(index: int) -> None:
        barrier.wait()
        try:
            answer = action(index)
        except BaseException as problem:  # surfaced below: a racer must not fail silently
            with lock:
                errors.append(problem)
            return
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert not errors, errors[:3]
    return Counter(answers)


def test_racing_reservations_never_overspend_and_exactly_the_affordable_number_succeed(ledger, customer, t0):
    ledger.grant(customer, 250, operator="test", skills=["review"], max_parallel=RACERS, now=t0)
    jobs = [new_job() for _ in range(RACERS)]
    answers = race(lambda i: ledger.reserve(customer, jobs[i], "fp", "review", 10, now=t0).outcome)
    assert answers == Counter({"created": 25, "insufficient_credits": RACERS - 25})
    view = ledger.account(customer, now=t0)
    assert (view.available, view.held, view.open_reservations) == (0, 250, 25)
    assert ledger.verify(customer) == []


def test_racing_reservations_spread_over_several_lots_hold_each_lot_exactly(ledger, customer, t0):
    for credits in (7, 11, 13, 19):  # 50 credits in lots that do not divide evenly by the reservation
        ledger.grant(customer, credits, operator="test", skills=["review"], max_parallel=RACERS, now=t0)
    jobs = [new_job() for _ in range(RACERS)]
    answers = race(lambda i: ledger.reserve(customer, jobs[i], "fp", "review", 3, now=t0).outcome)
    assert answers["created"] == 16  # 16 * 3 = 48 <= 50 < 51
    view = ledger.account(customer, now=t0)
    assert view.held == 48 and view.available == 2
    assert all(lot.remaining >= 0 for lot in view.lots)
    assert ledger.verify(customer) == []


def test_with_a_cap_of_n_exactly_n_are_open_at_once_and_settling_makes_room(ledger, customer, t0):
    cap = 5
    ledger.grant(customer, 10_000, operator="test", skills=["review"], max_parallel=cap, now=t0)
    jobs = [new_job() for _ in range(RACERS)]
    answers = race(lambda i: ledger.reserve(customer, jobs[i], "fp", "review", 1, now=t0).outcome)
    assert answers == Counter({"created": cap, "concurrency_cap": RACERS - cap})
    assert ledger.account(customer, now=t0).open_reservations == cap

    for reservation in ledger.reservations(customer_id=customer, states=("open",)):
        ledger.settle(reservation.job_id, 1, "done", now=t0)
    assert ledger.account(customer, now=t0).open_reservations == 0

    second = [new_job() for _ in range(RACERS)]
    answers = race(lambda i: ledger.reserve(customer, second[i], "fp", "review", 1, now=t0).outcome)
    assert answers["created"] == cap
    assert ledger.account(customer, now=t0).open_reservations == cap
    assert ledger.verify(customer) == []


def test_racing_reserve_settle_pairs_keep_the_books_exact(ledger, customer, t0):
    ledger.grant(customer, 1_000, operator="test", skills=["review"], max_parallel=8, now=t0)
    charged: list[int] = []

    def pair(index: int) -> str:
        job = new_job()
        reserved = ledger.reserve(customer, job, "fp", "review", 4, now=t0)
        if reserved.outcome != "created":
            return reserved.outcome
        settled = ledger.settle(job, index % 5, "done", now=t0, customer_id=customer)  # batched with the reserves
        charged.append(settled.charged)
        return "settled"

    answers = race(pair)
    assert set(answers) <= {"settled", "concurrency_cap"} and answers["settled"] >= 8
    view = ledger.account(customer, now=t0)
    assert (view.available, view.held, view.open_reservations) == (1_000 - sum(charged), 0, 0)
    assert ledger.verify(customer) == []
