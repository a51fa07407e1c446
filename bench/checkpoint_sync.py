"""Benchmark of SPECIALISTS_SPECIALIST_CHECKPOINT_SYNC: what a hosted step's checkpoint costs the database.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/checkpoint_sync.py [--steps 200]

Starts its own database (a fresh one on the server named by DATABASE_URL, dropped
afterwards, or an embedded PostgreSQL) and writes, per "step", what the hosted
worker writes before a paid model call: a checkpoint record (``PgCheckpointStore.put``,
its fence included) and the journal row after it that waits for the WAL flush
(``Journal.start_call``, the run's one synchronous commit per model call).
Baseline, in the same run: the journal row alone. Rows: each policy, with
a delta-sized record (4 KiB) and a whole one (1 MiB); the ratio is against the
baseline. What the server flushes depends on its own fsync and disk: the figures
mean something only on a server with fsync on.

A benchmark, not a test: it prints figures and never fails on speed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.admission import database  # noqa: E402
from core import db  # noqa: E402
from core.settings import Settings  # noqa: E402
from taskstate import claims  # noqa: E402
from workers.hosted_rlm.hosted import session_id_for  # noqa: E402
from workers.hosted_rlm.journal import Journal  # noqa: E402
from workers.hosted_rlm.store import PgCheckpointStore  # noqa: E402

RECORD_SIZES = {"4 KiB record (a delta)": 4 * 1024, "1 MiB record (whole)": 1024 * 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per median (default 200)")
    args = parser.parse_args()
    url, cleanup = database(os.environ.get("DATABASE_URL"))
    engine = db.make_engine(url, Settings(database={"url": url}))
    try:
        with engine.connect() as conn:
            fsync = conn.exec_driver_sql("SHOW fsync").scalar()
        job_id = "bench-checkpoint-sync"
        with engine.begin() as conn:
            token = claims.claim(conn, job_id, worker_id="bench", lease_s=3600).fencing_token
        journal = Journal(engine, job_id=job_id, fencing_token=token)
        index = iter(range(10**9))
        seqs = iter(range(10**9))

        def step(store: PgCheckpointStore | None, data: bytes) -> None:
            seq = next(seqs)
            if store is not None:
                store.put(store.session_id, seq, data)
            journal.start_call(purpose="subcall", turn=1, step_index=next(index), after_seq=seq,
                               request_sha256=bytes(32), request_text=None, model=None)

        def median_s(store: PgCheckpointStore | None, data: bytes, steps: int) -> float:
            step(store, data)
            samples = []
            for _ in range(steps):
                started = time.perf_counter()
                step(store, data)
                samples.append(time.perf_counter() - started)
            return statistics.median(samples)

        baseline = median_s(None, b"", args.steps)
        rows = []
        for label, size in RECORD_SIZES.items():
            data = os.urandom(size)
            steps = args.steps if size < 1 << 20 else max(args.steps // 10, 5)
            for sync in ("each_record", "with_journal"):
                store = PgCheckpointStore(engine, job_id=job_id, fencing_token=token, session_id=session_id_for(job_id),
                                          sync=sync)  # type: ignore[arg-type]
                rows.append((f"{sync}: {label} + journal row", median_s(store, data, steps)))
        print(f"checkpoint commits against a journal row alone, median of {args.steps} steps (fewer for 1 MiB); "
              f"server fsync={fsync}")
        print(f"{'what':50} {'median':>10} {'/base':>7}")
        print(f"{'baseline: the journal row alone':50} {baseline * 1e3:>8.2f}ms {1:>6.1f}x")
        for what, seconds in rows:
            print(f"{what:50} {seconds * 1e3:>8.2f}ms {seconds / baseline:>6.1f}x")
    finally:
        engine.dispose()
        cleanup()  # type: ignore[operator]


if __name__ == "__main__":
    main()
