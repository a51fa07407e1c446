"""The sweeper's and the pruners' queries are served by an index on the job tables as those loops find them.

tests/test_query_plans.py plans every repeated query on a database seeded with real tasks. This one grows its own
with 30,000 tasks of the history these loops walk past (``tests.job_history``): running claims with expired
leases, unknown jobs, tasks waiting for input, a backlog of finished rows not pruned yet, ANALYZEd. Each case calls
the real function in a transaction rolled back afterwards, and every statement it sent is planned: none may scan a
table of ``MIN_ROWS`` rows or more. Issue 18 measured what a scan costs at 1M tasks: 205 ms per expired lease for
the sweeper, 217 ms every sweep for the abandoned-job query; on the code before it this test names those scans.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, text

from taskstate import claims, ids, outbox, rows
from tests.job_history import grow
from tests.query_plans import large_seq_scans_of_call
from tests.workers.system import drop_database, fresh_database
from workers.dispatch import pruner
from workers.dispatch.pruner import DAY_S

pytestmark = [pytest.mark.timeout(300)]

GROWN_TASKS = 30_000
MIN_ROWS = 10_000  # the grown outbox, claims and tasks hold about 30,000 rows, the events 120,000


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
    """Ids the cases name: a task in flight, and an unknown job's task."""
    with grown.connect() as conn:
        def one(sql: str) -> Any:
            return conn.execute(text(sql)).one()
        flight = one("SELECT dispatch_id, task_id, owner, context_id FROM dispatch_outbox WHERE status = 'pending' "
                     "ORDER BY dispatch_id LIMIT 1")
        unknown = one("SELECT job_id FROM job_claims WHERE state = 'unknown' ORDER BY job_id LIMIT 1")
    return {"ref": ids.TaskRef(flight.task_id, int(flight.dispatch_id), flight.owner, flight.context_id),
            "unknown_task": ids.task_id_of(unknown.job_id)}


# name -> what the code runs, on a connection (its statements are recorded, then rolled back). The entries of
# tests/test_query_plans.py again, on a database with what these loops walk past: expired leases, unknown jobs,
# tasks waiting for input, a backlog of finished rows (the planner chose a hash over every claim here first).
CASES: dict[str, Callable[[Connection, dict[str, Any]], object]] = {
    "claims.expired_dispatched": lambda c, k: claims.expired_dispatched(c, limit=100, max_resumes=2,
                                                                        resume_window_s=300.0),
    "claims.dead_holders": lambda c, k: claims.dead_holders(c, dead_after_s=10.0, limit=100, max_resumes=2,
                                                            resume_window_s=300.0),
    "claims.sent_never_claimed": lambda c, k: claims.sent_never_claimed(c, sent_before_s=4200.0, limit=100),
    "claims.unknown_tasks_relation": lambda c, k: c.execute(text(
        f"SELECT * FROM {claims.unknown_tasks_relation()} u ORDER BY u.unknown_at LIMIT 100")).all(),
    "claims.unknown_of_task": lambda c, k: claims.unknown_of_task(c, k["unknown_task"]),
    "claims.task_jobs": lambda c, k: claims.task_jobs(c, k["ref"].task_id),
    "claims.claim": lambda c, k: claims.claim(c, k["ref"].job_id, worker_id="plans", lease_s=30.0, ref=k["ref"]),
    "outbox.close_unknown": lambda c, k: outbox.close_unknown(c, k["ref"]),
    "rows.prune_finished_events": lambda c, k: rows.prune_finished_events(c, retention_s=14 * DAY_S, batch=5000),
    "pruner.outbox": lambda c, k: c.execute(text(pruner.OUTBOX_PRUNE_SQL), {
        "retention_s": 14 * DAY_S, "batch": 1000, "after_at": outbox.PRUNE_START[0], "after_id": 0}),
    "claims.prune_finished": lambda c, k: claims.prune_finished(c, retention_s=30 * DAY_S, batch=1000),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_loops_queries_are_served_by_an_index_past_what_they_keep(grown: Engine, known, name: str) -> None:
    sent, scans = large_seq_scans_of_call(grown, lambda conn: CASES[name](conn, known), min_rows=MIN_ROWS)
    assert sent, f"{name} sent no statement"
    assert not scans, f"{name} scans large tables: {scans}"
