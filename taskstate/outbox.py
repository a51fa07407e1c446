"""The owner of ``dispatch_outbox``: one row per message to dispatch, from admission to its job's end.

Admission commits one row per message with the task and its reservation
(``NEW_ROW``, in admission's statement; a follow-up's row: ``enqueue``, the same fragment). A row is due when it is
``pending`` and its ``available_at`` has come. Dispatchers never hold a row across a failure:

* the embedded dispatcher **takes** due rows in one statement (``FOR UPDATE SKIP
  LOCKED``, so any number of dispatchers share the queue), pushing
  ``available_at`` forward by its delivery lease and counting the attempt; it
  renews that lease while the delivery lasts. If it dies, the rows come due
  again when the lease passes: nothing is lost, and a repeated delivery is
  answered from the job's claim;
* the Cloud Tasks relay **locks** due rows in a transaction, enqueues them and
  marks them ``sent`` before committing: if it dies in between, the transaction
  rolls back and the rows are enqueued again (the deterministic task name makes
  that harmless).

A failed attempt is rescheduled (``reschedule``); a job given up is marked
``undeliverable``; the finish of a job closes its row (``CLOSE``, in the
finish's statement), a cancel before any claim marks it ``canceled``
(``cancel_rows``), a job found unknown closes it (``close_unknown``), an
operator's reconcile closes it (``close``). Other owners
read the rows through ``jobs_relation`` (``taskstate.claims`` joins it to the
claims: from a row, the claim is ``c.job_id = o.job_id``; from a claim, the row is
``of_job_sql``: a primary-key lookup either way).

**A row is what makes its job claimable** (issue 18). A delivery's claim reads
its job's row with ``claimable_cte``, under a ``FOR KEY SHARE`` lock, and claims
nothing when the row is gone. Finished rows are pruned past
``SPECIALISTS_DISPATCH_OUTBOX_RETENTION_DAYS`` (``prune_finished_sql``, a page
at a time, oldest first through the partial index on ``finished_at``), and a job's
claim only after its row (``taskstate.claims.prune_finished``), so a late
delivery of a pruned job finds no row and runs nothing. The key-share lock
conflicts with nothing but a delete: the dispatchers lock rows ``FOR NO KEY
UPDATE`` (each other out, never a claim), and every UPDATE here changes no key.
The prune locks ``FOR UPDATE SKIP LOCKED``, so it skips a row a claim holds, and
a claim that comes second waits for the prune and then finds no row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection, text

from core import telemetry
from core.fragments import Fragment
from taskstate import ids

# The CHECK constraint of migration 0030 on ``last_error`` (tests/taskstate/test_schema_limits.py).
MAX_LAST_ERROR_CHARS = 500
# Who took a row: a dispatcher's name, bounded as a worker's id is in its claims (``claims.MAX_WORKER_ID_CHARS``).
MAX_TAKEN_BY_CHARS = 200
# The CHECK constraint of migration 0250 on ``trace_parent``: a version-00 W3C traceparent, as telemetry writes it.
MAX_TRACE_PARENT_CHARS = telemetry.TRACEPARENT_CHARS

_TAKE = text(
    """
    UPDATE dispatch_outbox o
       SET attempts = o.attempts + 1, available_at = now() + make_interval(secs => :lease_s),
           taken_by = :me, taken_at = now()
     WHERE o.dispatch_id IN (SELECT dispatch_id FROM dispatch_outbox
                              WHERE status = 'pending' AND available_at <= now()
                              ORDER BY available_at, dispatch_id
                              FOR NO KEY UPDATE SKIP LOCKED LIMIT :n)
    RETURNING o.dispatch_id, o.task_id, o.specialist_id, o.owner, o.context_id, o.attempts, o.trace_parent
    """
)
_LOCK = text(
    """
    SELECT dispatch_id, task_id, specialist_id, owner, context_id, attempts + 1 AS attempts, trace_parent
      FROM dispatch_outbox
     WHERE status = 'pending' AND available_at <= now()
     ORDER BY available_at, dispatch_id
       FOR NO KEY UPDATE SKIP LOCKED LIMIT :n
    """
)


@dataclass(frozen=True)
class OutboxRow:
    dispatch_id: int
    task_id: str
    specialist_id: str
    owner: str
    context_id: str
    attempts: int  # including the attempt about to be made
    # The W3C traceparent admission wrote (migration 0250): the trace the job continues. None: telemetry was off.
    trace_parent: str | None = None

    @property
    def job_id(self) -> str:
        return ids.job_id_for(self.task_id, self.dispatch_id)

    @property
    def ref(self) -> ids.TaskRef:
        return ids.TaskRef(self.task_id, self.dispatch_id, self.owner, self.context_id)


def _rows(result) -> list[OutboxRow]:  # type: ignore[no-untyped-def]
    """Taken or locked rows: each counts the attempt about to be made."""
    rows = sorted(
        (OutboxRow(r.dispatch_id, r.task_id, r.specialist_id, r.owner, r.context_id, r.attempts, r.trace_parent)
         for r in result),
        key=lambda row: row.dispatch_id,
    )
    assert all(row.attempts >= 1 for row in rows), rows
    return rows


def take(conn: Connection, *, limit: int, lease_s: float, me: str) -> list[OutboxRow]:
    """Embedded: take up to ``limit`` due rows for ``lease_s`` (commit right after)."""
    taken = _rows(conn.execute(_TAKE, {"n": limit, "lease_s": lease_s, "me": me[:MAX_TAKEN_BY_CHARS]}))
    assert len(taken) <= limit, (len(taken), limit)
    return taken


def lock_due(conn: Connection, *, limit: int) -> list[OutboxRow]:
    """Cloud Tasks relay: lock up to ``limit`` due rows until the caller's transaction ends."""
    locked = _rows(conn.execute(_LOCK, {"n": limit}))
    assert len(locked) <= limit, (len(locked), limit)
    return locked


def renew(conn: Connection, dispatch_ids: list[int], *, lease_s: float) -> None:
    """Embedded: keep rows whose delivery is still in flight from coming due again."""
    if dispatch_ids:
        conn.execute(
            text(
                "UPDATE dispatch_outbox SET available_at = now() + make_interval(secs => :lease_s) "
                "WHERE dispatch_id = ANY(:ids) AND status = 'pending'"
            ),
            {"ids": dispatch_ids, "lease_s": lease_s},
        )


def mark_sent(conn: Connection, row: OutboxRow) -> None:
    conn.execute(
        text(
            "UPDATE dispatch_outbox SET status = 'sent', sent_at = now(), attempts = :a, last_error = NULL "
            "WHERE dispatch_id = :d AND status IN ('pending', 'sent')"
        ),
        {"d": row.dispatch_id, "a": row.attempts},
    )


def mark_delivered(conn: Connection, row: OutboxRow) -> None:
    """The worker answered for good (finished, already finished, unknown, stale): stop delivering."""
    conn.execute(
        text(
            "UPDATE dispatch_outbox SET status = 'done', finished_at = now(), last_error = NULL "
            "WHERE dispatch_id = :d AND status IN ('pending', 'sent')"
        ),
        {"d": row.dispatch_id},
    )


def reschedule(conn: Connection, row: OutboxRow, *, delay_s: float, error: str, attempts: int | None = None) -> None:
    """Make a row due again after ``delay_s``; ``attempts``, when given, is its attempt count from now on."""
    conn.execute(
        text(
            "UPDATE dispatch_outbox SET available_at = now() + make_interval(secs => :delay_s), last_error = :e, "
            "attempts = COALESCE(CAST(:a AS integer), attempts) "
            "WHERE dispatch_id = :d AND status IN ('pending', 'sent')"
        ),
        {"d": row.dispatch_id, "delay_s": delay_s, "e": error[:MAX_LAST_ERROR_CHARS], "a": attempts},
    )


def mark_undeliverable(conn: Connection, row: OutboxRow, *, error: str) -> None:
    conn.execute(
        text(
            "UPDATE dispatch_outbox SET status = 'undeliverable', finished_at = now(), last_error = :e "
            "WHERE dispatch_id = :d AND status IN ('pending', 'sent')"
        ),
        {"d": row.dispatch_id, "e": error[:MAX_LAST_ERROR_CHARS]},
    )


_JOB_COLUMNS = ("r.dispatch_id, r.task_id, r.specialist_id, r.owner, r.context_id, r.status, r.attempts, "
                "r.sent_at")


def of_job_sql(job_id: str) -> str:
    """The outbox row of the job id expression ``job_id`` (a claim's), as a LATERAL sub-query with the columns of
    ``jobs_relation``: ``FROM job_claims c CROSS JOIN {of_job_sql('c.job_id')} o``. The dispatch id read back out
    of the job id makes it a primary-key lookup, and the whole id must match. ``OFFSET 0`` keeps it one lookup
    per claim in the planner's eyes too: as a join its estimate fell to one row for the whole query, and an
    ordered, limited read of the claims became a sort of all of them (150 ms for 10,000 unknown jobs, 2 ms now)."""
    return (f"LATERAL (SELECT {ids.job_id_sql('r')} AS job_id, {_JOB_COLUMNS} FROM dispatch_outbox r "
            f"WHERE r.dispatch_id = {ids.dispatch_id_of_sql(job_id)} AND {ids.job_id_sql('r')} = {job_id} OFFSET 0)")


def exists_for_job_sql(job_id: str) -> str:
    """A condition: the job id expression ``job_id`` has its outbox row (a primary-key lookup)."""
    return (f"EXISTS (SELECT 1 FROM dispatch_outbox x WHERE x.dispatch_id = {ids.dispatch_id_of_sql(job_id)} "
            f"AND {ids.job_id_sql('x')} = {job_id} OFFSET 0)")  # a lookup per row (see prune_finished_sql)


def row_of_job(conn: Connection, job_id: str) -> OutboxRow:
    """The outbox row of a job id: what a repeated delivery is signed from."""
    task_id, dispatch_id = ids.split_job_id(job_id)
    row = conn.execute(
        text("SELECT dispatch_id, task_id, specialist_id, owner, context_id, attempts, trace_parent FROM dispatch_outbox "
             "WHERE task_id = :t AND dispatch_id = :d"),
        {"t": task_id, "d": dispatch_id},
    ).one()
    return OutboxRow(*row)


def task_trace_sql(task_id_column: str) -> str:
    """The trace of the task in ``task_id_column``, as an SQL expression: its first job's traceparent (an index
    probe of dispatch_outbox_task), NULL when telemetry was off at admission or the rows are pruned. What a push
    notification's delivery continues (``taskstate.push``'s lease)."""
    return (f"(SELECT o.trace_parent FROM dispatch_outbox o WHERE o.task_id = {task_id_column} "
            "ORDER BY o.dispatch_id LIMIT 1)")


def trace_parent_of(conn: Connection, job_id: str) -> str | None:
    """The traceparent admission wrote for the job (None: telemetry was off, or the row is pruned): the trace an
    operator opens for an unknown job (the console's reservations)."""
    try:
        task_id, dispatch_id = ids.split_job_id(job_id)
    except ValueError:
        return None
    return conn.execute(text("SELECT trace_parent FROM dispatch_outbox WHERE task_id = :t AND dispatch_id = :d"),
                        {"t": task_id, "d": dispatch_id}).scalar_one_or_none()


# --- written by admission, read by the job -----------------------------------------------


# A message's row (a new task's first, or a follow-up's), written only ``{when}`` the condition holds. ``message``
# is the serialized Message, ``trace_parent`` admission's traceparent (None: telemetry off).
NEW_ROW = Fragment.of("taskstate.outbox", """
    INSERT INTO dispatch_outbox (task_id, specialist_id, executor, owner, context_id, message, trace_parent)
    SELECT CAST(:task_id AS varchar), CAST(:specialist_id AS text), CAST(:executor AS text),
           CAST(:owner AS varchar), CAST(:context_id AS varchar), CAST(:message AS bytea),
           CAST(:trace_parent AS text)
    WHERE {when}""", ("task_id", "specialist_id", "executor", "owner", "context_id", "message", "trace_parent"))
_ENQUEUE = NEW_ROW.standalone("outbox.enqueue")


def enqueue(conn: Connection, *, task_id: str, specialist_id: str, executor: str, owner: str, context_id: str,
            message: bytes, trace_parent: str | None = None) -> None:
    """A follow-up message's row: a new job of the same task."""
    _ENQUEUE.execute(conn, {"task_id": task_id, "specialist_id": specialist_id, "executor": executor,
                            "owner": owner, "context_id": context_id, "message": message,
                            "trace_parent": trace_parent})


def message_sql() -> str:
    """The serialized message of the job ``:message_dispatch_id`` of task ``:message_task_id`` as a scalar
    sub-query, for a statement that reads it beside its own row (the claim); parameters: ``message_params``."""
    return ("SELECT message FROM dispatch_outbox "
            "WHERE dispatch_id = :message_dispatch_id AND task_id = :message_task_id")


def claimable_cte(name: str) -> str:
    """The job's row as a common table expression ``name`` (``job_id``, ``message``), key-share locked: empty
    when the job ``:j`` of ``message_params`` has no row (it finished long ago and was pruned), so that a claim
    written over it (``LATERAL ... (name.job_id)``) claims nothing. The lock holds off only the prune's delete
    until the claim's transaction ends (see the module doc)."""
    return (f"{name} AS MATERIALIZED (SELECT CAST(:j AS text) AS job_id, r.message FROM dispatch_outbox r "
            "WHERE r.dispatch_id = :message_dispatch_id AND r.task_id = :message_task_id "
            f"AND {ids.job_id_sql('r')} = :j FOR KEY SHARE)")


def message_params(ref: ids.TaskRef) -> dict[str, Any]:
    return {"message_dispatch_id": ref.dispatch_id, "message_task_id": ref.task_id}


def message_of(conn: Connection, ref: ids.TaskRef) -> bytes | None:
    """The serialized message a job processes; None when its row is gone."""
    message = conn.execute(text(message_sql()), message_params(ref)).scalar_one_or_none()
    return None if message is None else bytes(message)


# --- closed by the finish, the cancel and the reconcile ----------------------------------


# Close the job's row (``:dispatch_id`` of task ``:task_id``) as done, only ``{when}`` the condition holds: the
# finish puts it in its one statement, after the claim's finish.
CLOSE = Fragment.of("taskstate.outbox", """
    UPDATE dispatch_outbox SET status = 'done', finished_at = now()
     WHERE dispatch_id = :dispatch_id AND task_id = :task_id AND status IN ('pending', 'sent', 'undeliverable')
       AND {when}
    RETURNING 1""", ("dispatch_id", "task_id"))


def close_unknown(conn: Connection, ref: ids.TaskRef) -> None:
    """The job's outcome became unknown: no delivery will run it again, so its row is done (an operator's
    reconcile decides the rest). The embedded dispatcher closes it so when a worker answers ``job_outcome_unknown``;
    this closes it in the transaction that found it unknown, whatever the dispatcher."""
    conn.execute(
        text("UPDATE dispatch_outbox SET status = 'done', finished_at = now() "
             "WHERE dispatch_id = :d AND task_id = :t AND status IN ('pending', 'sent')"),
        {"d": ref.dispatch_id, "t": ref.task_id},
    )


def close(conn: Connection, dispatch_id: int) -> None:
    """An operator's verdict ended the job: its row is done, whatever became of its delivery."""
    conn.execute(
        text("UPDATE dispatch_outbox SET status = 'done', finished_at = now() "
             "WHERE dispatch_id = :d AND status IN ('pending', 'sent', 'undeliverable')"),
        {"d": dispatch_id},
    )


def cancel_rows(conn: Connection, dispatch_ids: list[int]) -> None:
    """Rows whose jobs will never run (canceled before a claim) or already ended: stop delivering them."""
    if dispatch_ids:
        conn.execute(
            text("UPDATE dispatch_outbox SET status = 'canceled', finished_at = now() "
                 "WHERE dispatch_id = ANY(:ids) AND status IN ('pending', 'sent')"),
            {"ids": dispatch_ids},
        )


def open_dispatch_ids(conn: Connection, task_id: str, owner: str) -> list[int]:
    """The task's jobs not yet done: waiting for a dispatcher, sent to Cloud Tasks, or running."""
    return list(
        conn.execute(
            text("SELECT dispatch_id FROM dispatch_outbox WHERE task_id = :t AND owner = :o "
                 "AND status IN ('pending', 'sent') ORDER BY dispatch_id"),
            {"t": task_id, "o": owner},
        ).scalars()
    )


def jobs_relation() -> str:
    """Every row as a sub-query with its job id (job_id, dispatch_id, task_id, specialist_id, owner, context_id,
    status, attempts, sent_at), for owners that join it to their own table."""
    return f"(SELECT {ids.job_id_sql('r')} AS job_id, {_JOB_COLUMNS} FROM dispatch_outbox r)"


def open_jobs_relation() -> str:
    """The rows not yet done as a sub-query with the columns of ``jobs_relation`` and ``created_at``: waiting for a
    dispatcher (``pending``, also while a delivery is in flight) or handed to Cloud Tasks (``sent``). Each status is
    its own partial index (``dispatch_outbox_due``, ``dispatch_outbox_sent``): they hold the jobs in flight, not the
    history."""
    return (f"(SELECT {ids.job_id_sql('r')} AS job_id, {_JOB_COLUMNS}, r.created_at FROM dispatch_outbox r "
            "WHERE r.status = 'pending' UNION ALL "
            f"SELECT {ids.job_id_sql('r')} AS job_id, {_JOB_COLUMNS}, r.created_at FROM dispatch_outbox r "
            "WHERE r.status = 'sent')")


# --- pruned past their retention ---------------------------------------------------------

# Where a walk over the finished rows starts: before the oldest (``finished_at``, ``dispatch_id``).
PRUNE_START = (datetime(1, 1, 1, tzinfo=timezone.utc), 0)


def prune_finished_sql(*, only: str) -> str:
    """One page of the walk over the finished rows closed more than ``:retention_s`` ago, oldest first from
    (``:after_at``, ``:after_id``), through ``dispatch_outbox_finished`` (migration 0190): of the ``:batch`` rows it
    reads, it deletes those where the condition ``only`` holds too (over the row aliased ``r``: its claim decides
    nothing any more, its task ended) and passes the others, skipping rows a claim holds. Answers one row:
    ``deleted``, ``examined`` and the last row's key (``last_at``, ``last_id``), where the next page starts.

    The owners' conditions in ``only`` are sub-queries fenced with ``OFFSET 0``, so PostgreSQL evaluates them per
    row, a primary-key lookup each: as joins it would hash every ended task or every claim first (it did, on the
    grown test database: it cannot estimate the share of ended tasks). The delete is by primary key (``= ANY``)."""
    return f"""
    WITH page AS MATERIALIZED (
        SELECT r.dispatch_id, r.finished_at FROM dispatch_outbox r
         WHERE r.status IN ('done', 'canceled', 'undeliverable')
           AND r.finished_at < now() - make_interval(secs => :retention_s)
           AND (r.finished_at, r.dispatch_id) > (CAST(:after_at AS timestamptz), CAST(:after_id AS bigint))
         ORDER BY r.finished_at, r.dispatch_id
         LIMIT :batch
    ),
    doomed AS (
        SELECT r.dispatch_id FROM dispatch_outbox r
         WHERE r.dispatch_id = ANY (ARRAY(SELECT dispatch_id FROM page))
           AND r.status IN ('done', 'canceled', 'undeliverable') AND {only}
           FOR UPDATE OF r SKIP LOCKED
    ),
    gone AS (DELETE FROM dispatch_outbox WHERE dispatch_id = ANY (ARRAY(SELECT dispatch_id FROM doomed)) RETURNING 1)
    SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT count(*) FROM page) AS examined,
           last.finished_at AS last_at, last.dispatch_id AS last_id
      FROM (SELECT 1) one
      LEFT JOIN (SELECT * FROM page ORDER BY finished_at DESC, dispatch_id DESC LIMIT 1) last ON true"""
