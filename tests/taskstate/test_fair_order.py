"""The fair order of worker slots (issue 41): which due job a dispatcher takes next, on real PostgreSQL.

Each test queues jobs of its own customers and its own specialist, and takes only that specialist's jobs
(``FairOrder.served``), so rows other tests leave in the shared database never take part. Orders and counts,
never times.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from pydantic import ValidationError
from sqlalchemy import Connection, Engine, text

from core.settings import Settings
from taskstate import outbox
from tests.workers.conftest import SERVICE_ACCOUNT
from workers.dispatch.embedded import fair_order


class Queue:
    """Jobs of a test's own specialist, queued by customer, and the takes a one-dispatcher loop would make."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.specialist = f"fair-{uuid.uuid4().hex[:10]}"
        self.order = outbox.FairOrder(served=(self.specialist,))
        self.tag = uuid.uuid4().hex[:8]
        self.customers: dict[str, str] = {}  # the letters tests use -> customer ids

    def customer(self, letter: str) -> str:
        return self.customers.setdefault(letter, f"{letter.lower()}-{self.tag}")

    def queue(self, letter: str, jobs: int = 1, *, specialist: str | None = None) -> None:
        owner = f"{self.customer(letter)}:{specialist or self.specialist}"
        with self.engine.connect() as conn:
            for _ in range(jobs):
                task_id = str(uuid.uuid4())
                conn.execute(text(
                    "INSERT INTO tasks (id, context_id, kind, owner, last_updated, status, artifacts, history, "
                    "protocol_version) VALUES (:t, :t, 'task', :o, now() AT TIME ZONE 'UTC', "
                    "CAST('{\"state\": \"TASK_STATE_SUBMITTED\"}' AS json), CAST('[]' AS json), CAST('[]' AS json), "
                    "'1.0')"), {"t": task_id, "o": owner})
                conn.execute(text("INSERT INTO edge_tasks (task_id, specialist_id, skill_id, owner, tariff_credits) "
                                  "VALUES (:t, :s, :s, :o, 0)"), {"t": task_id, "s": specialist or self.specialist,
                                                                  "o": owner})
                outbox.enqueue(conn, task_id=task_id, specialist_id=specialist or self.specialist, executor="rlm",
                               owner=owner, context_id=task_id, message=b"\x0a\x00")

    def take(self, n: int = 1, order: outbox.FairOrder | None = None) -> list[outbox.OutboxRow]:
        with self.engine.connect() as conn:
            return outbox.take(conn, limit=n, lease_s=600, me="tests", order=order or self.order)

    def letter(self, row: outbox.OutboxRow) -> str:
        customer = row.owner.split(":")[0]
        return next(letter for letter, c in self.customers.items() if c == customer)

    def starts(self, n: int) -> str:
        """The customers of the next ``n`` jobs started one slot at a time, none finishing: ``"ABAB"``."""
        return "".join(self.letter(row) for _ in range(n) for row in self.take(1))

    def finish(self, row: outbox.OutboxRow) -> None:
        with self.engine.connect() as conn:
            outbox.mark_delivered(conn, row)

    def close_all(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("UPDATE dispatch_outbox SET status = 'done', finished_at = now() "
                              "WHERE split_part(owner, ':', 1) = ANY (:c) AND status IN ('pending', 'sent')"),
                         {"c": list(self.customers.values())})


@pytest.fixture
def jobs(engine: Engine) -> Iterator[Queue]:
    queue = Queue(engine)
    yield queue
    queue.close_all()


def _set_weight(engine: Engine, customer_id: str, weight: int) -> None:
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO customers (customer_id) VALUES (:c) ON CONFLICT DO NOTHING"), {"c": customer_id})
        outbox.set_weight(conn, customer_id, weight, changed_by="tests", reason="fair order test")


def test_with_one_customers_eight_jobs_queued_a_second_customers_job_is_the_next_one_started(jobs: Queue) -> None:
    # A one-slot worker: A's first job runs, seven wait; B sends one. When A's job ends, the slot goes to B, not to
    # A's next job, although A's were due first: A has just had its turn.
    jobs.queue("A", 8)
    [first] = jobs.take()
    assert jobs.letter(first) == "A"
    jobs.queue("B")
    jobs.finish(first)
    [nxt] = jobs.take()
    assert jobs.letter(nxt) == "B"
    # Four slots, four of A's jobs running: the next free slot is B's too, and then A's line goes on in its order.
    jobs.finish(nxt)
    running = jobs.take(3)
    assert [jobs.letter(r) for r in running] == ["A", "A", "A"]
    jobs.queue("B")
    assert jobs.starts(2) == "BA"


def test_a_job_a_full_worker_refused_keeps_its_place_and_its_customer_keeps_its_turn(jobs: Queue) -> None:
    # The slot B's job was sent to was still held by A's job ending: the worker claimed nothing. The next take must
    # be B's job again, not A's next (whose row was due first and whose customer, without the hand-back, would
    # have had the older turn).
    jobs.queue("A", 8)
    [first] = jobs.take()
    jobs.queue("B")
    jobs.finish(first)
    [refused] = jobs.take()
    assert jobs.letter(refused) == "B"
    with jobs.engine.connect() as conn:
        outbox.hand_back(conn, refused, error="worker_at_capacity (HTTP 503)")
    [again] = jobs.take()
    assert (again.dispatch_id, again.attempts) == (refused.dispatch_id, refused.attempts)
    assert jobs.starts(2) == "AA"


def test_customers_of_equal_weight_take_turns_and_a_waiting_customer_never_waits_for_anothers_backlog(
        jobs: Queue) -> None:
    jobs.queue("A", 6)
    jobs.queue("B", 3)
    jobs.queue("C", 1)
    assert jobs.starts(10) == "ABCABABAAA"


def test_a_weight_gives_its_customer_that_many_slots_for_each_slot_of_a_weight_one_customer(
        jobs: Queue, engine: Engine) -> None:
    jobs.queue("A", 8)
    jobs.queue("B", 8)
    _set_weight(engine, jobs.customer("A"), 3)
    # A's rank is (in flight + place) / 3, B's (in flight + place) / 1; at a tie the customer whose turn is longest
    # past goes first. Eight starts: six of A's, two of B's.
    assert jobs.starts(8) == "AABAAABA"
    with engine.connect() as conn:
        share = outbox.share_of(conn, jobs.customer("A"), default_weight=1)
    assert (share.weight, share.weight_is_default, share.in_flight, share.waiting) == (3, False, 6, 2)


def test_the_default_weight_is_a_setting_and_an_operators_weight_overrides_it(jobs: Queue, engine: Engine) -> None:
    jobs.queue("A", 4)
    jobs.queue("B", 4)
    _set_weight(engine, jobs.customer("B"), 1)
    # Every customer without a weight of its own has weight 2 here: A holds two slots for each of B's.
    heavier_default = outbox.FairOrder(default_weight=2, served=(jobs.specialist,))
    assert "".join(jobs.letter(jobs.take(1, heavier_default)[0]) for _ in range(6)) == "ABAABA"
    with engine.connect() as conn:
        share = outbox.share_of(conn, jobs.customer("A"), default_weight=2)
    assert (share.weight, share.weight_is_default) == (2, True)


def test_a_dispatcher_never_takes_a_job_of_a_specialist_none_of_its_workers_serve(jobs: Queue) -> None:
    other = f"other-{uuid.uuid4().hex[:8]}"
    jobs.queue("A", 2, specialist=other)
    jobs.queue("B", 1)
    taken = jobs.take(5)
    assert [(jobs.letter(r), r.specialist_id) for r in taken] == [("B", jobs.specialist)]
    assert jobs.take(5, outbox.FairOrder(served=())) == []  # workers that serve nothing: nothing is taken
    both = jobs.take(5, outbox.FairOrder(served=(jobs.specialist, other)))
    assert [(jobs.letter(r), r.specialist_id) for r in both] == [("A", other), ("A", other)]


def test_the_relay_keeps_at_most_its_bound_of_jobs_sent_and_picks_them_in_the_fair_order(
        jobs: Queue, engine: Engine) -> None:
    jobs.queue("A", 5)
    with engine.begin() as conn:
        for row in outbox.lock_due(conn, limit=2, max_in_flight=100, order=jobs.order):
            outbox.mark_sent(conn, row)
    jobs.queue("B", 2)
    with engine.begin() as conn:
        sent = _sent_count(conn)
        locked = outbox.lock_due(conn, limit=10, max_in_flight=sent + 1, order=jobs.order)
        assert [jobs.letter(r) for r in locked] == ["B"]
        for row in locked:
            outbox.mark_sent(conn, row)
    with engine.begin() as conn:
        assert outbox.lock_due(conn, limit=10, max_in_flight=_sent_count(conn), order=jobs.order) == []
        assert [jobs.letter(r) for r in outbox.lock_due(conn, limit=3, max_in_flight=10_000, order=jobs.order)] == [
            "B", "A", "A"]


def _sent_count(conn: Connection) -> int:
    return int(conn.execute(text("SELECT count(*) FROM dispatch_outbox WHERE status = 'sent'")).scalar_one())


def _capped(jobs: Queue, settings: Settings) -> outbox.FairOrder:
    """The order a dispatcher with these settings takes in (its cap per customer), over the test's specialist."""
    return fair_order(settings, served=(jobs.specialist,))


CLOUD_TASKS = {"backend": "cloud_tasks", "cloud_tasks_project": "p", "cloud_tasks_location": "l",
               "cloud_tasks_queue": "q", "service_account": SERVICE_ACCOUNT}
FOUR_SLOTS = Settings(worker={"max_concurrent_jobs": 4})  # embedded, one worker URL: 4 slots, the default reserve 1


def test_with_four_slots_one_customer_holds_three_and_the_fourth_is_kept_for_the_next_customer(jobs: Queue) -> None:
    # The flood of issue 41: A queues eight long jobs on a four-slot worker. A take asking for all four slots
    # starts three of A's; the fourth stays free, and a take asking for it again gets nothing of A's.
    order = _capped(jobs, FOUR_SLOTS)
    jobs.queue("A", 8)
    assert [jobs.letter(r) for r in jobs.take(4, order)] == ["A", "A", "A"]
    assert jobs.take(1, order) == []
    # B sends one job: the free slot is its own at once, not after one of A's jobs ends.
    jobs.queue("B")
    assert [jobs.letter(r) for r in jobs.take(1, order)] == ["B"]
    # When one of A's jobs ends, A has two in flight and takes its third slot again.
    with jobs.engine.connect() as conn:
        [running] = conn.execute(text("SELECT dispatch_id FROM dispatch_outbox WHERE split_part(owner, ':', 1) = :c "
                                      "AND status = 'pending' AND available_at > now() LIMIT 1"),
                                 {"c": jobs.customer("A")}).scalars().all()
        conn.execute(text("UPDATE dispatch_outbox SET status = 'done', finished_at = now() WHERE dispatch_id = :d"),
                     {"d": running})
    assert [jobs.letter(r) for r in jobs.take(4, order)] == ["A"]


def test_the_cap_counts_each_customers_own_jobs_and_caps_the_relay_too(jobs: Queue, engine: Engine) -> None:
    order = _capped(jobs, Settings(dispatch={"relay_max_in_flight": 3}, worker={"max_concurrent_jobs": 3}))
    assert order.max_per_customer == 2
    jobs.queue("A", 5)
    jobs.queue("B", 5)
    with engine.begin() as conn:
        locked = outbox.lock_due(conn, limit=10, max_in_flight=10_000, order=order)
        assert sorted(jobs.letter(r) for r in locked) == ["A", "A", "B", "B"]
        for row in locked:
            outbox.mark_sent(conn, row)
    with engine.begin() as conn:  # both hold their two: neither gets a third
        assert outbox.lock_due(conn, limit=10, max_in_flight=10_000, order=order) == []


def test_a_reserve_of_zero_lets_one_customer_fill_every_slot(jobs: Queue) -> None:
    settings = Settings(dispatch={"reserved_slots": 0}, worker={"max_concurrent_jobs": 4})
    assert settings.customer_max_slots is None
    jobs.queue("A", 8)
    assert [jobs.letter(r) for r in jobs.take(4, _capped(jobs, settings))] == ["A", "A", "A", "A"]


def test_the_reserve_is_checked_at_start_up_against_the_slots_the_dispatcher_knows() -> None:
    assert FOUR_SLOTS.customer_max_slots == 3
    two_workers = Settings(dispatch={"worker_url": "http://w1/jobs,http://w2/jobs", "reserved_slots": 3},
                           worker={"max_concurrent_jobs": 2})
    assert two_workers.customer_max_slots == 1  # 2 slots x 2 workers, 3 reserved
    with pytest.raises(ValidationError, match=r"SPECIALISTS_DISPATCH_RESERVED_SLOTS \(4\) must be below .*\(4: "):
        Settings(dispatch={"reserved_slots": 4}, worker={"max_concurrent_jobs": 4})
    with pytest.raises(ValidationError, match="SPECIALISTS_DISPATCH_RESERVED_SLOTS.*RELAY_MAX_IN_FLIGHT"):
        Settings(dispatch={**CLOUD_TASKS, "relay_max_in_flight": 5, "reserved_slots": 5})
    with pytest.raises(ValidationError, match="dispatch.reserved_slots"):
        Settings(dispatch={"reserved_slots": -1})
    # One slot: a reserve would leave none, so it is off and the one customer there is takes the slot.
    assert Settings(worker={"max_concurrent_jobs": 1}).customer_max_slots is None
