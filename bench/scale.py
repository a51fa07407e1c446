"""Scale benchmark: what each operation costs as history grows, at three sizes in one run (issue 18).

    .venv/bin/python bench/scale.py [--sizes 1000,100000,1000000] [--customers 1000] [--repeat 15]
                                    [--keep] [--database URL]

Grows one database with ``bench/seed.py`` (the rows one real task leaves, cloned; 1,000 customers,
the first holding a tenth of the tasks) to each size in turn, and at each size measures:

* through the running edge (``specialists serve`` without worker or dispatcher, HTTP+JSON on 127.0.0.1,
  one client, requests one after another): GetTask, a paced SendMessage (``returnImmediately``, one
  every 100 ms), ListTasks' first page and its tenth page (page size 50), for the customer with a tenth of
  the tasks ("hot") and for one with about a thousandth ("small", the owner of the oldest other task);
* the queries the background loops repeat, through the functions that send them: the lease sweeper's
  expired leases, the abandoned-job query, one round of each pruner (in a transaction rolled back, so
  every round sees the same rows);
* the operator's commands' reads: ``ledger verify --customer`` (hot and small), ``reservations list``,
  ``--open`` and its tenth page (``--before``), and one full ``ledger verify`` as the command runs it (ranges
  of 100 customers in one read-only snapshot);
* every table's size, and from them the bytes each task adds per table.

Each operation runs ``--repeat`` times at each size (different tasks where it takes one); the table
shows the median in ms at each size and the ratio of the largest size's median to the smallest's: the
smallest size is the baseline, measured in the same run. A ratio near 1 is the goal. The database is
on the server named by DATABASE_URL (a new one, dropped afterwards unless ``--keep``), or an embedded
PostgreSQL; ``--database URL`` reuses one that ``--keep`` left (sizes it already passed are skipped).

A benchmark is not a test: it prints figures and never fails on speed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.admission import database, free_port, start  # noqa: E402
from ops.topology import Ready, ops_cli  # noqa: E402
from bench.seed import CUSTOMER_PREFIX, Seeder  # noqa: E402

SECRET = "bench-signing-secret-" + "s" * 40
SPECIALIST = "reviewer"
PAGE_SIZE = 50
DEEP_PAGE = 10
SEND_INTERVAL_S = 0.1


class Edge:
    """``specialists serve`` on the database, without worker or dispatcher, and keys of two customers."""

    def __init__(self, url: str, customers: dict[str, str]) -> None:
        import httpx
        from sqlalchemy import create_engine

        from ledger import keys

        engine = create_engine(url)
        signer = keys.KeySigner([SECRET], "test")
        self.tokens = {name: keys.issue_key(engine, signer, customer_id=customer, ttl=timedelta(days=1)).token
                       for name, customer in customers.items()}
        engine.dispose()
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECIALISTS_")}
        env.update({
            "DATABASE_URL": url, "SPECIALISTS_KEY_SIGNING_SECRETS": SECRET, "SPECIALISTS_LOG_LEVEL": "WARNING",
            "SPECIALISTS_SERVE_WORKER": "false", "SPECIALISTS_SERVE_DISPATCHER": "false",
            "SPECIALISTS_RATE_LIMIT_PER_KEY": "10000000", "SPECIALISTS_RATE_LIMIT_GLOBAL": "100000000",
        })
        self.process = start("edge", ops_cli("serve", "--port", str(self.port)), env,
                             Ready.http(f"http://127.0.0.1:{self.port}/healthz"))
        self.process.wait_ready()
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}/specialists/{SPECIALIST}", timeout=120)

    def _headers(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}", "A2A-Version": "1.0"}

    def get_task(self, who: str, task_id: str) -> None:
        self._ok(self.http.get(f"/tasks/{task_id}", headers=self._headers(who)))

    def list_page(self, who: str, token: str | None) -> str:
        params: dict[str, Any] = {"pageSize": PAGE_SIZE}
        if token:
            params["pageToken"] = token
        answer = self._ok(self.http.get("/tasks", params=params, headers=self._headers(who)))
        return answer.get("nextPageToken", "")

    def deep_token(self, who: str) -> str:
        token = ""
        for _ in range(DEEP_PAGE - 1):
            token = self.list_page(who, token)
        return token

    def send(self, who: str) -> None:
        body = {"message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": "Review it."}]},
                "configuration": {"returnImmediately": True}}
        self._ok(self.http.post("/message:send", json=body, headers=self._headers(who)))

    @staticmethod
    def _ok(response: Any) -> dict[str, Any]:
        if response.status_code != 200:
            raise SystemExit(f"{response.request.method} {response.request.url.path}: {response.status_code} "
                             f"{response.text[:300]}")
        return response.json()

    def close(self) -> None:
        self.http.close()
        self.process.stop()


def timed(call: Callable[[], Any], repeat: int, *, pause_s: float = 0.0) -> list[float]:
    """``call``'s wall time in ms, ``repeat`` times (the first call of each operation warms it and is dropped)."""
    call()
    times = []
    for _ in range(repeat):
        if pause_s:
            time.sleep(pause_s)
        started = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - started))
    return times


def rolled_back(engine: Any, work: Callable[[Any], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with engine.connect() as conn, conn.begin() as transaction:
            result = work(conn)
            transaction.rollback()
            return result
    return run


def database_operations(engine: Any, seeder: Seeder, small: str) -> dict[str, Callable[[], Any]]:
    """The background loops' and the operators' queries, each through the function that sends it."""
    from sqlalchemy import text

    from ledger import reads, verify
    from core.settings import DispatchSettings, HostedSettings
    from taskstate import claims, outbox, rows
    from workers.dispatch import pruner
    from workers.dispatch.pruner import DAY_S
    from workers.hosted_rlm import store

    dispatch, hosted = DispatchSettings(), HostedSettings()  # the defaults: what a round deletes at most

    def read(work: Callable[[Any], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with engine.connect() as conn:
                return work(conn)
        return run

    deep = deep_reservations_cursor(engine)
    return {
        "sweeper: expired leases": read(lambda c: claims.expired_dispatched(c, limit=100, max_resumes=2,
                                                                           resume_window_s=600)),
        "sweeper: abandoned jobs": read(lambda c: claims.sent_never_claimed(c, sent_before_s=1200, limit=100)),
        "pruner: task events (a round)": rolled_back(
            engine, lambda c: rows.prune_finished_events(c, retention_s=dispatch.task_events_retention_days * DAY_S,
                                                         batch=dispatch.task_events_prune_batch)),
        "pruner: finished jobs' outbox rows (a page)": rolled_back(
            engine, lambda c: c.execute(text(pruner.OUTBOX_PRUNE_SQL), {
                "retention_s": dispatch.outbox_retention_days * DAY_S, "batch": dispatch.outbox_prune_batch,
                "after_at": outbox.PRUNE_START[0], "after_id": 0})),
        "pruner: finished claims (a page)": rolled_back(
            engine, lambda c: claims.prune_finished(c, retention_s=dispatch.job_claims_retention_days * DAY_S,
                                                    batch=dispatch.job_claims_prune_batch)),
        "pruner: ended jobs' checkpoints (a round)": rolled_back(
            engine, lambda c: store.prune_ended(c, retention_s=hosted.checkpoint_retention_s,
                                                batch=hosted.checkpoints_prune_batch)),
        "verify --customer (hot)": read(lambda c: verify.verify(c, seeder.hot_customer)),
        "verify --customer (small)": read(lambda c: verify.verify(c, small)),
        "reservations list": read(lambda c: reads.list_reservations(c, limit=100)),
        "reservations list --open": read(lambda c: reads.list_reservations(c, states=("open", "unknown"), limit=100)),
        f"reservations list page {DEEP_PAGE}": read(
            lambda c: reads.reservation_page(c, limit=100, before=deep)),
    }


def deep_reservations_cursor(engine: Any) -> str | None:
    """The cursor of `reservations list`'s page DEEP_PAGE, paged to once before the timings."""
    from ledger import reads

    cursor = None
    with engine.connect() as conn:
        for _ in range(DEEP_PAGE - 1):
            cursor = reads.reservation_page(conn, limit=100, before=cursor).next_cursor
            if cursor is None:
                break
    return cursor


def first_small_customer(engine: Any, seeder: Seeder) -> str:
    from sqlalchemy import text

    with engine.connect() as conn:
        return conn.execute(text("SELECT customer_id FROM edge_tasks WHERE customer_id LIKE :p AND customer_id <> :h "
                                 "ORDER BY admitted_at LIMIT 1"),
                            {"p": CUSTOMER_PREFIX + "%", "h": seeder.hot_customer}).scalar_one()


def table_sizes(engine: Any) -> dict[str, int]:
    from sqlalchemy import text

    with engine.connect() as conn:
        return dict(conn.execute(text(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace")).all())


def measure_size(url: str, engine: Any, seeder: Seeder, small: str, repeat: int) -> dict[str, list[float]]:
    from sqlalchemy import text

    with engine.connect() as conn:
        sample = {who: list(conn.execute(text(
            "SELECT task_id FROM edge_tasks WHERE customer_id = :c ORDER BY random() LIMIT :n"),
            {"c": customer, "n": repeat + 1}).scalars()) for who, customer in (("hot", seeder.hot_customer),
                                                                               ("small", small))}
    results: dict[str, list[float]] = {}
    edge = Edge(url, {"hot": seeder.hot_customer, "small": small})
    try:
        for who in ("hot", "small"):
            tasks = itertools.cycle(sample[who])
            results[f"GetTask ({who})"] = timed(lambda: edge.get_task(who, next(tasks)), repeat)
            results[f"ListTasks first page ({who})"] = timed(lambda: edge.list_page(who, None), repeat)
            deep = edge.deep_token(who)
            if deep:
                results[f"ListTasks page {DEEP_PAGE} ({who})"] = timed(lambda: edge.list_page(who, deep), repeat)
        results["SendMessage, paced (hot)"] = timed(lambda: edge.send("hot"), repeat, pause_s=SEND_INTERVAL_S)
    finally:
        edge.close()
    for name, call in database_operations(engine, seeder, small).items():
        results[name] = timed(call, repeat)
    results["ledger verify (whole ledger)"] = timed(whole_verify(engine), 1)
    return results


def whole_verify(engine: Any) -> Callable[[], Any]:
    """`specialists ledger verify`'s path: ranges of 100 customers in one read-only snapshot, then the totals."""
    from ledger import verify

    def run() -> Any:
        with engine.connect() as conn:
            conn.exec_driver_sql(verify.SNAPSHOT_SQL)
            found = verify.verify_in_chunks(conn, customers_per_chunk=100).violations
            conn.rollback()
        if found:
            raise SystemExit(f"the seeded ledger does not verify: {found[:3]}")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,100000,1000000", help="task counts to measure at, ascending")
    parser.add_argument("--customers", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--keep", action="store_true", help="keep the database (its URL is printed)")
    parser.add_argument("--database", help="reuse a database --keep left")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if len(sizes) < 2:
        raise SystemExit("--sizes needs at least two sizes: the smallest is the baseline")

    from sqlalchemy import create_engine

    from core import db

    load_before = os.getloadavg()
    if args.database:
        url, drop = db.sqlalchemy_url(args.database), (lambda: None)
    else:
        url, drop = database(os.environ.get("DATABASE_URL"))
    engine = create_engine(url, pool_size=4)
    seeder = Seeder(engine, customers=args.customers, hot_share=0.10, final_tasks=sizes[-1])
    small = ""  # the customer of the oldest task that is not the hot customer's: it has tasks at every size
    by_size: dict[int, dict[str, list[float]]] = {}
    sizes_of: dict[int, dict[str, int]] = {}
    started = time.monotonic()
    try:
        for size in sizes:
            if seeder.seeded() > size:
                print(f"skipping {size:,}: the database already holds {seeder.seeded():,} tasks", file=sys.stderr)
                continue
            grown_from = time.monotonic()

            def progress(done: int, total: int) -> None:
                print(f"\rgrowing: {done:,} / {total:,} tasks ({time.monotonic() - grown_from:.0f} s)", end="",
                      file=sys.stderr, flush=True)

            seeder.grow_to(size, progress)
            small = small or first_small_customer(engine, seeder)
            print(f"\nmeasuring at {size:,} tasks ...", file=sys.stderr, flush=True)
            by_size[size] = measure_size(url, engine, seeder, small, args.repeat)
            sizes_of[size] = table_sizes(engine)
    finally:
        engine.dispose()
        if args.keep or args.database:
            print(f"database kept: {url}", file=sys.stderr)
        else:
            drop()
    report(by_size, sizes_of, load_before, time.monotonic() - started, args)


def report(by_size: dict[int, dict[str, list[float]]], sizes_of: dict[int, dict[str, int]],
           load_before: tuple[float, float, float], elapsed_s: float, args: argparse.Namespace) -> None:
    sizes = sorted(by_size)
    low, high = sizes[0], sizes[-1]
    print(f"\nmedian ms per operation; {args.customers} customers, the hot one holding a tenth of the tasks, the small "
          f"one a thousandth; {args.repeat} runs each; {os.cpu_count()} CPUs; load average "
          f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after; {elapsed_s / 60:.0f} min in all")
    head = f"{'operation':<44}" + "".join(f"{size:>12,}" for size in sizes) + f"{'ratio':>9}"
    print(head)
    for name in by_size[high]:
        medians = [statistics.median(by_size[s][name]) if name in by_size[s] else float("nan") for s in sizes]
        ratio = medians[-1] / medians[0] if medians[0] else float("nan")
        print(f"{name:<44}" + "".join(f"{m:>12.1f}" for m in medians) + f"{ratio:>8.2f}x")
    print(f"(ratio: the median at {high:,} tasks over the median at {low:,})")
    grown = high - low
    print(f"\nbytes per task, from the growth between {low:,} and {high:,} tasks (tables, their indexes and TOAST):")
    per_task = {t: (sizes_of[high].get(t, 0) - sizes_of[low].get(t, 0)) / grown for t in sizes_of[high]}
    for table, size in sorted(per_task.items(), key=lambda kv: -kv[1]):
        if size >= 1:
            print(f"{table:<26}{size:>10,.0f}   {sizes_of[high][table] / 2**20:>10,.0f} MiB at {high:,}")
    print(f"{'all tables':<26}{sum(per_task.values()):>10,.0f}   {sum(sizes_of[high].values()) / 2**30:>10,.2f} GiB at {high:,}")
    if os.environ.get("BENCH_JSON"):
        Path(os.environ["BENCH_JSON"]).write_text(json.dumps({"by_size": by_size, "sizes_of": sizes_of}))


if __name__ == "__main__":
    main()
