"""What an admission costs the database, counted on the wire: the round trips of a paid SendMessage.

The edge runs as its own process with its database behind a counting proxy
(tests/pg_wire.py), which sees every round trip: statements, BEGIN and COMMIT,
pings. The budget (docs/A2A_EDGE.md, "What an admission costs the database"):
two round trips on the request's path (the rate-limit count, then the admission
statement), and the wake-up for the dispatchers after the answer, off the
request's path and shared by the admissions of the moment. A blocking send adds
one read for each notification of its task's events, and nothing else (issue 44); a stream reads where its events
start, then once more, then once per notification, each read one round trip.
A pooled connection the server ended costs no request (``core.db``'s checkout
check, no ping). These tests count; they never time.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from a2a.types.a2a_pb2 import TaskState
from sqlalchemy import Engine, text

from core.settings import Settings
from tests import http_calls
from tests.app.conftest import (
    PAID,
    PAID_TARIFF,
    EdgeProcess,
    edge_application_name,
    message,
    start_edge,
    stop_edge,
)
from tests.pg_wire import StatementCounter
from tests.rlm.holds import wait_until
from tests.task_moves import move

pytestmark = pytest.mark.timeout(120, func_only=True)

REQUEST_PATH_BUDGET = 2  # round trips a paid admission may make before it answers
SENDS = 12
# A blocking send whose task works, then completes: the rate-limit count, the admission, the dispatchers' wake-up,
# and one read per notification of its task (the working one finds nothing to answer, the completed one the task).
# The same send cost 19 before issue 44: its wait read the event log (a BEGIN/ROLLBACK pair around the cursor's
# read and each poll of the events, then the task read whole).
BLOCKING_SEND_ROUND_TRIPS = 5
# A streamed send whose task works, then completes: the rate-limit count, the admission, the dispatchers' wake-up,
# the stream's cursor (its task's first event), its first read (nothing yet), and one read per notification. 16
# at 729e253, before issue 44's stream reads: the cursor and every read in a session of its own (BEGIN, the read,
# ROLLBACK), and a read again at once after each read that found an event.
STREAMED_SEND_ROUND_TRIPS = 7


@pytest.fixture(scope="module")
def counted_edge(database_url: str, edge_specs_dir: Path, edge_logs: Path) -> Iterator[tuple[EdgeProcess, StatementCounter]]:
    counter = StatementCounter(database_url)
    # The key check's revocation cache at its default, as a service runs (the shared test edges turn it off).
    # The safety-net poll of a missed notification far apart: a blocking send's reads are its notifications'.
    edge = start_edge(counter.url, edge_specs_dir, edge_logs, "counted",
                      revocation_cache_s=str(Settings().keys.revocation_cache_s),
                      event_poll_interval_s="30", blocking_wait_max_s="900")
    yield edge, counter
    stop_edge(edge)
    counter.close()


class Count:
    """What the edge sent since ``Count(counter)``: round trips, wake-ups and key checks (``since``)."""

    def __init__(self, counter: StatementCounter) -> None:
        self.counter = counter
        self.start = self._now()

    def _now(self) -> tuple[int, int, int, int]:
        with self.counter.lock:
            _, round_trips, _, texts = self.counter.snapshot()
            wakeups = sum(n for text, n in texts.items() if "pg_notify" in text)
            key_checks = sum(n for text, n in texts.items() if "FROM api_keys" in text)
            return round_trips, self.counter.prepares, wakeups, key_checks

    def since(self) -> dict[str, int]:
        trips, prepares, wakeups, key_checks = (now - then for then, now in zip(self.start, self._now()))
        # psycopg prepares a statement on a connection once, at its fifth use there: one round trip, once.
        return {"round_trips": trips - prepares, "wakeups": wakeups, "key_checks": key_checks}


def _send(edge: EdgeProcess, counter: StatementCounter, customer) -> dict:
    """One paid send, answered, and its wake-up sent: waiting for it keeps one send's count apart from the next's
    (wake-ups asked for within a few milliseconds of each other share one statement)."""
    count = Count(counter)
    answer = http_calls.post(f"{edge.specialist(PAID)}/message:send", json=message(returnImmediately=True),
                             headers=customer.headers)
    assert answer.status_code == 200, answer.text
    wait_until(lambda: count.since()["wakeups"] > 0, what="the send's wake-up")
    return answer.json()["task"]


def test_a_paid_admission_makes_two_round_trips_before_it_answers(counted_edge, make_customer):
    edge, counter = counted_edge
    customer = make_customer(credits=PAID_TARIFF * (SENDS + 4), max_parallel=SENDS + 4)
    for _ in range(3):  # warm: the pool's connections are open, the key is cached
        _send(edge, counter, customer)
    count = Count(counter)
    for _ in range(SENDS):
        task = _send(edge, counter, customer)
        assert task["status"]["state"] == "TASK_STATE_SUBMITTED"
    cost = count.since()
    assert cost["wakeups"] == SENDS, cost
    # Besides the key's check when its revocation cache runs out, which a slow run (a loaded machine) meets: the
    # next test counts that one.
    on_path = cost["round_trips"] - cost["wakeups"] - cost["key_checks"]
    assert on_path <= REQUEST_PATH_BUDGET * SENDS, (
        f"{on_path} round trips for {SENDS} admissions besides their wake-ups and key checks "
        f"(budget {REQUEST_PATH_BUDGET} each); statements so far: {counter.snapshot()[3]}"
    )


def test_a_key_the_instance_has_not_seen_costs_one_round_trip_to_check(counted_edge, make_customer):
    edge, counter = counted_edge
    warm = make_customer(credits=PAID_TARIFF * 8, max_parallel=8)
    for _ in range(6):  # every statement of a send prepared on the connection it uses
        _send(edge, counter, warm)
    customer = make_customer(credits=PAID_TARIFF, max_parallel=1)
    count = Count(counter)
    _send(edge, counter, customer)
    cost = count.since()
    # The key check, the rate-limit count, the admission, the wake-up: no BEGIN or ROLLBACK around the check.
    assert cost == {"round_trips": 4, "wakeups": 1, "key_checks": 1}, (cost, counter.snapshot()[3])


def test_the_admission_statement_stays_short_enough_for_psycopg_to_cache_its_conversion():
    """Longer than psycopg's cached length, a statement's placeholders are converted again on every
    execution (about 5% of the edge's CPU at saturation, sampled): the admission statement stays under it."""
    from psycopg import _queries
    from sqlalchemy.dialects import postgresql

    from app.admission import _ADMIT, _ADMIT_SQL
    from app.ratelimit import _COUNT_SQL
    from core.db import PSYCOPG_CACHED_QUERY_CHARS

    assert _queries.MAX_CACHED_STATEMENT_LENGTH == PSYCOPG_CACHED_QUERY_CHARS
    dialect = postgresql.psycopg.dialect()
    for statement in (_ADMIT.clause,):
        compiled = statement.compile(dialect=dialect)
        assert len(str(compiled)) <= PSYCOPG_CACHED_QUERY_CHARS
        assert len(compiled.params) <= _queries.MAX_CACHED_STATEMENT_PARAMS
    for sent in (_ADMIT_SQL, _COUNT_SQL):  # what the edge sends on the driver itself (core.db.driver_rows)
        assert len(sent) <= PSYCOPG_CACHED_QUERY_CHARS


def test_a_blocking_send_reads_its_task_once_per_notification_and_answers_on_the_last(
    counted_edge, make_customer, engine: Engine
):
    answered = _blocking_send_that_works_then_completes(counted_edge, make_customer, engine, message())
    assert [m["parts"][0]["text"] for m in answered["history"]] == ["hello"]


def test_a_blocking_send_that_asks_for_no_history_is_answered_without_it_in_as_many_round_trips(
    counted_edge, make_customer, engine: Engine
):
    answered = _blocking_send_that_works_then_completes(counted_edge, make_customer, engine,
                                                        message(historyLength=0))
    assert "history" not in answered


def _blocking_send_that_works_then_completes(counted_edge, make_customer, engine: Engine, body: dict) -> dict:
    """A blocking send whose task is moved to WORKING, then COMPLETED, each with its notification: its answer's
    task, after checking that it came only once the task completed and cost ``BLOCKING_SEND_ROUND_TRIPS``."""
    edge, counter = counted_edge
    customer, owner, known = _warm_customer(edge, counter, make_customer, engine)
    count = Count(counter)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(http_calls.post, f"{edge.specialist(PAID)}/message:send", json=body,
                             headers=customer.headers, timeout=None)
        wait_until(lambda: count.since()["wakeups"] > 0, what="the admission's wake-up for the dispatchers")
        [task_id] = set(_task_ids(engine, owner)) - known
        admitted = count.since()["round_trips"]
        move(engine, task_id, owner, TaskState.TASK_STATE_WORKING, notify=True)
        wait_until(lambda: count.since()["round_trips"] > admitted, what="the edge's read on the working event")
        assert not answer.done(), "a blocking send answered before its task stopped"
        move(engine, task_id, owner, TaskState.TASK_STATE_COMPLETED, notify=True)
        answered = answer.result()
    assert answered.status_code == 200, answered.text
    assert answered.json()["task"]["id"] == task_id
    assert answered.json()["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    cost = count.since()
    # The key's check, when its revocation cache ran out meanwhile (a slow run), is not the wait's: left out.
    assert cost["key_checks"] <= 1, cost
    assert (cost["round_trips"] - cost["key_checks"], cost["wakeups"]) == (BLOCKING_SEND_ROUND_TRIPS, 1), (
        cost, counter.snapshot()[3])
    return answered.json()["task"]


def test_a_streamed_send_reads_its_events_in_one_round_trip_a_read(counted_edge, make_customer, engine: Engine):
    edge, counter = counted_edge
    customer, owner, known = _warm_customer(edge, counter, make_customer, engine)
    count = Count(counter)
    received: list[str] = []

    def stream() -> int:
        with http_calls.stream("POST", f"{edge.specialist(PAID)}/message:stream", json=message(),
                               headers=customer.headers, timeout=None) as answer:
            for line in answer.iter_lines():
                if line.startswith("data:"):
                    received.append(line)
            return answer.status_code

    with ThreadPoolExecutor(1) as pool:
        streamed = pool.submit(stream)
        # The rate-limit count, the admission, the wake-up (after the answer), the stream's cursor and first read.
        wait_until(lambda: count.since()["round_trips"] - count.since()["key_checks"] >= 5 and received,
                   what="the admission, its wake-up, the task on the stream and the stream's first read")
        [task_id] = set(_task_ids(engine, owner)) - known
        move(engine, task_id, owner, TaskState.TASK_STATE_WORKING, notify=True)
        wait_until(lambda: len(received) >= 2, what="the working event on the stream")
        move(engine, task_id, owner, TaskState.TASK_STATE_COMPLETED, notify=True)
        assert streamed.result() == 200, received
    states = [line for line in received if "statusUpdate" in line]
    assert len(received) == 3 and task_id in received[0], received  # the task, then its two status updates
    assert ["TASK_STATE_WORKING" in states[0], "TASK_STATE_COMPLETED" in states[1]] == [True, True], states
    cost = count.since()
    assert cost["key_checks"] <= 1, cost  # its revocation cache may run out meanwhile (a slow run): not the stream's
    assert (cost["round_trips"] - cost["key_checks"], cost["wakeups"]) == (STREAMED_SEND_ROUND_TRIPS, 1), (
        cost, counter.snapshot()[3])


def _warm_customer(edge, counter, make_customer, engine: Engine):
    """A customer whose key the edge has cached, after six sends that prepared every statement of a send on the
    connection it uses; with its owner and the tasks it has so far."""
    customer = make_customer(credits=PAID_TARIFF * 8, max_parallel=8)
    for _ in range(6):
        _send(edge, counter, customer)
    owner = f"{customer.customer_id}:{PAID}"
    return customer, owner, set(_task_ids(engine, owner))


def _task_ids(engine: Engine, owner: str) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT id FROM tasks WHERE owner = :o"), {"o": owner}).scalars())


def _edge_backends(engine: Engine, name: str) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = :a"
        ), {"a": edge_application_name(name)}).scalars())


def test_a_pooled_connection_the_server_ended_costs_no_request(edge_alone, make_customer, engine: Engine):
    """No ping before a checkout: the pool finds a connection the server ended by its socket and replaces it."""
    customer = make_customer(credits=PAID_TARIFF * 4, max_parallel=4)
    first = http_calls.post(f"{edge_alone.specialist(PAID)}/message:send", json=message(returnImmediately=True),
                            headers=customer.headers)
    assert first.status_code == 200, first.text
    pooled = _edge_backends(engine, "alone")
    assert pooled, "the edge pooled no connection"
    with engine.connect() as conn:  # as a restart or a failover would: every connection of the edge's pool ends
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM unnest(CAST(:p AS int[])) AS k(pid)"),
                     {"p": pooled})
    wait_until(lambda: not set(_edge_backends(engine, "alone")) & set(pooled), what="the edge's backends to end")
    for _ in range(2):  # the rate-limit count and the admission: two checkouts, each of a connection now dead
        answer = http_calls.post(f"{edge_alone.specialist(PAID)}/message:send", json=message(returnImmediately=True),
                                 headers=customer.headers)
        assert answer.status_code == 200, answer.text
        assert answer.json()["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert set(_edge_backends(engine, "alone")) - set(pooled), "the edge answered without a new connection"
