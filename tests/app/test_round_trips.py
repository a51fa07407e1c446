"""What an admission costs the database, counted on the wire: the round trips of a paid SendMessage.

The edge runs as its own process with its database behind a counting proxy
(tests/pgwire.py), which sees every round trip: statements, BEGIN and COMMIT,
pings. The budget (docs/A2A_EDGE.md, "What an admission costs"): two round
trips on the request's path (the rate-limit count, then the admission call),
and the wake-up for the dispatchers after the answer, off the request's path
and shared by the admissions of the moment. These tests count; they never time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from core.settings import Settings

from tests import http_calls
from tests.app.conftest import PAID, PAID_TARIFF, EdgeProcess, message, start_edge, stop_edge
from tests.rlm.holds import wait_until
from tests.pgwire import RoundTripCounter

pytestmark = pytest.mark.timeout(120, func_only=True)

REQUEST_PATH_BUDGET = 2  # round trips a paid admission may make before it answers
SENDS = 12


@pytest.fixture(scope="module")
def counted_edge(database_url: str, edge_specs_dir: Path, edge_logs: Path) -> Iterator[tuple[EdgeProcess, RoundTripCounter]]:
    with RoundTripCounter(database_url) as counter:
        # The key check's revocation cache at its default, as a service runs (the shared test edges turn it off).
        edge = start_edge(counter.url, edge_specs_dir, edge_logs, "counted",
                          revocation_cache_s=str(Settings().keys.revocation_cache_s))
        yield edge, counter
        stop_edge(edge)


def _notifications(counter: RoundTripCounter) -> int:
    return sum("pg_notify" in statement for statement in counter.statements(""))


def _send(edge: EdgeProcess, customer, **extra: object) -> dict:
    answer = http_calls.post(f"{edge.specialist(PAID)}/message:send", json=message(returnImmediately=True, **extra),
                             headers=customer.headers)
    assert answer.status_code == 200, answer.text
    return answer.json()["task"]


def test_a_paid_admission_makes_two_round_trips_before_it_answers(counted_edge, make_customer):
    edge, counter = counted_edge
    customer = make_customer(credits=PAID_TARIFF * (SENDS + 4), max_parallel=SENDS + 4)
    for _ in range(3):  # warm: the pool's connections are open, the key is cached
        _send(edge, customer)
    wait_until(lambda: _notifications(counter) >= 3, what="the warm-up's wake-ups")
    before_trips, before_wakeups = counter.round_trips(""), _notifications(counter)
    before_statements = len(counter.statements(""))
    for sent in range(1, SENDS + 1):
        task = _send(edge, customer)
        assert task["status"]["state"] == "TASK_STATE_SUBMITTED"
        # The wake-up follows the answer; waiting for it here keeps one send's count apart from the next's.
        wait_until(lambda: _notifications(counter) >= before_wakeups + sent, what=f"send {sent}'s wake-up")
    trips = counter.round_trips("") - before_trips
    wakeups = _notifications(counter) - before_wakeups
    ran = counter.statements("")[before_statements:]
    # psycopg prepares a statement on a connection once, at its fifth use there: one round trip, once.
    prepares = sum(statement.startswith("PREPARE ") for statement in ran)
    assert wakeups == SENDS, ran
    assert trips - wakeups - prepares <= REQUEST_PATH_BUDGET * SENDS, (
        f"{trips - wakeups - prepares} round trips for {SENDS} admissions besides their wake-ups "
        f"(budget {REQUEST_PATH_BUDGET} each); what ran: {ran}"
    )
