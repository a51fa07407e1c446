"""``ProgressWriter``: a run's progress reports written by a thread of their own, in the order they were made.

A progress report is a task event: a fenced transaction (the claim's fence, the task row locked, the row and its
event written) and a NOTIFY after it, four round trips to PostgreSQL. Made on the run's own thread, each one held the
run for those round trips, between its model calls and its steps (a fifth of a hosted review's run, measured in
docs/BENCHMARKS.md, "Progress off the run's path"). Here the run hands a report over and goes on; one thread writes
them, oldest first. ``close`` waits until every report handed over is written: the run closes it before it returns
its outcome, so every report precedes what the finish writes (the run's artifacts, then its final state).

A report is information, never money: one that cannot be written (the database is away, the claim was lost) is
logged and dropped, as the synchronous write dropped one whose fence failed; the run goes on, and its journal's own
writes stop it if the database is gone. At most ``MAX_PENDING_REPORTS`` wait at once: a run that reports faster
than the database takes them waits for room instead of growing a queue.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Final

log = logging.getLogger(__name__)

# Reports a run may have handed over and not yet written: a run reports once per turn and at most once per
# SUBCALL_REPORT_INTERVAL_S of semantic calls, so this is only reached when the database stalls.
MAX_PENDING_REPORTS: Final = 16
_CLOSED: Final = object()


class ProgressWriter:
    """Calls ``write(data)`` for each report handed to it, in order, on a thread of its own (started on the first
    report: a run that reports nothing starts none). Use as a context manager, or call ``close``."""

    def __init__(self, write: Callable[[dict[str, Any]], None], *, name: str = "progress") -> None:
        self._write = write
        self._name = name
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=MAX_PENDING_REPORTS)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.written = 0
        self.dropped = 0

    def __call__(self, data: dict[str, Any]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("progress reported after the run's writer was closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name=self._name, daemon=True)
                self._thread.start()
        self._queue.put(data)  # blocks while MAX_PENDING_REPORTS wait: the database sets the pace

    def _drain(self) -> None:
        while (data := self._queue.get()) is not _CLOSED:
            try:
                self._write(data)
                self.written += 1
            except Exception as exc:  # noqa: BLE001 - a report is never worth the run; its journal stops it
                self.dropped += 1
                log.warning("a progress report was not written (%s: %s); the run goes on", type(exc).__name__, exc)

    def close(self) -> None:
        """Wait until every report handed over is written (or dropped). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(_CLOSED)
            thread.join()

    def __enter__(self) -> ProgressWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
