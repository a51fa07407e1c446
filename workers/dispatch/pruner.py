"""Retention: what only a while needs is deleted, in bounded statements, each served by an index (issue 18).

The dispatcher's maintenance thread runs a ``Pruner`` round every
``task_events_prune_interval_s``, beside the lease sweeper and apart from
deliveries. Each prune is a ``Walk`` over its table's partial index of what has
ended, oldest first, one page a statement (``taskstate.pages``), from a cursor
kept between rounds: what it deletes leaves the index, what it must keep is
passed and not read again every round; every ``prune_rescan_interval_s`` the
outbox and claims walks start from the oldest again, for what has ended since it
was passed (a task that waited for input, a job an operator reconciled). A round deletes at most its
batch, in at most ``MAX_PAGES_PER_ROUND`` statements, each its table owner's and
under ``PRUNE_STATEMENT_TIMEOUT_MS``; a prune that fails is logged and tried next
round. What each one keeps and deletes:

* **Task events** (``task_events_retention_days``): every event of a task that
  ended (completed, failed, canceled, rejected) longer ago than the retention.
  A task that ended cannot be streamed, and GetTask answers from the task row
  itself, which is kept. The tasks are walked in the order they ended through
  the partial index ``tasks_ended``: a round reads the tasks that ended since the
  last one, not every task that ever did.
* **Outbox rows of finished jobs** (``outbox_retention_days``): rows done,
  canceled or undeliverable for longer than the retention (their message is most
  of the outbox's bytes), oldest first through ``dispatch_outbox_finished``;
  except while the job's claim is running or unknown, or its task has not ended
  (it waits for input: its cancel and its follow-ups' charge read whether a run
  happened). The row is what makes a job claimable: a late delivery of a pruned
  job finds none and runs nothing (``outbox.claimable_cte``). Rows a claim holds
  at that moment are passed, like kept ones.
* **Push notifications** (``SPECIALISTS_PUSH_RETENTION_DAYS``): delivered and failed notifications past the
  retention (the failures' list shows what is left), and the configurations of tasks that ended with nothing
  left to send, both oldest first by their own indexes (``taskstate.push.prune``), ``push_prune_batch`` a round.
* **Finished claims** (``job_claims_retention_days``): finished or released claims
  past the retention whose outbox row is already gone, oldest first through
  ``job_claims_finished``, with their jobs' stale reports. Never a running or an
  unknown claim: unknown is kept until an operator reconciles it.
* **Monty checkpoints** (``SPECIALISTS_SPECIALIST_CHECKPOINT_RETENTION_S``) of jobs
  that can no longer resume (their claim finished or unknown), oldest first through
  the index on ``created_at``; a running or released job keeps its own.
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
import math
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, text

from core.settings import Settings
from taskstate import claims, idempotency, ids, outbox, push, rows
from taskstate.pages import Page, page_of
from workers.hosted_rlm import store

log = logging.getLogger(__name__)

DAY_S = 86_400.0

# The longest one prune statement may hold the maintenance thread (an index range of at most a batch of rows takes
# milliseconds; a lock or a cold cache must not stall the sweeper).
PRUNE_STATEMENT_TIMEOUT_MS = 2000
# Statements one walk sends in a round at most (a new dispatcher's walk over the ended tasks catches up this fast;
# a round still deletes at most its batch).
MAX_PAGES_PER_ROUND = 20

# A page: (connection, the cursor, how many rows it may delete) -> what it did.
PageStatement = Callable[[Connection, tuple[Any, ...], int], Page]


def _in_transaction(engine: Engine, statement: Callable[[Connection], Any]) -> Any:
    """Run one prune statement in its own transaction, under the statement timeout."""
    with engine.begin() as conn:
        conn.execute(text(f"SET LOCAL statement_timeout = {PRUNE_STATEMENT_TIMEOUT_MS}"))
        return statement(conn)


class Walk:
    """One prune's walk over its index, a page a statement, from a cursor kept between rounds (module doc)."""

    def __init__(self, engine: Engine, what: str, page: PageStatement, *, start: tuple[Any, ...], batch: int,
                 rescan_s: float) -> None:
        self.engine = engine
        self.what = what  # names its log events: <what>_pruned, <what>_prune_failed
        self.page = page
        self.start = start
        self.batch = batch
        self.rescan_s = rescan_s
        self.after = start
        self.started = time.monotonic()

    def round(self) -> int:
        """Delete up to ``batch`` rows; how many were deleted (0 when the round failed: the next one tries again)."""
        deleted = 0
        for _ in range(MAX_PAGES_PER_ROUND):
            allowance = self.batch - deleted
            try:
                page = _in_transaction(self.engine, lambda conn: self.page(conn, self.after, allowance))
            except Exception as exc:  # a timeout, the database restarting: the next round tries again
                log.warning("pruning %s failed (%s); next round tries again", self.what.replace("_", " "),
                            type(exc).__name__, extra={"event": f"{self.what}_prune_failed"})
                break
            deleted += page.deleted
            if page.last is not None:
                self.after = page.last
            if page.at_edge:
                if time.monotonic() - self.started >= self.rescan_s:
                    self.after, self.started = self.start, time.monotonic()
                break
            if deleted >= self.batch:
                break
        if deleted:
            log.info("pruned %d %s", deleted, self.what.replace("_", " "), extra={"event": f"{self.what}_pruned"})
        return deleted


def task_events_walk(engine: Engine, *, retention_s: float, batch: int, rescan_s: float = math.inf) -> Walk:
    """The events of ended tasks: pages of ``batch`` tasks, at most ``batch`` events a round. It passes nothing it
    must keep (a page is done once all its events are gone), so it does not rescan: a rescan would read every task
    that ever ended (5.5 s at 1M tasks). A task whose status time was written behind the walk (a clock more than
    the retention behind) is reached when a dispatcher starts again."""
    return Walk(engine, "task_events",
                lambda conn, after, allowance: rows.prune_finished_events(
                    conn, retention_s=retention_s, batch=allowance, page=batch, after=after),  # type: ignore[arg-type]
                start=rows.EVENTS_WALK_START, batch=batch, rescan_s=rescan_s)


# The outbox prune, from its owners' fragments: a row goes once its job's claim decides nothing any more and its
# task has ended.
_OUTBOX_PRUNE = text(outbox.prune_finished_sql(
    only=f"{claims.settled_sql(ids.job_id_sql('r'))} AND {rows.ended_task_sql('r.task_id')}"
))
OUTBOX_PRUNE_SQL = str(_OUTBOX_PRUNE)


def outbox_walk(engine: Engine, *, retention_s: float, batch: int, rescan_s: float = DAY_S) -> Walk:
    """The outbox rows of finished jobs of ended tasks, closed more than ``retention_s`` ago."""
    def page(conn: Connection, after: tuple[Any, ...], allowance: int) -> Page:
        row = conn.execute(_OUTBOX_PRUNE, {"retention_s": retention_s, "batch": allowance, "after_at": after[0],
                                           "after_id": after[1]}).one()
        return page_of(row, asked=allowance)

    return Walk(engine, "outbox_rows", page, start=outbox.PRUNE_START, batch=batch, rescan_s=rescan_s)


def claims_walk(engine: Engine, *, retention_s: float, batch: int, rescan_s: float = DAY_S) -> Walk:
    """Finished claims past ``retention_s`` whose job's outbox row is gone."""
    return Walk(engine, "job_claims",
                lambda conn, after, allowance: claims.prune_finished(
                    conn, retention_s=retention_s, batch=allowance, after=after),  # type: ignore[arg-type]
                start=claims.PRUNE_START, batch=batch, rescan_s=rescan_s)


def prune_task_events(engine: Engine, *, retention_s: float, batch: int) -> int:
    """One round of a walk from the start (a new dispatcher's first round); how many events were deleted."""
    return task_events_walk(engine, retention_s=retention_s, batch=batch).round()


def prune_finished_outbox(engine: Engine, *, retention_s: float, batch: int) -> int:
    """One round of a walk from the start over the outbox rows of finished jobs; how many were deleted."""
    return outbox_walk(engine, retention_s=retention_s, batch=batch).round()


def prune_finished_claims(engine: Engine, *, retention_s: float, batch: int) -> int:
    """One round of a walk from the start over the finished claims; how many were deleted."""
    return claims_walk(engine, retention_s=retention_s, batch=batch).round()


def _prune_once(engine: Engine, what: str, event: str, statement: Callable[[Connection], int]) -> int:
    """One bounded delete whose index holds only what is left to delete (no walk): how many rows it deleted, 0 when
    the round failed (a timeout, the database restarting: the next round tries again)."""
    try:
        deleted = _in_transaction(engine, statement)
    except Exception as exc:
        log.warning("pruning %s failed (%s); next round tries again", what, type(exc).__name__,
                    extra={"event": f"{event}_prune_failed"})
        return 0
    if deleted:
        log.info("pruned %d %s", deleted, what, extra={"event": f"{event}_pruned"})
    return deleted


def prune_idempotency_keys(engine: Engine, *, batch: int) -> int:
    """Delete up to ``batch`` expired Idempotency-Keys. Expired keys are deleted whatever else: the index on
    ``expires_at`` holds only what is left."""
    return _prune_once(engine, "expired idempotency key(s)", "idempotency_keys",
                       lambda conn: idempotency.prune_expired(conn, batch=batch))


def prune_checkpoints(engine: Engine, *, retention_s: float, batch: int) -> int:
    """Delete up to ``batch`` Monty checkpoints past their retention of jobs that can no longer resume
    (``workers.hosted_rlm.store.prune_ended``; docs/WORKERS.md, "Checkpoint retention"). No walk: what a round
    skips are the checkpoints of jobs in flight, at most a few."""
    return _prune_once(engine, "checkpoint(s) of ended jobs", "checkpoints",
                       lambda conn: store.prune_ended(conn, retention_s=retention_s, batch=batch))


def prune_push(engine: Engine, *, retention_s: float, batch: int) -> int:
    """Delete up to ``batch`` finished push notifications past retention, and as many configurations of ended
    tasks with nothing left to send (``taskstate.push.prune``): index ranges by age."""
    return _prune_once(engine, "push notification(s) and configuration(s)", "push",
                       lambda conn: push.prune(conn, retention_s=retention_s, batch=batch))


class Pruner:
    """Every prune, one round each, with the dispatcher's settings; the walks keep their cursors between rounds."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        dispatch = settings.dispatch
        self.engine = engine
        self.keys_batch = dispatch.idempotency_keys_prune_batch
        self.checkpoint_retention_s = settings.hosted.checkpoint_retention_s
        self.checkpoints_batch = settings.hosted.checkpoints_prune_batch
        self.push_retention_s = settings.push.retention_days * DAY_S
        self.push_batch = settings.push.prune_batch
        rescan_s = dispatch.prune_rescan_interval_s
        self.events = task_events_walk(engine, retention_s=dispatch.task_events_retention_days * DAY_S,
                                       batch=dispatch.task_events_prune_batch)
        self.outbox = outbox_walk(engine, retention_s=dispatch.outbox_retention_days * DAY_S,
                                  batch=dispatch.outbox_prune_batch, rescan_s=rescan_s)
        self.claims = claims_walk(engine, retention_s=dispatch.job_claims_retention_days * DAY_S,
                                  batch=dispatch.job_claims_prune_batch, rescan_s=rescan_s)

    def round(self) -> dict[str, int]:
        """One bounded round of each prune: how many rows each deleted. The outbox goes before the claims, whose
        rows it frees."""
        return {
            "task_events": self.events.round(),
            "idempotency_keys": prune_idempotency_keys(self.engine, batch=self.keys_batch),
            "outbox": self.outbox.round(),
            "claims": self.claims.round(),
            "checkpoints": prune_checkpoints(self.engine, retention_s=self.checkpoint_retention_s,
                                             batch=self.checkpoints_batch),
            "push": prune_push(self.engine, retention_s=self.push_retention_s, batch=self.push_batch),
        }
