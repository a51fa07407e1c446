"""A worker's beat: the row of ``worker_beats`` that says it is alive and which specialists it serves (issue 42).

Written as the worker starts, every SPECIALISTS_WORKER_BEAT_S on a thread of its own (so a busy event loop or a
job cannot delay it) and on a connection of its own, checked out at the first beat and held to the stop (so the
worker's other work cannot delay it either: with every pooled connection taken by claims, renewals and finishes, a
beat waiting for one would wait up to the pool's timeout, and the dispatchers' sweeper takes a worker whose beat is
SPECIALISTS_WORKER_DEAD_AFTER_BEATS late for dead), and deleted as it stops cleanly. A worker killed without a word
stops beating, and health says its specialists have no live worker once its last beat is older than
SPECIALISTS_HEALTH_WORKER_LIVE_S. A beat that fails (the database restarting) is logged and tried at the next
interval on a new connection: the worker goes on serving.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy import Connection, Engine

from core import db
from taskstate import liveness

log = logging.getLogger(__name__)


class WorkerBeat:
    def __init__(self, engine: Engine, *, worker_id: str, specialists: list[str], beat_s: float) -> None:
        assert beat_s > 0, "SPECIALISTS_WORKER_BEAT_S is positive"
        self.engine = engine
        self.worker_id = worker_id
        self.specialists = sorted(specialists)
        self.beat_s = beat_s
        self.beats = 0  # written so far (tests and the log read it)
        self._stop = threading.Event()
        # Held across a beat's write and the stop's delete: a slow beat cannot land after the delete and bring the
        # row back (health would then see a stopped worker live for SPECIALISTS_HEALTH_WORKER_LIVE_S).
        self._writing = threading.Lock()
        self._conn: Connection | None = None  # the beat's own, checked out once (under ``_writing``)
        self._thread = threading.Thread(target=self._run, name="worker-beat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _beat(self) -> None:
        with self._writing:
            if self._stop.is_set():
                return
            try:
                db.retrying_once(self._write_beat)  # a connection the server dropped is replaced at once
            except Exception as exc:  # the next interval tries again; health sees the gap if it lasts
                self._drop()
                log.warning("worker %s could not write its beat (%s); trying again in %g s "
                            "(SPECIALISTS_WORKER_BEAT_S)", self.worker_id, type(exc).__name__, self.beat_s,
                            extra={"event": "worker_beat_failed"})
                return
        self.beats += 1

    def _own(self) -> Connection:
        if self._conn is None:
            self._conn = self.engine.connect()
        return self._conn

    def _drop(self) -> None:
        """After a failure: the connection is discarded, not pooled (it may be unusable); the next beat takes one."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.invalidate()
            conn.close()

    def _write_beat(self) -> None:
        conn = self._own()
        with conn.begin():
            liveness.beat(conn, self.worker_id, self.specialists)

    def _run(self) -> None:
        self._beat()
        while not self._stop.wait(self.beat_s):
            self._beat()

    def stop(self, timeout_s: float) -> None:
        """Stop beating and delete the row: health sees this worker gone at once, not after the live bound."""
        self._stop.set()
        self._thread.join(timeout_s)
        with self._writing:
            try:
                conn = self._own()
                with conn.begin():
                    liveness.forget(conn, self.worker_id)
            except Exception as exc:  # its row ages out after SPECIALISTS_HEALTH_WORKER_LIVE_S instead
                log.warning("worker %s could not delete its beat as it stopped (%s)", self.worker_id,
                            type(exc).__name__)
            finally:
                if self._conn is not None:
                    self._conn.close()  # back to the pool, whose other users may now have it
                    self._conn = None
