"""A worker's beat: the row of ``worker_beats`` that says it is alive and which specialists it serves (issue 42).

Written as the worker starts, every SPECIALISTS_WORKER_BEAT_S on a thread of its own (so a busy event loop or a
job cannot delay it), and deleted as it stops cleanly. A worker killed without a word stops beating, and health
says its specialists have no live worker once its last beat is older than SPECIALISTS_HEALTH_WORKER_LIVE_S.
A beat that fails (the database restarting) is logged and tried at the next interval: the worker goes on serving.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy import Engine

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
        self._thread = threading.Thread(target=self._run, name="worker-beat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _beat(self) -> None:
        try:
            with self._writing:
                if self._stop.is_set():
                    return
                with self.engine.begin() as conn:
                    liveness.beat(conn, self.worker_id, self.specialists)
            self.beats += 1
        except Exception as exc:  # the next interval tries again; health sees the gap if it lasts
            log.warning("worker %s could not write its beat (%s); trying again in %g s (SPECIALISTS_WORKER_BEAT_S)",
                        self.worker_id, type(exc).__name__, self.beat_s, extra={"event": "worker_beat_failed"})

    def _run(self) -> None:
        self._beat()
        while not self._stop.wait(self.beat_s):
            self._beat()

    def stop(self, timeout_s: float) -> None:
        """Stop beating and delete the row: health sees this worker gone at once, not after the live bound."""
        self._stop.set()
        self._thread.join(timeout_s)
        try:
            with self._writing, self.engine.begin() as conn:
                liveness.forget(conn, self.worker_id)
        except Exception as exc:  # its row ages out after SPECIALISTS_HEALTH_WORKER_LIVE_S instead
            log.warning("worker %s could not delete its beat as it stopped (%s)", self.worker_id,
                        type(exc).__name__)
