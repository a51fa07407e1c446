"""What one take of the dispatchers costs: the fair take across customers against first come, first served (issue 41).

    .venv/bin/python bench/fair_take.py [--customers 10,100,1000] [--jobs 8] [--takes 40] [--limit 4]

Starts its own database (a fresh one on the server named by DATABASE_URL, dropped afterwards, else an embedded
PostgreSQL), queues ``--jobs`` jobs for each of ``--customers`` customers, and times ``--takes`` takes of
``--limit`` jobs with each statement, alternating: the service's ``taskstate.outbox.take`` (the fair order) and the
FIFO statement it replaced (e369db3), on the same rows. After each take the rows taken are put back as they were
(due, not in flight), so every take ranks the same queue. Prints the median and p90 per statement, and the fair
take's median over the FIFO's, the baseline measured in the same run.

A benchmark is not a test: it prints figures and never fails on speed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.admission import database  # noqa: E402

# The take before issue 41: due rows oldest first, whoever they belong to.
FIFO_TAKE = """
    UPDATE dispatch_outbox o
       SET attempts = o.attempts + 1, available_at = now() + make_interval(secs => :lease_s),
           taken_by = :me, taken_at = now()
     WHERE o.dispatch_id IN (SELECT dispatch_id FROM dispatch_outbox
                              WHERE status = 'pending' AND available_at <= now()
                              ORDER BY available_at, dispatch_id
                              FOR NO KEY UPDATE SKIP LOCKED LIMIT :n)
    RETURNING o.dispatch_id"""

QUEUE = [
    """CREATE TEMP TABLE queued AS SELECT i, gen_random_uuid()::text AS task_id,
              'bench-' || (i % :customers) || :suffix AS owner FROM generate_series(1, :rows) AS i""",
    "INSERT INTO tasks (id, context_id, kind, owner, last_updated, status, artifacts, history, protocol_version) "
    "SELECT task_id, task_id, 'task', owner, now(), CAST('{}' AS json), CAST('[]' AS json), CAST('[]' AS json), "
    "'1.0' FROM queued",
    "INSERT INTO edge_tasks (task_id, specialist_id, skill_id, owner, tariff_credits) "
    "SELECT task_id, 'scripted', 'scripted', owner, 0 FROM queued",
    "INSERT INTO dispatch_outbox (task_id, specialist_id, executor, owner, context_id, message) "
    "SELECT task_id, 'scripted', 'rlm', owner, task_id, '\\x0a00' FROM queued ORDER BY i",
    "DROP TABLE queued",
    "ANALYZE",
]


def measure(url: str, customers: int, jobs: int, takes: int, limit: int) -> dict[str, list[float]]:
    from sqlalchemy import create_engine, text

    from taskstate import outbox

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    times: dict[str, list[float]] = {"fifo": [], "fair": []}
    try:
        with engine.connect() as conn:
            conn.execute(text("DELETE FROM dispatch_turns"))
            conn.execute(text("UPDATE dispatch_outbox SET status = 'done', finished_at = now() "
                              "WHERE status IN ('pending', 'sent')"))
            for statement in QUEUE:
                conn.execute(text(statement), {"customers": customers, "rows": customers * jobs,
                                               "suffix": ":scripted"})
            for _ in range(takes):
                for name in ("fifo", "fair"):
                    started = time.perf_counter()
                    if name == "fifo":
                        taken = [r[0] for r in conn.execute(text(FIFO_TAKE), {"n": limit, "lease_s": 30, "me": "b"})]
                    else:
                        taken = [r.dispatch_id for r in outbox.take(conn, limit=limit, lease_s=30, me="bench")]
                    times[name].append((time.perf_counter() - started) * 1000)
                    conn.execute(text("UPDATE dispatch_outbox SET available_at = now() - interval '1 hour', "
                                      "attempts = 0 WHERE dispatch_id = ANY (:taken)"), {"taken": taken})
    finally:
        engine.dispose()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--customers", default="10,100,1000", help="comma-separated numbers of customers")
    parser.add_argument("--jobs", type=int, default=8, help="jobs queued per customer (the default cap)")
    parser.add_argument("--takes", type=int, default=40)
    parser.add_argument("--limit", type=int, default=4, help="jobs one take takes (free slots)")
    args = parser.parse_args()
    url, drop = database(os.environ.get("DATABASE_URL"))
    try:
        print(f"one take of {args.limit} jobs, {args.takes} takes per statement, {args.jobs} jobs per customer; "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"{'customers':>9}  {'fifo p50':>8}  {'fair p50':>8}  {'fifo p90':>8}  {'fair p90':>8}  ms  "
              f"{'fair/fifo p50':>13}")
        for customers in (int(c) for c in args.customers.split(",")):
            times = measure(url, customers, args.jobs, args.takes, args.limit)
            p50 = {k: statistics.median(v) for k, v in times.items()}
            p90 = {k: sorted(v)[int(len(v) * 0.9) - 1] for k, v in times.items()}
            print(f"{customers:>9}  {p50['fifo']:>8.2f}  {p50['fair']:>8.2f}  {p90['fifo']:>8.2f}  {p90['fair']:>8.2f}"
                  f"      {p50['fair'] / p50['fifo']:>12.1f}x", flush=True)
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        drop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
