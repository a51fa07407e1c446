"""Every query the service repeats on a shared table is served by an index (issue 18).

A database of its own is grown by ``bench/seed.py`` (the rows real tasks leave, cloned) to
``SEEDED_TASKS`` tasks over ``SEEDED_CUSTOMERS`` customers, one of them holding a tenth, and
ANALYZEd. Each entry of ``QUERIES`` calls the service's real function the way its caller does
(a request handler, a dispatcher's loop, a worker's job, an operator's command); every statement
it sends is EXPLAINed, and the test fails on a sequential scan of a table of ``LARGE_TABLE_ROWS``
rows or more. Functions that write run in a transaction that is rolled back.

What EXPLAIN cannot see: the statements inside a plpgsql function (the ledger's money functions,
the claim functions). Those look rows up by primary key or by their customer's index, as their
migrations show; ``bench/scale.py`` measures them from outside at three sizes, and
``tests/ledger/test_function_plans.py`` EXPLAINs the queries the ledger's functions loop over, cut out of
their migration.

The same seeded database checks the seeder itself: its ledger verifies clean, and it holds the
template's rows for every task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, text

from bench.seed import CUSTOMER_PREFIX, TABLES, Seeder, load_template
from core.settings import EdgeSettings
from ledger import keys, reads, verify
from ops.drill import record
from taskstate import admitted, claims, idempotency, ids, outbox, rows
from taskstate import reads as task_reads
from tests.query_plans import large_seq_scans_of_call, rows_read
from tests.workers.system import drop_database, fresh_database
from workers import reconcile
from workers.dispatch import pruner
from workers.dispatch.pruner import DAY_S
from workers.hosted_rlm import journal, store

SEEDED_TASKS = 20_000
SEEDED_CUSTOMERS = 200
# Smaller tables are cheaper to scan than to index, and the planner knows it; at 20,000 tasks every table a
# task writes to holds at least this many rows.
LARGE_TABLE_ROWS = 10_000


@dataclass(frozen=True)
class Seeded:
    engine: Engine
    hot_customer: str
    hot_owner: str
    task_id: str  # the hot customer's oldest completed task
    context_id: str
    job_id: str  # its job
    running_job_id: str
    small_customer: str


@pytest.fixture(scope="module")
def seeded(server_url: str) -> Iterator[Seeded]:
    url = fresh_database(server_url)
    engine = create_engine(url)
    try:
        # One batch at a time: the other xdist worker's timing tests (test_isolation's p99 ratios) must not share
        # both cores with the seeding.
        seeder = Seeder(engine, customers=SEEDED_CUSTOMERS, hot_share=0.10, final_tasks=SEEDED_TASKS, parallel=1)
        seeder.grow_to(SEEDED_TASKS)
        with engine.connect() as conn:
            task = conn.execute(text(
                f"SELECT t.task_id, t.owner, o.context_id, {ids.job_id_sql('o')} AS job_id "
                "FROM edge_tasks t JOIN dispatch_outbox o ON o.task_id = t.task_id "
                "JOIN ledger_settlements s ON s.job_id = t.task_id "
                "WHERE t.customer_id = :c ORDER BY t.admitted_at LIMIT 1"),
                {"c": seeder.hot_customer}).mappings().one()
            running = conn.execute(text("SELECT job_id FROM job_claims WHERE state = 'running' LIMIT 1")).scalar_one()
        with engine.begin() as conn:
            # The checkpoint pruner's table as a busy day leaves it: two small records for each finished job, within
            # the retention but for one job in fifty (the seeder keeps the real ones of a day's tasks only).
            conn.execute(text(
                "INSERT INTO specialist_checkpoints (job_id, seq, session_id, fencing_token, data, created_at) "
                "SELECT job_id, 100 + g, 'plans', fencing_token, '\\x00', CASE WHEN abs(hashtext(job_id)) % 50 = 0 "
                "THEN now() - interval '2 days' ELSE now() - interval '1 hour' END "
                "FROM job_claims, generate_series(1, 2) g WHERE state = 'finished'"))
            conn.execute(text("ANALYZE specialist_checkpoints"))
        yield Seeded(engine, seeder.hot_customer, task["owner"], task["task_id"], task["context_id"], task["job_id"],
                     running, seeder.customer_id(SEEDED_CUSTOMERS - 1))
    finally:
        engine.dispose()
        drop_database(server_url, url)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _ref(s: Seeded) -> ids.TaskRef:
    """The seeded task's job, as its signed body names it."""
    task_id, dispatch_id = ids.split_job_id(s.job_id)
    return ids.TaskRef(task_id, dispatch_id, s.hot_owner, s.context_id)


def _row(s: Seeded) -> outbox.OutboxRow:
    ref = _ref(s)
    return outbox.OutboxRow(ref.dispatch_id, ref.task_id, "reviewer", ref.owner, ref.context_id, 1)


# ListTasks as app.listing calls it: a page of 50 with the history, and, for a filtered listing, its bounded total.
LIST_SCAN_MAX_ROWS = EdgeSettings.model_fields["list_tasks_scan_max_rows"].default


def _listing(c: Connection, s: Seeded, filters: rows.ListingFilter) -> None:
    """The first two pages (the second after the first's position), and the total as the first page reads it."""
    first = rows.list_page(c, s.hot_owner, filters, None, 50, with_history=True, with_artifacts=False,
                           examine_max=LIST_SCAN_MAX_ROWS)
    if first.next is not None:
        rows.list_page(c, s.hot_owner, filters, first.next, 50, with_history=True, with_artifacts=False,
                       examine_max=LIST_SCAN_MAX_ROWS)
    if filters.narrows:
        rows.count_matching(c, s.hot_owner, filters, LIST_SCAN_MAX_ROWS)
    else:
        rows.owner_total(c, s.hot_owner)


RESERVATION_PAGE = 50


def _reservation_pages(c: Connection, **filters: Any) -> None:
    """`specialists reservations list` and the page after it (`--before` the first page's cursor)."""
    first = reads.reservation_page(c, limit=RESERVATION_PAGE, **filters)
    if first.next_cursor is not None:
        reads.reservation_page(c, limit=RESERVATION_PAGE, before=first.next_cursor, **filters)


def _journal_pages(c: Connection, **filters: Any) -> None:
    """`specialists ledger journal` and the page after it (`--before` the first page's last posting)."""
    first = reads.journal_page(c, limit=RESERVATION_PAGE, **filters)
    if first.next_before is not None:
        reads.journal_page(c, limit=RESERVATION_PAGE, before=first.next_before, **filters)


# name -> what its caller does, given a connection (in a transaction that is rolled back) and the seeded facts.
QUERIES: dict[str, Callable[[Connection, Seeded], Any]] = {
    # A customer's requests.
    "GetTask (taskstate.rows.read)": lambda c, s: rows.read(c, s.task_id, s.hot_owner),
    "a task event's lock (taskstate.rows.lock)": lambda c, s: rows.lock(c, s.task_id, s.hot_owner),
    "a follow-up's task (taskstate.rows.load)": lambda c, s: rows.load(c, s.task_id, s.hot_owner),
    "cancel: the task's open jobs (taskstate.outbox.open_dispatch_ids)":
        lambda c, s: outbox.open_dispatch_ids(c, s.task_id, s.hot_owner),
    "cancel: the task's claims (taskstate.claims.task_jobs)": lambda c, s: claims.task_jobs(c, s.task_id),
    "cancel and finish: the task's hold (taskstate.admitted.hold_of)": lambda c, s: admitted.hold_of(c, s.task_id),
    "ListTasks (taskstate.rows.list_page, owner_total)": lambda c, s: _listing(c, s, rows.ListingFilter()),
    "ListTasks by contextId (taskstate.rows.list_page, count_matching)":
        lambda c, s: _listing(c, s, rows.ListingFilter(context_id=s.context_id)),
    "ListTasks by a common status": lambda c, s: _listing(c, s, rows.ListingFilter(state="TASK_STATE_COMPLETED")),
    "ListTasks by a rare status": lambda c, s: _listing(c, s, rows.ListingFilter(state="TASK_STATE_WORKING")),
    "ListTasks by contextId and status":
        lambda c, s: _listing(c, s, rows.ListingFilter(context_id=s.context_id, state="TASK_STATE_COMPLETED")),
    "ListTasks by statusTimestampAfter": lambda c, s: _listing(
        c, s, rows.ListingFilter(updated_after=(_now() - timedelta(days=30)).replace(tzinfo=None))),
    # The dispatcher's loop.
    "dispatcher: take due jobs (taskstate.outbox.take)":
        lambda c, s: outbox.take(c, limit=8, lease_s=30, me="plans"),
    "dispatcher: lock due jobs (taskstate.outbox.lock_due)":
        lambda c, s: outbox.lock_due(c, limit=8, max_in_flight=40),
    "dispatcher: expired Idempotency-Keys (taskstate.idempotency.prune_expired)":
        lambda c, s: idempotency.prune_expired(c, batch=500),
    "dispatcher: ended jobs' checkpoints (workers.hosted_rlm.store.prune_ended)":
        lambda c, s: store.prune_ended(c, retention_s=86_400, batch=500),
    "dispatcher: a delivery lease renewed (taskstate.outbox.renew)":
        lambda c, s: outbox.renew(c, [_ref(s).dispatch_id], lease_s=30),
    "dispatcher: a job handed to Cloud Tasks (taskstate.outbox.mark_sent)": lambda c, s: outbox.mark_sent(c, _row(s)),
    "dispatcher: a job delivered (taskstate.outbox.mark_delivered)": lambda c, s: outbox.mark_delivered(c, _row(s)),
    "dispatcher: a delivery to repeat (taskstate.outbox.reschedule)":
        lambda c, s: outbox.reschedule(c, _row(s), delay_s=1, error="plans"),
    "dispatcher: a job given up (taskstate.outbox.mark_undeliverable)":
        lambda c, s: outbox.mark_undeliverable(c, _row(s), error="plans"),
    "sweeper: expired leases (taskstate.claims.expired_dispatched)":
        lambda c, s: claims.expired_dispatched(c, limit=100, max_resumes=2, resume_window_s=300),
    "sweeper: abandoned jobs (taskstate.claims.sent_never_claimed)":
        lambda c, s: claims.sent_never_claimed(c, sent_before_s=4200, limit=100),
    "sweeper and claims: a job found unknown closes its row (taskstate.outbox.close_unknown)":
        lambda c, s: outbox.close_unknown(c, _ref(s)),
    "pruner: task events, a page (taskstate.rows.prune_finished_events)":
        lambda c, s: rows.prune_finished_events(c, retention_s=14 * DAY_S, batch=5000),
    "pruner: finished jobs' outbox rows, a page (workers.dispatch.pruner.OUTBOX_PRUNE_SQL)":
        lambda c, s: c.execute(text(pruner.OUTBOX_PRUNE_SQL), {"retention_s": 14 * DAY_S, "batch": 1000,
                                                               "after_at": outbox.PRUNE_START[0], "after_id": 0}),
    "pruner: finished claims, a page (taskstate.claims.prune_finished)":
        lambda c, s: claims.prune_finished(c, retention_s=30 * DAY_S, batch=1000),
    # A worker's job.
    "worker: a job's message (taskstate.outbox.row_of_job)": lambda c, s: outbox.row_of_job(c, s.job_id),
    "worker: the run's record (workers.hosted_rlm.journal.run_record)":
        lambda c, s: journal.run_record(c, s.job_id),
    "worker: the claim (taskstate.claims.get)": lambda c, s: claims.get(c, s.running_job_id),
    "worker: the claim over its outbox row (taskstate.claims.claim)":
        lambda c, s: claims.claim(c, s.job_id, worker_id="plans", lease_s=30, ref=_ref(s)),
    "worker: a resumable claim (taskstate.claims.claim_resumable)":
        lambda c, s: claims.claim_resumable(c, s.job_id, worker_id="plans", lease_s=30, max_resumes=2, ref=_ref(s)),
    "worker: a fenced write's lock (taskstate.claims.hold_fence)": lambda c, s: claims.hold_fence(c, s.running_job_id, 1),
    "worker: a job's message (taskstate.outbox.message_of)": lambda c, s: outbox.message_of(c, _ref(s)),
    "cancel: jobs canceled before a claim (taskstate.outbox.cancel_rows)":
        lambda c, s: outbox.cancel_rows(c, [_ref(s).dispatch_id]),
    # Operators.
    "reconcile: unknown jobs (taskstate.claims.list_unknown)": lambda c, s: claims.list_unknown(c, limit=100),
    "reconcile: the task's unknown jobs (taskstate.claims.unknown_of_task)":
        lambda c, s: claims.unknown_of_task(c, s.task_id),
    "reconcile: the job's row closed (taskstate.outbox.close)": lambda c, s: outbox.close(c, _ref(s).dispatch_id),
    "reservations list --unknown: tasks with an unknown job (taskstate.claims.unknown_tasks_relation)":
        lambda c, s: c.execute(text(f"SELECT * FROM {claims.unknown_tasks_relation()} u "
                                    "ORDER BY u.unknown_at LIMIT 100")).all(),
    "reservations list --unknown: free tasks with an unknown job (workers.reconcile.unknown_free_tasks)":
        lambda c, s: reconcile.unknown_free_tasks(s.engine, customer_id=None, limit=100),
    "reservations list --unknown --customer: free tasks with an unknown job":
        lambda c, s: reconcile.unknown_free_tasks(s.engine, customer_id=s.hot_customer, limit=100),
    "operator: a job's stale reports (taskstate.claims.list_stale_reports)":
        lambda c, s: claims.list_stale_reports(c, s.job_id),
    "credits show (ledger.reads.account)": lambda c, s: reads.account(c, s.hot_customer, max_rows=100),
    "credits history (ledger.reads.history)": lambda c, s: reads.history(c, s.hot_customer),
    "reservations show (ledger.reads.reservation)": lambda c, s: reads.reservation(c, s.task_id),
    "reservations list (ledger.reads.reservation_page), two pages": lambda c, s: _reservation_pages(c),
    "reservations list --open": lambda c, s: _reservation_pages(c, states=("open",)),
    "reservations list --unknown": lambda c, s: _reservation_pages(c, states=("unknown",)),
    "reservations list --customer, the hot customer": lambda c, s: _reservation_pages(c, customer_id=s.hot_customer),
    "reservations list --customer, a small customer": lambda c, s: _reservation_pages(c, customer_id=s.small_customer),
    "reservations list --customer --unknown": lambda c, s: _reservation_pages(
        c, customer_id=s.hot_customer, states=("unknown",)),
    # A day of usage a week ago: a period's settlements are an index range (the seeded ones are all of today, and a
    # period holding all of them is rightly read whole).
    "credits usage, a day (ledger.reads.usage_by_day)":
        lambda c, s: reads.usage_by_day(c, since=_now() - timedelta(days=8), until=_now() - timedelta(days=7),
                                        max_rows=100_000),
    "credits usage --customer, the hot customer": lambda c, s: reads.usage_by_day(
        c, since=_now() - timedelta(days=8), until=_now() - timedelta(days=7), customer_id=s.hot_customer,
        max_rows=100_000),
    "ledger journal, two pages (ledger.reads.journal_page)": lambda c, s: _journal_pages(c),
    "ledger journal --customer, the hot customer": lambda c, s: _journal_pages(c, customer_id=s.hot_customer),
    "ledger journal --operator": lambda c, s: _journal_pages(c, operator="ops"),
    "ledger journal --kind grant --kind adjust": lambda c, s: _journal_pages(c, kinds=("grant", "adjust")),
    "ledger journal --kind settle": lambda c, s: _journal_pages(c, kinds=("settle",)),
    "ledger journal --customer --kind grant": lambda c, s: _journal_pages(c, customer_id=s.hot_customer,
                                                                          kinds=("grant",)),
    "the console's usage: tasks by outcome, a day (taskstate.reads.tasks_by_outcome)":
        lambda c, s: task_reads.tasks_by_outcome(c, since=_now() - timedelta(days=8), until=_now() - timedelta(days=7)),
    "tasks by outcome --customer, the hot customer": lambda c, s: task_reads.tasks_by_outcome(
        c, since=_now() - timedelta(days=8), until=_now() - timedelta(days=7), customer_id=s.hot_customer),
    "customers show: the hot customer's newest tasks (taskstate.reads.customer_tasks)":
        lambda c, s: task_reads.customer_tasks(c, s.hot_customer, limit=20),
    "customers show: a small customer's newest tasks": lambda c, s: task_reads.customer_tasks(c, s.small_customer,
                                                                                              limit=20),
    "health: the queue (taskstate.reads.queue)": lambda c, s: task_reads.queue(c),
    "health, the gauges, /metrics: the service's facts (taskstate.reads.service_facts: beats, queue, push backlog, "
    "unknown jobs)": lambda c, s: task_reads.service_facts(c, specialists=["reviewer"], live_s=60.0,
                                                            failures_window_s=3600.0),
    "the console's reservations, reservations show: a task's claims (taskstate.claims.task_claims)":
        lambda c, s: claims.task_claims(c, s.task_id),
    "the console's reservations: a page's claims at once (taskstate.claims.tasks_claims)":
        lambda c, s: claims.tasks_claims(c, [s.task_id, s.task_id + "x"]),
    "the console's customer page: its balances (ledger.reads.customer)": lambda c, s: reads.customer(c, s.hot_customer),
    "the console's usage, usage --since: rlm jobs started in a day (workers.hosted_rlm.journal.usage_by_job)":
        lambda c, s: journal.usage_by_job(c, since=_now() - timedelta(days=8), until=_now() - timedelta(days=7)),
    "health: workers seen (taskstate.claims.workers_seen)":
        lambda c, s: claims.workers_seen(c, since=_now() - timedelta(minutes=10), limit=1000),
    "health: the last drill (ops.drill.record.last_run)": lambda c, s: record.last_run(c),
    "keys list --customer (ledger.keys.list_keys)": lambda c, s: keys.list_keys(s.engine, s.hot_customer),
    "ledger verify --customer, the hot customer (ledger.verify.verify, totals)":
        lambda c, s: (verify.verify(c, s.hot_customer), verify.totals(c, s.hot_customer)),
    "ledger verify --customer, a small customer": lambda c, s: verify.verify(c, s.small_customer),
    "ledger verify: a range of customers (ledger.verify.verify_range)":
        lambda c, s: verify.verify_range(c, f"{CUSTOMER_PREFIX}0100", f"{CUSTOMER_PREFIX}0105"),
    "ledger verify: the last range": lambda c, s: verify.verify_range(c, f"{CUSTOMER_PREFIX}0195", None),
}


@pytest.mark.parametrize("name", list(QUERIES))
def test_a_repeated_query_is_served_by_an_index(seeded: Seeded, name: str) -> None:
    sent, scans = large_seq_scans_of_call(seeded.engine, lambda conn: QUERIES[name](conn, seeded),
                                          min_rows=LARGE_TABLE_ROWS)
    assert sent, f"{name} sent no statement: the entry no longer calls what it names"
    assert not scans, f"{name} scans large tables sequentially at {SEEDED_TASKS:,} tasks: {scans}"


def _count(conn: Connection, sql: str, **params: Any) -> int:
    return conn.execute(text(sql), params).scalar_one()


@pytest.mark.parametrize(
    "filters",
    [{}, {"states": ("open",)}, {"states": ("unknown",)}, {"states": ("open", "unknown")}, {"customer": "small"},
     {"customer": "hot"}, {"customer": "hot", "states": ("open", "unknown")}],
    ids=["all", "open", "unknown", "unresolved", "small-customer", "hot-customer", "hot-customer-unresolved"],
)
def test_a_reservation_page_reads_about_the_rows_it_shows_at_any_depth(seeded: Seeded, filters: dict) -> None:
    """No sequential scan is not enough: an index read that filters the history grows with it all the same."""
    customer = {"hot": seeded.hot_customer, "small": seeded.small_customer}.get(filters.get("customer"))
    states = filters.get("states")
    with seeded.engine.connect() as conn:
        unresolved = _count(conn, "SELECT count(*) FROM ledger_reservations WHERE state IN ('open', 'unknown')")
        cursors, page = [None], None
        for _ in range(100 if not filters else 1):  # "all": down to the 100th page, 5,000 reservations deep
            page = reads.reservation_page(conn, customer_id=customer, states=states, limit=RESERVATION_PAGE,
                                          before=page.next_cursor if page else None)
            if page.next_cursor is None:
                break
            cursors.append(page.next_cursor)
        for before in (cursors[0], cursors[1] if len(cursors) > 1 else None, cursors[-1]):
            sql, params = reads.listing(customer_id=customer, states=states, limit=RESERVATION_PAGE, before=before)
            read = rows_read(conn, sql.text, params, "ledger_reservations")
            # a filter by state reads the reservations in flight at most; a hot customer's page skips the others'
            bound = unresolved if states else 15 * RESERVATION_PAGE
            assert read <= bound, (filters, before, read, bound)


def test_a_customers_view_and_verify_read_its_own_rows_only(seeded: Seeded) -> None:
    """credits show reads the customer's unresolved reservations, not its history; verify --customer reads its
    postings, not the journal."""
    with seeded.engine.connect() as conn:
        unresolved = _count(conn, "SELECT count(*) FROM ledger_reservations WHERE customer_id = :c "
                                  "AND state IN ('open', 'unknown')", c=seeded.hot_customer)
        sql, params = reads.listing(customer_id=seeded.hot_customer, states=("open", "unknown"), limit=1000)
        assert 0 < unresolved == rows_read(conn, sql.text, params, "ledger_reservations")
        postings = _count(conn, "SELECT count(*) FROM ledger_journal WHERE customer_id = :c", c=seeded.hot_customer)
        scope = verify.Scope(customer_id=seeded.hot_customer)
        assert rows_read(conn, verify.verify_sql(scope).text, scope.params(), "ledger_journal") == postings


def test_the_seeded_ledger_verifies_clean(seeded: Seeded) -> None:
    with seeded.engine.connect() as conn:
        assert verify.verify(conn) == []


def test_every_seeded_task_has_the_rows_a_real_task_leaves(seeded: Seeded) -> None:
    template = load_template()
    with seeded.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tasks")).scalar_one() == SEEDED_TASKS
        per_task = {table: conn.execute(text(f"SELECT count(*) FROM {table} WHERE {where}"),
                                        {"T": seeded.task_id, "X": seeded.context_id, "J": seeded.job_id}).scalar_one()
                    for table, where in TABLES}
    # A completed clone has every row the completed template has, except the rlm checkpoints, which a job that can
    # no longer resume keeps for SPECIALISTS_SPECIALIST_CHECKPOINT_RETENTION_S only (and the two the fixture added).
    expected = {table: len(template["rows"][table]) for table, _ in TABLES}
    expected["specialist_checkpoints"] = 2
    assert per_task == expected
