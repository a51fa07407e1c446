"""Pruning what only a while needs: the event log of finished tasks, and expired Idempotency-Keys.

Every task event is kept while the task may still be streamed. Once a task is
terminal (completed, failed, canceled, rejected) SubscribeToTask refuses it and
GetTask answers from the task row itself (its status, artifacts and history), so
its events serve nobody. Dispatchers delete the events of tasks that ended more
than ``task_events_retention_days`` ago, ``task_events_prune_batch`` at a time,
every ``task_events_prune_interval_s`` (a scan of ``tasks``: it has no index on
the state, so the interval is minutes, not the sweep's seconds). The statement
is the task tables' owner's (``taskstate.rows.prune_finished_events``).

Idempotency-Keys past their retention (``SPECIALISTS_IDEMPOTENCY_KEY_RETENTION_S``)
are deleted in the same rounds, ``idempotency_keys_prune_batch`` at a time,
oldest first through the index on ``expires_at`` (``taskstate.idempotency``).
An expired key is already ignored by admission, so the prune only keeps the
table small. The dispatcher runs these rounds in its maintenance thread, beside
the sweeper and apart from deliveries; each statement is still bounded by
``PRUNE_STATEMENT_TIMEOUT_MS``, and a prune that fails is logged and tried next round.
"""

from __future__ import annotations

import logging

from sqlalchemy import Engine, text

from taskstate import idempotency, rows

log = logging.getLogger(__name__)


def prune_task_events(engine: Engine, *, retention_s: float, batch: int) -> int:
    """Delete up to ``batch`` events of tasks terminal for longer than ``retention_s``; how many were deleted."""
    with engine.begin() as conn:
        deleted = rows.prune_finished_events(conn, retention_s=retention_s, batch=batch)
    if deleted:
        log.info("pruned %d event(s) of finished tasks", deleted, extra={"event": "task_events_pruned"})
    return deleted


# The longest one key-prune statement may hold the dispatcher's loop (an index range of at most a batch of rows
# takes milliseconds; a lock or a cold cache must not stall deliveries).
PRUNE_STATEMENT_TIMEOUT_MS = 2000


def prune_idempotency_keys(engine: Engine, *, batch: int) -> int:
    """Delete up to ``batch`` expired Idempotency-Keys; how many were deleted (0 when the round failed)."""
    try:
        with engine.begin() as conn:
            conn.execute(text(f"SET LOCAL statement_timeout = {PRUNE_STATEMENT_TIMEOUT_MS}"))
            deleted = idempotency.prune_expired(conn, batch=batch)
    except Exception as exc:  # a timeout, the database restarting: the next round tries again
        log.warning("pruning expired idempotency keys failed (%s); next round tries again", type(exc).__name__,
                    extra={"event": "idempotency_keys_prune_failed"})
        return 0
    if deleted:
        log.info("pruned %d expired idempotency key(s)", deleted, extra={"event": "idempotency_keys_pruned"})
    return deleted
