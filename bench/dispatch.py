"""Dispatch benchmark: admission -> embedded dispatcher -> claim -> a no-op specialist -> settlement, two workers.

    .venv/bin/python bench/dispatch.py [--seconds 10] [--clients 16] [--warmup 2] [--cpu-share auto|nice|off]

Starts its own database: a fresh database on the server named by DATABASE_URL when it
is set (dropped afterwards), otherwise an embedded PostgreSQL in a temporary folder.

Processes on 127.0.0.1, as in production but on one machine: the edge (`specialists
serve`, edge only), one `specialists dispatcher` (embedded backend) delivering to two
`specialists worker` processes (4 job slots each). The specialist is the scripted one
with no steps (it completes at once) and a 1-credit tariff, so every job is reserved at
admission and settled by the worker's finish.

  closed loop  ``--clients`` customers each send a blocking SendMessage (it answers when
               the task completed) and send again: jobs/s through the whole path.
  paced        returnImmediately at 40% of that throughput: the added latency from
               admission (``edge_tasks.admitted_at``, the admission transaction's start)
               to the worker's claim (``job_claims.first_claimed_at``), both on the
               database clock, p50/p99; also admission to settled.
  baseline     the floor of the same hand-off without HTTP, signing, workers or the
               task store: a bare PostgreSQL queue in the same database (insert + commit +
               NOTIFY, a consumer process LISTENing that claims with FOR UPDATE SKIP LOCKED
               and marks done), flooded for throughput and paced at the same rate.

  cpu          in the closed loop, the CPU each role spent per settled job, from /proc: the edge, the
               dispatcher, the two workers with their job processes, and this database's PostgreSQL
               backends. On a machine shared with other work jobs/s follows the load; CPU per job does not.
               Beside them, not in the total: the benchmark's own clients' CPU per job (they share the cores).

A benchmark is not a test: it prints figures and ratios and never fails on speed.
Target (issue 4): admission to claim under 50 ms p50 with the embedded dispatcher.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.admission import _Connection, database, free_port, start  # noqa: E402
from ops.topology import READY_FD, Ready, Role, ops_cli, stop  # noqa: E402
from taskstate.ids import job_id_sql  # noqa: E402

SPEC_ID = "scripted"  # the worker's scripted runner; no script in the message: it completes at once
TARIFF = 1
SPEC = f"""\
id: {SPEC_ID}
name: No-op
description: The scripted specialist with no steps.
executor: rlm
tariff_credits: {TARIFF}
skill: {{id: noop, name: No-op, description: Completes at once.}}
input_modes: [text/plain]
output_modes: [text/plain]
"""
KEY_SECRET = "bench-signing-secret-" + "b" * 40
JOB_SECRET = "bench-worker-secret-" + "w" * 40
WORKERS = 2
SLOTS_PER_WORKER = 4


# --- load (a subprocess: `dispatch.py load URL SECONDS WARMUP RATE BLOCKING KEYS...`) ------------------


async def _load(url: str, seconds: float, warmup_s: float, rate_per_s: float, blocking: bool, keys: list[str]) -> dict:
    parts = urlsplit(url)
    interval_s = len(keys) / rate_per_s if rate_per_s > 0 else 0.0
    counts = {"ok": 0, "errors": 0}
    cpu_start = time.process_time()
    start = time.perf_counter()
    measure_from, stop_at = start + warmup_s, start + warmup_s + seconds

    async def client(index: int, key: str) -> None:
        connection = _Connection(parts.hostname, parts.port)
        headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {key}"}
        scheduled = start + (index / len(keys)) * interval_s
        while True:
            now = time.perf_counter()
            if interval_s:
                if scheduled > now:
                    await asyncio.sleep(scheduled - now)
                now, scheduled = scheduled, scheduled + interval_s
            if now >= stop_at:
                return
            body = {"message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": "go"}]}}
            if not blocking:
                body["configuration"] = {"returnImmediately": True}
            try:
                status = await connection.post(parts.path, headers, json.dumps(body).encode())
            except (IndexError, ConnectionError):
                # The server closed the connection while it was idle (uvicorn keeps one alive for 5 s, less than a
                # paced client's interval on a loaded machine): the request was not read; send it on a new one.
                connection = _Connection(parts.hostname, parts.port)
                status = await connection.post(parts.path, headers, json.dumps(body).encode())
            if now >= measure_from:
                counts["ok" if status == 200 else "errors"] += 1

    await asyncio.gather(*(client(i, key) for i, key in enumerate(keys)))
    return {**counts, "cpu_s": time.process_time() - cpu_start}  # the clients' own CPU, their imports left out


# --- the baseline queue (a subprocess: `dispatch.py baseline-consumer URL`) ----------------------------


BASELINE_TABLE = """
CREATE TABLE IF NOT EXISTS bench_queue (
    id          bigserial PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now(),
    claimed_at  timestamptz,
    done_at     timestamptz
);
CREATE INDEX IF NOT EXISTS bench_queue_open ON bench_queue (id) WHERE claimed_at IS NULL;
"""


def baseline_consumer(url: str) -> None:
    """LISTEN, claim due rows with SKIP LOCKED (one statement), then mark each done (one statement)."""
    import psycopg

    from taskstate.notify import libpq_url

    conninfo = libpq_url(url)
    with psycopg.connect(conninfo, autocommit=True) as listen, psycopg.connect(conninfo, autocommit=True) as work:
        listen.execute("LISTEN bench_queue")
        print("READY", flush=True)
        while True:
            rows = work.execute(
                "UPDATE bench_queue SET claimed_at = clock_timestamp() WHERE id IN (SELECT id FROM bench_queue "
                "WHERE claimed_at IS NULL ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 32) RETURNING id"
            ).fetchall()
            for (row_id,) in rows:
                work.execute("UPDATE bench_queue SET done_at = clock_timestamp() WHERE id = %s", (row_id,))
            if not rows:
                for _ in listen.notifies(timeout=0.5, stop_after=1):
                    pass


def baseline_produce(url: str, seconds: float, rate_per_s: float, threads: int) -> None:
    """Insert rows (each its own transaction) and NOTIFY after the commit, like admission does."""
    import psycopg

    from taskstate.notify import libpq_url

    conninfo = libpq_url(url)
    stop_at = time.perf_counter() + seconds
    interval_s = threads / rate_per_s if rate_per_s > 0 else 0.0

    def run(index: int) -> None:
        with psycopg.connect(conninfo) as conn:
            scheduled = time.perf_counter() + (index / threads) * interval_s
            while time.perf_counter() < stop_at:
                if interval_s:
                    time.sleep(max(0.0, scheduled - time.perf_counter()))
                    scheduled += interval_s
                with conn.transaction():
                    conn.execute("INSERT INTO bench_queue DEFAULT VALUES")
                conn.execute("SELECT pg_notify('bench_queue', '')")
                conn.commit()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


# --- orchestration ---------------------------------------------------------------------------------


def percentiles(values_s: list[float]) -> tuple[float, float]:
    if not values_s:
        return float("nan"), float("nan")
    values_s = sorted(values_s)
    return 1000 * statistics.median(values_s), 1000 * values_s[min(len(values_s) - 1, int(len(values_s) * 0.99))]


def db_now(engine) -> object:  # type: ignore[no-untyped-def]
    from sqlalchemy import text

    with engine.connect() as conn:
        return conn.execute(text("SELECT clock_timestamp()")).scalar_one()


def run_load(url: str, keys: list[str], seconds: float, warmup_s: float, rate_per_s: float, blocking: bool) -> dict:
    loader = subprocess.run(
        [sys.executable, __file__, "load", url, str(seconds), str(warmup_s), str(rate_per_s), str(int(blocking)), *keys],
        capture_output=True, text=True, timeout=seconds + warmup_s + 180,
    )
    if loader.returncode != 0:
        raise SystemExit(loader.stderr)
    return json.loads(loader.stdout)


def customers(url: str, count: int, prefix: str) -> list[str]:
    from sqlalchemy import create_engine

    from ledger import keys
    from ledger.client import Ledger

    engine = create_engine(url)
    signer = keys.KeySigner([KEY_SECRET], "test")
    ledger = Ledger(engine)
    tokens = []
    for i in range(count):
        customer = f"{prefix}-{i:03d}"
        tokens.append(keys.issue_key(engine, signer, customer_id=customer, ttl=timedelta(days=1)).token)
        ledger.grant(customer, 10**9, operator="bench", skills=[SPEC_ID], max_parallel=100_000, reason="bench")
    engine.dispose()
    return tokens


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its descendants: its own time, that of its children it has waited for (a
    worker's forkserver waits for every job process), and that of the live ones, recursively."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                    for c in (task / "children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    own = sum(int(f) for f in fields[11:15]) / _CLOCK_TICKS  # utime, stime, cutime, cstime
    return own + sum(tree_cpu_s(child) for child in children)


def backends_cpu_s(engine) -> float:  # type: ignore[no-untyped-def]
    """CPU seconds of the PostgreSQL backends connected to this database now (a backend that has exited is not
    counted: before issue 17 each job's process opened one, so the figure before undercounts)."""
    from sqlalchemy import text

    with engine.connect() as conn:
        pids = conn.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                 "AND pid <> pg_backend_pid()")).scalars().all()
    return sum(tree_cpu_s(pid) for pid in pids)


def own_cpu_s(pid: int) -> float:
    """CPU seconds of the process alone: its threads' user and system time, without its children's."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return sum(int(f) for f in fields[11:13]) / _CLOCK_TICKS  # utime, stime


# Shown beside the roles, not added to the total: the workers' own processes (HTTP, claim, the job's hand-off, its
# watcher, the finish), without their forkservers and job processes; and PostgreSQL's backends by the role they
# serve (libpq's ``PGAPPNAME``, set in each role's environment: ``APP_NAME_PREFIX`` + the role; a connection that
# names itself, the edge's listener, counts as "other").
WORKERS_OWN = "workers' own"
CLIENTS = "the benchmark's clients"  # on the same cores as the roles: what of the machine the path does not get
APP_NAME_PREFIX = "bench-dispatch-"
POSTGRES_OF = "postgres of "


def backends_cpu_by_role(engine) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """CPU seconds of this database's backends, by the role named in their application name."""
    from sqlalchemy import text

    with engine.connect() as conn:
        found = conn.execute(text("SELECT pid, application_name FROM pg_stat_activity "
                                  "WHERE datname = current_database() AND pid <> pg_backend_pid()")).all()
    by_role: dict[str, float] = {}
    for pid, name in found:
        role = name[len(APP_NAME_PREFIX):] if (name or "").startswith(APP_NAME_PREFIX) else "other"
        by_role[POSTGRES_OF + role] = by_role.get(POSTGRES_OF + role, 0.0) + tree_cpu_s(pid)
    return by_role


def cpu_snapshot(engine, roles: dict[str, list[int]]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    shot = {role: sum(tree_cpu_s(pid) for pid in pids) for role, pids in roles.items()}
    if roles:
        shot.update(backends_cpu_by_role(engine))
    shot["postgres"] = backends_cpu_s(engine)
    if "workers" in roles:
        shot[WORKERS_OWN] = sum(own_cpu_s(pid) for pid in roles["workers"])
    return shot


def settled_jobs(engine, prefix: str) -> int:  # type: ignore[no-untyped-def]
    from sqlalchemy import text

    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM edge_tasks e JOIN ledger_settlements s ON s.job_id = e.task_id "
                                 "WHERE e.customer_id LIKE :p"), {"p": f"{prefix}-%"}).scalar_one()


def measure_path(engine, url: str, keys: list[str], prefix: str, seconds: float, warmup_s: float,  # type: ignore[no-untyped-def]
                 rate_per_s: float, blocking: bool, roles: dict[str, list[int]] | None = None) -> dict:
    from sqlalchemy import text

    started = db_now(engine)
    cpu_before = cpu_snapshot(engine, roles or {})
    counts = run_load(url, keys, seconds, warmup_s, rate_per_s, blocking)
    time.sleep(1.0)  # let the last paced jobs finish
    cpu_after = cpu_snapshot(engine, roles or {})
    done = settled_jobs(engine, prefix)
    cpu_ms_per_job = {role: 1000 * (cpu_after[role] - cpu_before.get(role, 0.0)) / max(1, done) for role in cpu_after}
    if roles:
        cpu_ms_per_job[CLIENTS] = 1000 * counts["cpu_s"] / max(1, done)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT extract(epoch FROM c.first_claimed_at - e.admitted_at) AS to_claim, "
                "extract(epoch FROM s.at - e.admitted_at) AS to_settled, c.finished_at "
                "FROM edge_tasks e JOIN dispatch_outbox o ON o.task_id = e.task_id "
                f"JOIN job_claims c ON c.job_id = {job_id_sql('o')} "
                "LEFT JOIN ledger_settlements s ON s.job_id = e.task_id "
                "WHERE e.customer_id LIKE :p AND e.admitted_at >= :since + make_interval(secs => :warmup)"
            ),
            {"p": f"{prefix}-%", "since": started, "warmup": warmup_s},
        ).all()
        unsettled = conn.execute(
            text("SELECT count(*) FROM edge_tasks e LEFT JOIN ledger_settlements s ON s.job_id = e.task_id "
                 "WHERE e.customer_id LIKE :p AND s.job_id IS NULL"),
            {"p": f"{prefix}-%"},
        ).scalar_one()
    to_claim = [float(r.to_claim) for r in rows if r.to_claim is not None]
    to_settled = [float(r.to_settled) for r in rows if r.to_settled is not None]
    return {
        "jobs_per_s": counts["ok"] / seconds,
        "errors": counts["errors"],
        "claim": percentiles(to_claim),
        "settled": percentiles(to_settled),
        "jobs": len(rows),
        "unsettled": unsettled,
        "cpu_ms_per_job": cpu_ms_per_job,
    }


def measure_baseline(url: str, engine, seconds: float, rate_per_s: float, threads: int) -> dict:  # type: ignore[no-untyped-def]
    from sqlalchemy import text

    with engine.begin() as conn:
        conn.execute(text("TRUNCATE bench_queue"))
    started = time.perf_counter()
    baseline_produce(url, seconds, rate_per_s, threads)
    elapsed_s = time.perf_counter() - started
    time.sleep(1.0)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT extract(epoch FROM claimed_at - created_at) AS to_claim, "
                 "extract(epoch FROM done_at - created_at) AS to_done FROM bench_queue")
        ).all()
    done = [float(r.to_done) for r in rows if r.to_done is not None]
    return {
        "jobs_per_s": len(done) / elapsed_s,
        "claim": percentiles([float(r.to_claim) for r in rows if r.to_claim is not None]),
        "settled": percentiles(done),
        "jobs": len(rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--cpu-share", choices=("auto", "nice", "off"), default=None,
                        help="the workers' SPECIALISTS_WORKER_JOB_CPU_SHARE (default: the setting's, auto: a cgroup "
                             "per job where one can be made, as on this machine as root; production's image runs nice)")
    args = parser.parse_args()

    from sqlalchemy import create_engine, text

    load_before = os.getloadavg()[0]
    url, drop = database(os.environ.get("DATABASE_URL"))
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(BASELINE_TABLE))
    specs = Path(tempfile.mkdtemp(prefix="bench-dispatch-specs-"))
    (specs / f"{SPEC_ID}.yaml").write_text(SPEC)
    closed_keys = customers(url, args.clients, "closed")
    paced_keys = customers(url, args.clients, "paced")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECIALISTS_")}
    env.update(
        {
            "DATABASE_URL": url,
            "SPECIALISTS_KEY_SIGNING_SECRETS": KEY_SECRET,
            "SPECIALISTS_WORKER_JOB_SECRETS": JOB_SECRET,
            "SPECIALISTS_WORKER_OIDC_VERIFY": "false",
            "SPECIALISTS_SPECS_DIR": str(specs),
            "SPECIALISTS_RATE_LIMIT_PER_KEY": "10000000",
            "SPECIALISTS_RATE_LIMIT_GLOBAL": "100000000",
            "SPECIALISTS_LOG_LEVEL": "WARNING",
            "SPECIALISTS_DB_POOL_SIZE": str(args.clients + 8),
            "SPECIALISTS_SERVE_WORKER": "false",
            "SPECIALISTS_SERVE_DISPATCHER": "false",
            "SPECIALISTS_WORKER_MAX_CONCURRENT_JOBS": str(SLOTS_PER_WORKER),
            **({"SPECIALISTS_WORKER_JOB_CPU_SHARE": args.cpu_share} if args.cpu_share else {}),
        }
    )
    edge_port = free_port()
    worker_ports = [free_port() for _ in range(WORKERS)]
    processes: list[Role] = []
    consumer = None
    results: dict[str, dict] = {}
    try:
        for index, port in enumerate(worker_ports):
            processes.append(start(f"worker-{index}", ops_cli("worker", "--port", str(port)),
                                   {**env, "PGAPPNAME": APP_NAME_PREFIX + "workers"},
                                   Ready.http(f"http://127.0.0.1:{port}/healthz")))
        processes.append(start(
            "dispatcher", ops_cli("dispatcher", "--ready-fd", READY_FD),
            {**env, "PGAPPNAME": APP_NAME_PREFIX + "dispatcher",
             "SPECIALISTS_DISPATCH_WORKER_URL": ",".join(f"http://127.0.0.1:{p}/jobs" for p in worker_ports)},
            Ready.pipe(),
        ))
        edge = start("edge", ops_cli("serve", "--port", str(edge_port)), {**env, "PGAPPNAME": APP_NAME_PREFIX + "edge"},
                     Ready.http(f"http://127.0.0.1:{edge_port}/healthz"))
        processes.append(edge)
        for process in processes:
            process.wait_ready()
        send_url = f"http://127.0.0.1:{edge_port}/specialists/{SPEC_ID}/message:send"

        roles = {"edge": [edge.pid or 0], "dispatcher": [processes[WORKERS].pid or 0],
                 "workers": [p.pid or 0 for p in processes[:WORKERS]]}
        results["closed"] = measure_path(engine, send_url, closed_keys, "closed", args.seconds, args.warmup, 0.0, True,
                                         roles)
        paced_rate = max(1.0, 0.4 * results["closed"]["jobs_per_s"])
        results["paced"] = measure_path(engine, send_url, paced_keys, "paced", args.seconds, args.warmup, paced_rate,
                                        False)
        stop(processes)
        processes.clear()

        consumer = start("baseline-consumer", [sys.executable, __file__, "baseline-consumer", url], None,
                         Ready.line("READY"))
        consumer.wait_ready()
        results["baseline"] = measure_baseline(url, engine, args.seconds, 0.0, args.clients)
        results["baseline@"] = measure_baseline(url, engine, args.seconds, paced_rate, args.clients)
    finally:
        stop(processes)
        if consumer is not None:
            consumer.kill()
        engine.dispose()
        drop()

    print(
        f"\nDispatch: {args.clients} clients, {args.seconds:g} s per run, {WORKERS} workers x {SLOTS_PER_WORKER} slots, "
        f"{os.cpu_count()} CPUs, load average {load_before:.1f} before and {os.getloadavg()[0]:.1f} after"
        + (f", the jobs' CPU shared by SPECIALISTS_WORKER_JOB_CPU_SHARE={args.cpu_share}" if args.cpu_share else "")
    )
    print(f"{'run':<22}{'jobs/s':>8}{'to claim p50':>14}{'p99 ms':>8}{'to settled p50':>16}{'p99 ms':>8}  jobs")
    labels = {
        "closed": "path, closed loop",
        "paced": f"path @{paced_rate:.0f}/s",
        "baseline": "bare queue, flooded",
        "baseline@": f"bare queue @{paced_rate:.0f}/s",
    }
    for name, label in labels.items():
        r = results[name]
        extra = f"  errors {r['errors']}" if r.get("errors") else ""
        extra += f"  unsettled {r['unsettled']}" if r.get("unsettled") else ""
        print(f"{label:<22}{r['jobs_per_s']:>8.0f}{r['claim'][0]:>14.1f}{r['claim'][1]:>8.1f}"
              f"{r['settled'][0]:>16.1f}{r['settled'][1]:>8.1f}  {r['jobs']}{extra}")
    cpu = dict(results["closed"]["cpu_ms_per_job"])
    own = cpu.pop(WORKERS_OWN, None)
    clients = cpu.pop(CLIENTS, None)
    postgres_of = {role[len(POSTGRES_OF):]: cpu.pop(role) for role in list(cpu) if role.startswith(POSTGRES_OF)}
    print("\nCPU per job in the closed loop (ms, /proc; load-independent, unlike jobs/s): "
          + ", ".join(f"{role} {ms:.1f}" for role, ms in cpu.items()) + f"; total {sum(cpu.values()):.1f}"
          + ("" if own is None else f" (the workers' own processes {own:.1f}, without their job processes)"))
    print("PostgreSQL's CPU per job by the role its backends serve (ms): "
          + ", ".join(f"{role} {ms:.1f}" for role, ms in sorted(postgres_of.items())))
    if clients is not None:
        print(f"The benchmark's own clients, on the same {os.cpu_count()} CPUs: {clients:.1f} ms per job")
    paced = results["paced"]
    print(
        f"\nadmission -> claim p50 {paced['claim'][0]:.1f} ms at {paced_rate:.0f}/s (target < 50 ms); "
        f"the bare queue's floor {results['baseline@']['claim'][0]:.1f} ms; end-to-end throughput "
        f"{results['closed']['jobs_per_s']:.0f} jobs/s = {results['closed']['jobs_per_s'] / results['baseline']['jobs_per_s']:.0%} "
        "of the bare queue's"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "load":
        print(json.dumps(asyncio.run(_load(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]),
                                          sys.argv[6] == "1", sys.argv[7:]))))
    elif len(sys.argv) > 1 and sys.argv[1] == "baseline-consumer":
        baseline_consumer(sys.argv[2])
    else:
        main()
