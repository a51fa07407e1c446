"""Every query the dispatcher, the sweeper, the pruners and the workers repeat on the job tables is served by an index.

A database of its own is grown with 30,000 tasks of history (``tests.job_history``: events, outbox rows, claims in
their real shape, ANALYZEd). Each case calls the real function on a connection whose transaction is rolled back
afterwards, records every statement it sent, and asks the planner for each one's plan: none may scan a table of
``MIN_ROWS`` rows or more. So the test follows the code: a query changed, or a new one added to a function, is
planned too. Issue 18 measured what a scan costs at 1M tasks: 205 ms per expired lease for the sweeper, 217 ms
every sweep for the abandoned-job query; on the code before it this test names exactly those scans.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, event, text

from taskstate import claims, idempotency, ids, outbox, rows
from tests.job_history import grow
from tests.query_plans import SEQUENTIAL, nodes, table_rows
from tests.workers.system import drop_database, fresh_database
from workers.dispatch import pruner

pytestmark = [pytest.mark.timeout(300)]

GROWN_TASKS = 30_000
MIN_ROWS = 10_000  # the grown outbox, claims and tasks hold about 30,000 rows, the events 120,000
DAY_S = 86_400.0


@pytest.fixture(scope="module")
def grown(server_url: str) -> Iterator[Engine]:
    url = fresh_database(server_url)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            grow(conn, tasks=GROWN_TASKS)
        yield engine
    finally:
        engine.dispose()
        drop_database(server_url, url)


@pytest.fixture(scope="module")
def known(grown: Engine) -> dict[str, Any]:
    """Ids the cases name: a task in flight, one waiting for input, and an unknown job's task."""
    with grown.connect() as conn:
        def one(sql: str) -> Any:
            return conn.execute(text(sql)).one()
        flight = one("SELECT dispatch_id, task_id, owner, context_id FROM dispatch_outbox WHERE status = 'pending' "
                     "ORDER BY dispatch_id LIMIT 1")
        unknown = one("SELECT job_id FROM job_claims WHERE state = 'unknown' ORDER BY job_id LIMIT 1")
    return {"ref": ids.TaskRef(flight.task_id, int(flight.dispatch_id), flight.owner, flight.context_id),
            "unknown_task": ids.task_id_of(unknown.job_id)}


def _row(ref: ids.TaskRef) -> outbox.OutboxRow:
    return outbox.OutboxRow(ref.dispatch_id, ref.task_id, "scripted", ref.owner, ref.context_id, 1)


# name -> what the code runs, on a connection (its statements are recorded, then rolled back).
CASES: dict[str, Callable[[Connection, dict[str, Any]], object]] = {
    # the lease sweeper, every dispatch_sweep_interval_s
    "claims.expired_dispatched": lambda c, k: claims.expired_dispatched(c, limit=100, max_resumes=2,
                                                                        resume_window_s=300.0),
    "claims.sent_never_claimed": lambda c, k: claims.sent_never_claimed(c, sent_before_s=4200.0, limit=100),
    # the dispatchers, every round
    "outbox.take": lambda c, k: outbox.take(c, limit=32, lease_s=30.0, me="plans"),
    "outbox.lock_due": lambda c, k: outbox.lock_due(c, limit=32),
    "outbox.renew": lambda c, k: outbox.renew(c, [k["ref"].dispatch_id], lease_s=30.0),
    "outbox.mark_sent": lambda c, k: outbox.mark_sent(c, _row(k["ref"])),
    "outbox.mark_delivered": lambda c, k: outbox.mark_delivered(c, _row(k["ref"])),
    "outbox.reschedule": lambda c, k: outbox.reschedule(c, _row(k["ref"]), delay_s=1.0, error="plans"),
    "outbox.mark_undeliverable": lambda c, k: outbox.mark_undeliverable(c, _row(k["ref"]), error="plans"),
    "outbox.row_of_job": lambda c, k: outbox.row_of_job(c, k["ref"].job_id),
    # a worker, per job
    "claims.claim": lambda c, k: claims.claim(c, k["ref"].job_id, worker_id="plans", lease_s=30.0, ref=k["ref"]),
    "claims.claim_resumable": lambda c, k: claims.claim_resumable(c, k["ref"].job_id, worker_id="plans",
                                                                  lease_s=30.0, max_resumes=2, ref=k["ref"]),
    "claims.hold_fence": lambda c, k: claims.hold_fence(c, k["ref"].job_id, 1),
    "outbox.message_of": lambda c, k: outbox.message_of(c, k["ref"]),
    # a cancel, a give-up and a reconcile, per task
    "outbox.open_dispatch_ids": lambda c, k: outbox.open_dispatch_ids(c, k["ref"].task_id, k["ref"].owner),
    "claims.task_jobs": lambda c, k: claims.task_jobs(c, k["ref"].task_id),
    "outbox.cancel_rows": lambda c, k: outbox.cancel_rows(c, [k["ref"].dispatch_id]),
    "claims.unknown_of_task": lambda c, k: claims.unknown_of_task(c, k["unknown_task"]),
    "outbox.close": lambda c, k: outbox.close(c, k["ref"].dispatch_id),
    "outbox.close_unknown": lambda c, k: outbox.close_unknown(c, k["ref"]),
    # operators
    "claims.list_unknown": lambda c, k: claims.list_unknown(c, limit=100),
    "claims.unknown_tasks_relation": lambda c, k: c.execute(text(
        f"SELECT * FROM {claims.unknown_tasks_relation()} u ORDER BY u.unknown_at LIMIT 100")).all(),
    "claims.list_stale_reports(job)": lambda c, k: claims.list_stale_reports(c, k["ref"].job_id),
    # the pruners, every task_events_prune_interval_s
    "rows.prune_finished_events": lambda c, k: rows.prune_finished_events(c, retention_s=14 * DAY_S, batch=5000),
    "pruner.outbox": lambda c, k: c.execute(text(pruner.OUTBOX_PRUNE_SQL), {
        "retention_s": 14 * DAY_S, "batch": 1000, "after_at": outbox.PRUNE_START[0], "after_id": 0}),
    "claims.prune_finished": lambda c, k: claims.prune_finished(c, retention_s=30 * DAY_S, batch=1000),
    "idempotency.prune_expired": lambda c, k: idempotency.prune_expired(c, batch=1000),
}


@contextmanager
def recording(engine: Engine) -> Iterator[list[tuple[str, Any]]]:
    sent: list[tuple[str, Any]] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        if statement.lstrip().split(None, 1)[0].upper() in ("SELECT", "WITH", "UPDATE", "DELETE", "INSERT"):
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)


def sequential_scans(conn: Connection, statement: str, parameters: Any) -> list[str]:
    """``tests.query_plans.seq_scans_of_large_tables`` for a statement as the driver received it."""
    raw = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters).scalar_one()
    plan = (raw if isinstance(raw, list) else json.loads(raw))[0]["Plan"]
    sizes = table_rows(conn)
    return [f"{node['Relation Name']} ({sizes[node['Relation Name']]:,.0f} rows)" for node in nodes(plan)
            if node["Node Type"] in SEQUENTIAL and sizes.get(node.get("Relation Name"), 0) >= MIN_ROWS]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_repeated_query_on_the_job_tables_is_served_by_an_index(grown: Engine, known, name: str) -> None:
    with grown.connect() as conn:
        with recording(grown) as sent:
            CASES[name](conn, known)
        conn.rollback()
        assert sent, f"{name} sent no statement"
        scans = [(" ".join(statement.split())[:160], found) for statement, parameters in sent
                 if (found := sequential_scans(conn, statement, parameters))]
        conn.rollback()
    assert not scans, f"{name} scans large tables: {scans}"
