"""The owner of ``worker_beats``: which workers are alive, and which specialists each serves (issue 42).

A worker's claims say only that it worked: an idle worker writes nothing, and a killed one leaves its last claims
behind, so neither can tell health that a specialist has no worker left. Each worker process keeps one row here
instead: it writes it as it starts, again every SPECIALISTS_WORKER_BEAT_S with the specialists it serves, and
deletes it as it stops cleanly. A row whose beat is older than SPECIALISTS_HEALTH_WORKER_LIVE_S is a worker that
died without saying so (SIGKILL, a lost machine). Times are the database's (``now()``), as the claims' are, so the
workers' clocks do not matter.

Each beat also deletes up to ``PRUNE_BATCH`` rows dead for ``DEAD_RETENTION_S``: dead workers' rows are shown for
a day (health names what died), then go, without a job of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from core.db import compact_sql

MAX_SPECIALISTS_PER_WORKER = 1000  # worker_beats.specialists' CHECK (migration 0270)
MAX_WORKER_ID_CHARS = 200  # worker_beats.worker_id's CHECK
DEAD_RETENTION_S = 86_400.0  # a dead worker's row is kept this long, so health can say what died
PRUNE_BATCH = 100  # rows past DEAD_RETENTION_S one beat deletes at most
MAX_WORKERS_READ = 1000  # the rows one read returns at most (newest beat first)

_BEAT = text(compact_sql("""
    WITH dead AS (DELETE FROM worker_beats WHERE worker_id IN (
                      SELECT worker_id FROM worker_beats
                       WHERE beat_at < now() - make_interval(secs => :retention_s) AND worker_id <> :worker
                       ORDER BY beat_at LIMIT :batch)
                  RETURNING 1)
    INSERT INTO worker_beats AS b (worker_id, specialists) VALUES (:worker, CAST(:specialists AS text[]))
    ON CONFLICT (worker_id) DO UPDATE SET specialists = EXCLUDED.specialists, beat_at = now()
    RETURNING (SELECT count(*) FROM dead) AS pruned
"""))
_FORGET = text("DELETE FROM worker_beats WHERE worker_id = :worker")
_READ = text(compact_sql("""
    SELECT worker_id, specialists, started_at, beat_at, now() - beat_at <= make_interval(secs => :live_s) AS live,
           EXTRACT(EPOCH FROM now() - beat_at) AS beat_age_s
      FROM worker_beats ORDER BY beat_at DESC, worker_id LIMIT :n
"""))


@dataclass(frozen=True)
class WorkerBeat:
    worker_id: str
    specialists: tuple[str, ...]
    started_at: datetime
    beat_at: datetime
    beat_age_s: float
    live: bool  # beat within the read's live bound


def beat(conn: Connection, worker_id: str, specialists: list[str]) -> int:
    """Say that ``worker_id`` is alive and serves ``specialists``; returns how many dead rows it pruned."""
    if not 1 <= len(worker_id) <= MAX_WORKER_ID_CHARS:
        raise ValueError(f"a worker id has 1 to {MAX_WORKER_ID_CHARS} characters, not {len(worker_id)}")
    if len(specialists) > MAX_SPECIALISTS_PER_WORKER:
        raise ValueError(f"a worker serves at most {MAX_SPECIALISTS_PER_WORKER} specialists, not {len(specialists)}")
    return int(conn.execute(_BEAT, {"worker": worker_id, "specialists": sorted(set(specialists)),
                                    "retention_s": DEAD_RETENTION_S, "batch": PRUNE_BATCH}).scalar_one())


def forget(conn: Connection, worker_id: str) -> None:
    """A worker stopping cleanly: it is gone now, not after the live bound."""
    conn.execute(_FORGET, {"worker": worker_id})


def stopped_beating_sql(worker_id: str) -> str:
    """A condition: the worker id expression ``worker_id`` has a beat row older than ``:dead_after_s`` seconds by the
    database's clock (parameter ``dead_after_s``): a worker that died without a word (SIGKILL, a lost machine), by
    its primary key. A worker that never beat, or stopped cleanly (its row deleted), is not one: its claims are
    left to their leases."""
    return (f"EXISTS (SELECT 1 FROM worker_beats b WHERE b.worker_id = {worker_id} "
            "AND b.beat_at < now() - make_interval(secs => :dead_after_s))")


def workers(conn: Connection, *, live_s: float) -> list[WorkerBeat]:
    """The workers that beat within ``DEAD_RETENTION_S``, newest beat first (at most ``MAX_WORKERS_READ``), each
    ``live`` when its beat is at most ``live_s`` old by the database's clock."""
    return [WorkerBeat(r.worker_id, tuple(r.specialists), r.started_at, r.beat_at, float(r.beat_age_s), bool(r.live))
            for r in conn.execute(_READ, {"live_s": live_s, "n": MAX_WORKERS_READ})]
