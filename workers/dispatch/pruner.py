"""Retention: what only a while needs is deleted, in bounded statements, each served by an index (issue 18).

The dispatcher's maintenance thread runs a ``Pruner`` round every
``task_events_prune_interval_s``, beside the lease sweeper and apart from
deliveries. Each statement deletes at most its batch, runs under
``PRUNE_STATEMENT_TIMEOUT_MS``, and is its table owner's; a prune that fails is
logged and tried next round. What each one keeps and deletes:

* **Task events** (``task_events_retention_days``): every event of a task that
  ended (completed, failed, canceled, rejected) longer ago than the retention.
  A task that ended cannot be streamed, and GetTask answers from the task row
  itself, which is kept. The tasks are walked in the order they ended through
  the partial index ``tasks_ended``, from a cursor this process keeps
  (``rows.EndedCursor``): a round reads the tasks that ended since the last one,
  not every task that ever did. A new dispatcher walks from the start once, at
  most ``MAX_EVENT_PAGES_PER_ROUND`` pages a round.
* **Outbox rows of finished jobs** (``outbox_retention_days``): rows done,
  canceled or undeliverable for longer than the retention (their message is most
  of the outbox's bytes), oldest first through ``dispatch_outbox_finished``;
  except while the job's claim is running or unknown, or its task has not ended
  (it waits for input: its cancel and its follow-ups' charge read whether a run
  happened). The row is what makes a job claimable: a late delivery of a pruned
  job finds none and runs nothing (``outbox.claimable_cte``).
* **Finished claims** (``job_claims_retention_days``): finished or released claims
  past the retention whose outbox row is already gone, oldest first through
  ``job_claims_finished``, with their jobs' stale reports. Never a running or an
  unknown claim: unknown is kept until an operator reconciles it.
* **Idempotency-Keys** past ``SPECIALISTS_IDEMPOTENCY_KEY_RETENTION_S``, oldest first
  through the index on ``expires_at`` (``taskstate.idempotency``). An expired key
  is already ignored by admission; the prune only keeps the table small.

Kept forever, by design: the tasks themselves, and the ledger (its journal,
reservations and settlements are the money's record). Settings refuse a claims or
outbox retention shorter than the longest a delivery can still arrive
(``SPECIALISTS_WORKER_JOB_MAX_AGE_S`` + ``SPECIALISTS_DISPATCH_DEADLINE_S``): a
late delivery of a pruned job is refused by the claim, and should not even come.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import Connection, Engine, text

from core.settings import Settings
from taskstate import claims, idempotency, ids, outbox, rows

log = logging.getLogger(__name__)

DAY_S = 86_400.0

# The longest one prune statement may hold the maintenance thread (an index range of at most a batch of rows takes
# milliseconds; a lock or a cold cache must not stall the sweeper).
PRUNE_STATEMENT_TIMEOUT_MS = 2000
# A new dispatcher's events walk starts at the oldest ended task: at most this many pages of tasks a round until it
# has caught up (each page one statement of at most a batch of tasks and a batch of events).
MAX_EVENT_PAGES_PER_ROUND = 20


def _bounded(engine: Engine, what: str, statement: Callable[[Connection], int]) -> int:
    """Run one prune statement in its own transaction under the statement timeout; how many rows it deleted
    (0 when it failed: the next round tries again). Logged as ``<what>_pruned`` / ``<what>_prune_failed``."""
    try:
        with engine.begin() as conn:
            conn.execute(text(f"SET LOCAL statement_timeout = {PRUNE_STATEMENT_TIMEOUT_MS}"))
            deleted = statement(conn)
    except Exception as exc:  # a timeout, the database restarting: the next round tries again
        log.warning("pruning %s failed (%s); next round tries again", what.replace("_", " "), type(exc).__name__,
                    extra={"event": f"{what}_prune_failed"})
        return 0
    if deleted:
        log.info("pruned %d %s", deleted, what.replace("_", " "), extra={"event": f"{what}_pruned"})
    return deleted


class TaskEventsPruner:
    """The events of ended tasks, walked in the order the tasks ended from a cursor kept between rounds."""

    def __init__(self, engine: Engine, *, retention_s: float, batch: int) -> None:
        self.engine = engine
        self.retention_s = retention_s
        self.batch = batch
        self.after = rows.EVENTS_WALK_START

    def round(self) -> int:
        """Delete up to ``batch`` events; how many were deleted."""
        deleted = 0
        for _ in range(MAX_EVENT_PAGES_PER_ROUND):
            allowance = self.batch - deleted
            try:
                with self.engine.begin() as conn:
                    conn.execute(text(f"SET LOCAL statement_timeout = {PRUNE_STATEMENT_TIMEOUT_MS}"))
                    page = rows.prune_finished_events(conn, retention_s=self.retention_s, batch=allowance,
                                                      page=self.batch, after=self.after)
            except Exception as exc:  # a timeout, the database restarting: the next round tries again
                log.warning("pruning task events failed (%s); next round tries again", type(exc).__name__,
                            extra={"event": "task_events_prune_failed"})
                break
            deleted += page.deleted
            if page.deleted >= allowance:
                break  # the batch is spent; the same page goes on next round
            if page.last is not None:
                self.after = page.last  # every event of the page is gone
            if page.tasks < self.batch:
                break  # the walk reached the tasks that ended within the retention
        if deleted:
            log.info("pruned %d event(s) of ended tasks", deleted, extra={"event": "task_events_pruned"})
        return deleted


def prune_task_events(engine: Engine, *, retention_s: float, batch: int) -> int:
    """One round of a walk from the start (a new dispatcher's first round); how many events were deleted."""
    return TaskEventsPruner(engine, retention_s=retention_s, batch=batch).round()


def prune_idempotency_keys(engine: Engine, *, batch: int) -> int:
    """Delete up to ``batch`` expired Idempotency-Keys; how many were deleted (0 when the round failed)."""
    return _bounded(engine, "idempotency_keys", lambda conn: idempotency.prune_expired(conn, batch=batch))


# The outbox prune, from its owners' fragments: a row goes once its job's claim decides nothing any more and its
# task has ended.
_OUTBOX_PRUNE = text(outbox.prune_finished_sql(
    only=f"{claims.settled_sql(ids.job_id_sql('r'))} AND {rows.ended_task_sql('r.task_id')}"
))
OUTBOX_PRUNE_SQL = str(_OUTBOX_PRUNE)


def prune_finished_outbox(engine: Engine, *, retention_s: float, batch: int) -> int:
    """Delete up to ``batch`` outbox rows of finished jobs of ended tasks past ``retention_s``; how many."""
    return _bounded(engine, "outbox_rows", lambda conn: int(
        conn.execute(_OUTBOX_PRUNE, {"retention_s": retention_s, "batch": batch}).rowcount))


def prune_finished_claims(engine: Engine, *, retention_s: float, batch: int) -> int:
    """Delete up to ``batch`` finished claims past ``retention_s`` whose outbox row is gone; how many."""
    return _bounded(engine, "job_claims",
                    lambda conn: claims.prune_finished(conn, retention_s=retention_s, batch=batch))


class Pruner:
    """Every prune, one round each, with the dispatcher's settings."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        dispatch = settings.dispatch
        self.engine = engine
        self.dispatch = dispatch
        self.events = TaskEventsPruner(engine, retention_s=dispatch.task_events_retention_days * DAY_S,
                                       batch=dispatch.task_events_prune_batch)

    def round(self) -> dict[str, int]:
        """One bounded round of each prune: how many rows each deleted. The outbox goes before the claims, whose
        rows it frees."""
        dispatch = self.dispatch
        return {
            "task_events": self.events.round(),
            "idempotency_keys": prune_idempotency_keys(self.engine, batch=dispatch.idempotency_keys_prune_batch),
            "outbox": prune_finished_outbox(self.engine, retention_s=dispatch.outbox_retention_days * DAY_S,
                                            batch=dispatch.outbox_prune_batch),
            "claims": prune_finished_claims(self.engine, retention_s=dispatch.job_claims_retention_days * DAY_S,
                                            batch=dispatch.job_claims_prune_batch),
        }
