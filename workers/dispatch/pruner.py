"""Pruning the event log of finished tasks, so ``task_events`` does not grow forever.

Every task event is kept while the task may still be streamed. Once a task is
terminal (completed, failed, canceled, rejected) SubscribeToTask refuses it and
GetTask answers from the task row itself (its status, artifacts and history), so
its events serve nobody. Dispatchers delete the events of tasks that ended more
than ``task_events_retention_days`` ago, ``task_events_prune_batch`` at a time,
every ``task_events_prune_interval_s`` (a scan of ``tasks``: it has no index on
the state, so the interval is minutes, not the sweep's seconds). The statement
is the task tables' owner's (``taskstate.rows.prune_finished_events``).
"""

from __future__ import annotations

import logging

from sqlalchemy import Engine

from taskstate import rows

log = logging.getLogger(__name__)


def prune_task_events(engine: Engine, *, retention_s: float, batch: int) -> int:
    """Delete up to ``batch`` events of tasks terminal for longer than ``retention_s``; how many were deleted."""
    with engine.begin() as conn:
        deleted = rows.prune_finished_events(conn, retention_s=retention_s, batch=batch)
    if deleted:
        log.info("pruned %d event(s) of finished tasks", deleted, extra={"event": "task_events_pruned"})
    return deleted
