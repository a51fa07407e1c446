"""Task-event benchmark: a worker's events on a task whose history holds the customer's 328 KiB message,
against the same events on a task whose message is tiny (the baseline), in the same process.

    .venv/bin/python bench/task_events.py [--events 200] [--message-kib 328] [--json]

Starts its own database: a fresh database on the server named by DATABASE_URL when it is
set (dropped afterwards), otherwise an embedded PostgreSQL in a temporary folder.

Each event goes through ``TaskEvents.emit`` as a worker sends it: fenced by its claim,
one transaction, then the notification. Kinds:

  progress   a status update with a message: the previous status message moves into the
             history (the a2a-sdk's rule), so the history itself changes
  artifact   the same artifact replaced: the history is left alone

Per kind and task: the mean and p50 ms per event (sequential, one connection at a time),
and for one more event the bytes sent and received (statement parameters and results)
and the WAL its transaction wrote (``bench/task_event_cost.py``). Ratio: large / tiny.
A benchmark is not a test: it prints figures and never fails on speed.
Target (issue 17): a progress event's cost does not grow with the size of the message.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.admission import database  # noqa: E402
from bench.task_event_cost import claimed_task, ensure_walinspect, measure  # noqa: E402

TINY_MESSAGE_BYTES = 16
KINDS = ("progress", "artifact")


def _emitter(events, job, token: int, kind: str) -> Callable[[int], None]:  # noqa: ANN001
    if kind == "progress":
        return lambda i: events.emit(job, token, "progress", {"text": f"step {i}"})
    return lambda i: events.emit(job, token, "artifact", {"id": "report", "text": f"draft {i}"})


def run_kind(engine, kind: str, message_bytes: int, count: int) -> dict:  # noqa: ANN001
    from taskstate.updates import TaskEvents

    job, token = claimed_task(engine, message_bytes)
    events = TaskEvents(engine)
    emit = _emitter(events, job, token, kind)
    emit(0)  # the task is WORKING with a status message from here on, as after a run's first step
    times_ms = []
    for i in range(1, count + 1):
        started = time.perf_counter()
        emit(i)
        times_ms.append(1000 * (time.perf_counter() - started))
    cost = measure(engine, job.payload["t"], lambda: emit(count + 1))
    return {
        "mean_ms": statistics.fmean(times_ms),
        "p50_ms": statistics.median(times_ms),
        "wire_bytes": cost.wire.total_bytes,
        "wal_bytes": cost.wal_bytes,
        "statements": cost.wire.statements,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200, help="events per kind and task")
    parser.add_argument("--message-kib", type=int, default=328, help="the large task's message, KiB")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from sqlalchemy import create_engine

    url, drop = database(os.environ.get("DATABASE_URL"))
    engine = create_engine(url, pool_size=2)
    try:
        ensure_walinspect(engine)
        results = {}
        for kind in KINDS:
            tiny = run_kind(engine, kind, TINY_MESSAGE_BYTES, args.events)
            large = run_kind(engine, kind, args.message_kib * 1024, args.events)
            results[kind] = {"tiny": tiny, "large": large}
    finally:
        engine.dispose()
        drop()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.events} events per kind; large: a {args.message_kib} KiB message in the history; "
          f"baseline: a {TINY_MESSAGE_BYTES} B one")
    print(f"{'kind':<10} {'figure':<12} {'tiny':>12} {'large':>12} {'large/tiny':>11}")
    for kind, pair in results.items():
        for figure in ("mean_ms", "p50_ms", "wire_bytes", "wal_bytes", "statements"):
            tiny, large = pair["tiny"][figure], pair["large"][figure]
            ratio = large / tiny if tiny else float("nan")
            print(f"{kind:<10} {figure:<12} {tiny:>12.2f} {large:>12.2f} {ratio:>10.2f}x")


if __name__ == "__main__":
    main()
