"""The owner of ``dispatch_outbox``: one row per message to dispatch, from admission to its job's end.

Admission commits one row per message with the task and its reservation
(``NEW_ROW``, in admission's statement; a follow-up's row: ``enqueue``, the same fragment). A row is due when it is
``pending`` and its ``available_at`` has come. Dispatchers never hold a row across a failure:

* the embedded dispatcher **takes** due rows in one statement (``FOR UPDATE SKIP
  LOCKED``, so any number of dispatchers share the queue), pushing
  ``available_at`` forward by its delivery lease and counting the attempt; it
  renews that lease while the delivery lasts. If it dies, the rows come due
  again when the lease passes: nothing is lost, and a repeated delivery is
  answered from the job's claim. For the same reason its commit does not wait
  for its WAL flush (``UNFLUSHED_COMMIT``): a take a PostgreSQL crash loses
  leaves its rows due, as a dispatcher's death would;
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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection, text

from core import db, telemetry
from core.fragments import Fragment
from taskstate import ids

# The CHECK constraint of migration 0030 on ``last_error`` (tests/taskstate/test_schema_limits.py).
MAX_LAST_ERROR_CHARS = 500
# Who took a row: a dispatcher's name, bounded as a worker's id is in its claims (``claims.MAX_WORKER_ID_CHARS``).
MAX_TAKEN_BY_CHARS = 200
# The CHECK constraint of migration 0250 on ``trace_parent``: a version-00 W3C traceparent, as telemetry writes it.
MAX_TRACE_PARENT_CHARS = telemetry.TRACEPARENT_CHARS

# A customer's weight in the fair order (``dispatch_weights``, migration 0290): the CHECK's bounds.
MAX_WEIGHT = 1000
MAX_WEIGHT_REASON_CHARS = 500
MAX_CHANGED_BY_CHARS = 200

# The fair order of due rows (issue 41): a row's owner is ``<customer>:<specialist>`` (``app.identity``), and its
# customer the owner's first part (a customer id has no ``:``), the expression of migration 0290's index; every
# statement here names the outbox row it reads ``x``.
_CUSTOMER = "split_part(x.owner, ':', 1)"
# The customers with open rows, walked through ``dispatch_outbox_customer_open`` one probe each (a loose index
# scan); for each, its jobs in flight (``sent``: with Cloud Tasks; ``pending`` and not due: an embedded delivery's
# lease, or a retry's wait) and its first ``:n`` due rows of a specialist served (``:served``: NULL is any), each
# ranked by ``(in flight + its place in the customer's line) / weight``: the row of least rank is the job of the
# customer furthest behind its share of the slots. Ties go to the customer whose last turn (``dispatch_turns``) is
# longest past, never-served first (a round-robin), then to the row due first.
_FAIR_DUE = f"""
    WITH RECURSIVE open_customers AS (
        (SELECT {_CUSTOMER} AS customer FROM dispatch_outbox x
          WHERE x.status IN ('pending', 'sent') ORDER BY 1 LIMIT 1)
        UNION ALL
        SELECT (SELECT {_CUSTOMER} FROM dispatch_outbox x
                 WHERE x.status IN ('pending', 'sent') AND {_CUSTOMER} > c.customer
                 ORDER BY 1 LIMIT 1)
          FROM open_customers c WHERE c.customer IS NOT NULL
    ),
    ranked AS (
        SELECT d.dispatch_id, d.available_at, c.customer, t.last_started_at,
               CAST(d.in_flight + d.place AS float8) / COALESCE(w.weight, CAST(:default_weight AS integer)) AS share
          FROM open_customers c
          CROSS JOIN LATERAL (  -- one read of the customer's open rows: its jobs in flight, and its due ones
              SELECT y.dispatch_id, y.available_at, y.in_flight,
                     row_number() OVER (ORDER BY y.available_at, y.dispatch_id) AS place
                FROM (SELECT x.dispatch_id, x.available_at, x.status, x.specialist_id,
                             count(*) FILTER (WHERE x.status = 'sent' OR x.available_at > now()) OVER () AS in_flight
                        FROM dispatch_outbox x
                       WHERE {_CUSTOMER} = c.customer AND x.status IN ('pending', 'sent')) y
               WHERE y.status = 'pending' AND y.available_at <= now()
                 AND (CAST(:served AS text[]) IS NULL OR y.specialist_id = ANY (CAST(:served AS text[])))
               ORDER BY y.available_at, y.dispatch_id LIMIT :n) d
          LEFT JOIN dispatch_weights w ON w.customer_id = c.customer
          LEFT JOIN dispatch_turns t ON t.customer = c.customer
         WHERE c.customer IS NOT NULL
           AND (CAST(:max_per_customer AS integer) IS NULL OR d.in_flight + d.place <= CAST(:max_per_customer AS integer))
    )"""
# The rows chosen, locked in the fair order (``{limit}``: how many at most), and their customers' turns taken. Only
# the first of the ranked rows are joined and locked (the join of all of them cost more than the ranking: 20 of
# 84 ms for 1,000 customers with 8 jobs each), with a margin for the rows other dispatchers lock meanwhile (SKIP
# LOCKED): past it a take returns fewer rows, and the next round takes the rest.
_LOCK_MARGIN = 16  # ranked rows past twice the take's limit that are still joined and may be locked
_CHOSEN = """,
    chosen AS (
        SELECT o.dispatch_id, r.customer, r.share, r.last_started_at AS turn_before, r.available_at AS due_at
          FROM dispatch_outbox o
          JOIN (SELECT * FROM ranked ORDER BY share, last_started_at NULLS FIRST, available_at, dispatch_id
                 LIMIT 2 * :n + {margin}) r ON r.dispatch_id = o.dispatch_id
         WHERE o.status = 'pending' AND o.available_at <= now()
         ORDER BY r.share, r.last_started_at NULLS FIRST, r.available_at, o.dispatch_id
           FOR NO KEY UPDATE OF o SKIP LOCKED LIMIT {limit}
    ),
    turns AS (
        INSERT INTO dispatch_turns AS t (customer, last_started_at)
        SELECT DISTINCT customer, now() FROM chosen
        ON CONFLICT (customer) DO UPDATE SET last_started_at = EXCLUDED.last_started_at
        RETURNING 1
    )"""
# The take's own commit does not wait for its WAL flush (issue 44): set_config(..., true) lasts until the transaction
# ends, its commit included, and the take runs alone in autocommit (``workers.dispatch.embedded``). What the take
# writes is a delivery lease, an attempt's count and a turn, never money or a claim: a PostgreSQL crash that loses it
# leaves the row as it was before the take, due, which is what the lease's end makes of it anyway (a repeated
# delivery is answered from the job's claim, which commits synchronously and so flushes the take's WAL before it).
# Evaluated once per row taken: a take that takes nothing writes nothing and commits nothing. Not in the relay's
# lock (``_LOCK``): its transaction marks rows sent after Cloud Tasks accepted them.
UNFLUSHED_COMMIT = "set_config('synchronous_commit', 'off', true) AS unflushed_commit"
_TAKE = text(
    f"""{_FAIR_DUE}{_CHOSEN.format(limit=":n", margin=_LOCK_MARGIN)}
    UPDATE dispatch_outbox o
       SET attempts = o.attempts + 1, available_at = now() + make_interval(secs => :lease_s),
           taken_by = :me, taken_at = now()
      FROM chosen
     WHERE o.dispatch_id = chosen.dispatch_id
    RETURNING o.dispatch_id, o.task_id, o.specialist_id, o.owner, o.context_id, o.attempts, o.trace_parent,
              chosen.share, chosen.turn_before, chosen.due_at, o.taken_at, {UNFLUSHED_COMMIT}
    """
)
_UNDER_MAX_IN_FLIGHT = ("LEAST(:n, GREATEST(0, :max_in_flight - "
                        "(SELECT count(*) FROM dispatch_outbox WHERE status = 'sent')))")
# The relay keeps at most ``:max_in_flight`` rows ``sent`` (queued in Cloud Tasks or running): the queue is FIFO,
# so what it holds is what the fair order can no longer change.
_LOCK = text(
    f"""{_FAIR_DUE}{_CHOSEN.format(margin=_LOCK_MARGIN, limit=_UNDER_MAX_IN_FLIGHT)}
    SELECT o.dispatch_id, o.task_id, o.specialist_id, o.owner, o.context_id, o.attempts + 1 AS attempts,
           o.trace_parent, chosen.share, chosen.turn_before, chosen.due_at, CAST(NULL AS timestamptz) AS taken_at
      FROM dispatch_outbox o JOIN chosen ON chosen.dispatch_id = o.dispatch_id
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
    # What the take changed, so that a worker that was full can have it back (``hand_back``): when the row was
    # due, its customer's turn before the take (None: it had none), and the take's time. None: not known.
    due_at: datetime | None = None
    turn_before: datetime | None = None
    taken_at: datetime | None = None

    @property
    def job_id(self) -> str:
        return ids.job_id_for(self.task_id, self.dispatch_id)

    @property
    def ref(self) -> ids.TaskRef:
        return ids.TaskRef(self.task_id, self.dispatch_id, self.owner, self.context_id)


def _rows(result: Iterable[Mapping[str, Any]]) -> list[OutboxRow]:
    """Taken or locked rows in the fair order (least share first): each counts the attempt about to be made."""
    ordered = sorted(result, key=lambda r: (r["share"], r["turn_before"] is not None, r["turn_before"] or r["due_at"],
                                            r["due_at"], r["dispatch_id"]))
    rows = [OutboxRow(r["dispatch_id"], r["task_id"], r["specialist_id"], r["owner"], r["context_id"], r["attempts"],
                      r["trace_parent"], r["due_at"], r["turn_before"], r["taken_at"])
            for r in ordered]
    assert all(row.attempts >= 1 for row in rows), rows
    return rows


@dataclass(frozen=True)
class FairOrder:
    """What a take's fair order needs: the weight of a customer without one of its own, and the specialists whose
    jobs may be taken (None: any; a dispatcher that knows what its workers serve names them)."""

    default_weight: int = 1
    served: tuple[str, ...] | None = None
    # The most jobs one customer may have in flight (``Settings.customer_max_slots``: the slots the dispatcher knows
    # less SPECIALISTS_DISPATCH_RESERVED_SLOTS), so a slot stays free for the next customer; None: no cap.
    max_per_customer: int | None = None

    def __post_init__(self) -> None:
        assert 1 <= self.default_weight <= MAX_WEIGHT, self.default_weight
        assert self.max_per_customer is None or self.max_per_customer >= 1, self.max_per_customer

    def params(self, limit: int) -> dict[str, Any]:
        return {"n": limit, "default_weight": self.default_weight, "max_per_customer": self.max_per_customer,
                "served": None if self.served is None else list(self.served)}


ANY_SPECIALIST = FairOrder()


def take(conn: Connection, *, limit: int, lease_s: float, me: str,
         order: FairOrder = ANY_SPECIALIST) -> list[OutboxRow]:
    """Embedded: take up to ``limit`` due rows in the fair order, for ``lease_s`` (commit right after; that commit
    does not wait for its WAL flush, ``UNFLUSHED_COMMIT``)."""
    # Every round of the embedded dispatcher's: on the driver (core.db.hot_rows).
    taken = _rows(db.hot_rows(conn, _TAKE, {**order.params(limit), "lease_s": lease_s, "me": me[:MAX_TAKEN_BY_CHARS]}))
    assert len(taken) <= limit, (len(taken), limit)
    return taken


def lock_due(conn: Connection, *, limit: int, max_in_flight: int,
             order: FairOrder = ANY_SPECIALIST) -> list[OutboxRow]:
    """Cloud Tasks relay: lock up to ``limit`` due rows in the fair order until the caller's transaction ends, and
    never so many that more than ``max_in_flight`` rows would be ``sent``."""
    locked = _rows(conn.execute(_LOCK, {**order.params(limit), "max_in_flight": max_in_flight}).mappings())
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


_MARK_DELIVERED = text("UPDATE dispatch_outbox SET status = 'done', finished_at = now(), last_error = NULL "
                       "WHERE dispatch_id = :d AND status IN ('pending', 'sent')")


def mark_delivered(conn: Connection, row: OutboxRow) -> None:
    """The worker answered for good (finished, already finished, unknown, stale): stop delivering. Every job's: on
    the driver (``core.db.hot_rows``)."""
    db.hot_rows(conn, _MARK_DELIVERED, {"d": row.dispatch_id})


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


_HAND_BACK = text(
    f"""
    WITH back AS (
        UPDATE dispatch_outbox x SET available_at = LEAST(CAST(:due_at AS timestamptz), now()), last_error = :e,
                                     attempts = :a
         WHERE x.dispatch_id = :d AND x.status = 'pending' AND x.taken_at = CAST(:taken_at AS timestamptz)
        RETURNING {_CUSTOMER} AS customer
    ),
    restored AS (
        UPDATE dispatch_turns t SET last_started_at = CAST(:turn_before AS timestamptz) FROM back
         WHERE t.customer = back.customer AND t.last_started_at = CAST(:taken_at AS timestamptz)
           AND CAST(:turn_before AS timestamptz) IS NOT NULL
        RETURNING 1
    ),
    forgotten AS (
        DELETE FROM dispatch_turns t USING back
         WHERE t.customer = back.customer AND t.last_started_at = CAST(:taken_at AS timestamptz)
           AND CAST(:turn_before AS timestamptz) IS NULL
        RETURNING 1
    )
    SELECT count(*) FROM back
    """
)


def hand_back(conn: Connection, row: OutboxRow, *, error: str) -> None:
    """The worker claimed nothing (it was full, gone or stopping): the row is as it was before the take, due since
    it was, its attempt uncounted, and its customer's turn as it was unless the customer had another since. So the
    busy path keeps the fair order: a refusal moves neither the row behind rows due after it nor its customer behind
    others. Only a row of ``take`` can be handed back: what the take changed is what it returned."""
    assert row.taken_at is not None and row.due_at is not None, f"hand_back is given a row of take(): {row}"
    conn.execute(_HAND_BACK, {"d": row.dispatch_id, "due_at": row.due_at, "e": error[:MAX_LAST_ERROR_CHARS],
                              "a": row.attempts - 1, "turn_before": row.turn_before, "taken_at": row.taken_at})


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


# --- a customer's share of the worker slots (issue 41) ---------------------------------------


@dataclass(frozen=True)
class CustomerShare:
    """A customer's place in the fair order: its weight, and its jobs in flight and waiting (due, not yet taken)."""

    customer_id: str
    weight: int
    weight_is_default: bool
    in_flight: int
    waiting: int
    weight_changed_by: str | None = None
    weight_changed_at: datetime | None = None
    weight_reason: str | None = None


_SHARE = text(
    f"""
    SELECT count(*) FILTER (WHERE x.status = 'sent' OR x.available_at > now()) AS in_flight,
           count(*) FILTER (WHERE x.status = 'pending' AND x.available_at <= now()) AS waiting,
           w.weight, w.changed_by, w.changed_at, w.reason
      FROM (SELECT 1) one
      LEFT JOIN dispatch_outbox x ON {_CUSTOMER} = :c AND x.status IN ('pending', 'sent')
      LEFT JOIN dispatch_weights w ON w.customer_id = :c
     GROUP BY w.weight, w.changed_by, w.changed_at, w.reason
    """
)


def share_of(conn: Connection, customer_id: str, *, default_weight: int) -> CustomerShare:
    """What `customers show` prints of the fair order: read through the customer's index of open rows."""
    r = conn.execute(_SHARE, {"c": customer_id}).one()
    return CustomerShare(customer_id, r.weight or default_weight, r.weight is None, int(r.in_flight), int(r.waiting),
                         r.changed_by, r.changed_at, r.reason)


@dataclass(frozen=True)
class WeightChange:
    customer_id: str
    outcome: str  # "changed" or "unchanged"
    weight_before: int | None  # None: it had the default
    weight: int


def set_weight(conn: Connection, customer_id: str, weight: int, *, changed_by: str, reason: str) -> WeightChange:
    """An operator's weight for a customer (`customers set --weight`); the caller checked that the customer exists."""
    if not 1 <= weight <= MAX_WEIGHT:
        raise ValueError(f"a weight is 1 to {MAX_WEIGHT}, not {weight}")
    if not 1 <= len(reason) <= MAX_WEIGHT_REASON_CHARS:
        raise ValueError(f"a reason has 1 to {MAX_WEIGHT_REASON_CHARS} characters")
    before = conn.execute(text("SELECT weight FROM dispatch_weights WHERE customer_id = :c FOR UPDATE"),
                          {"c": customer_id}).scalar_one_or_none()
    if before == weight:
        return WeightChange(customer_id, "unchanged", before, weight)
    conn.execute(
        text("INSERT INTO dispatch_weights (customer_id, weight, changed_by, reason) VALUES (:c, :w, :by, :r) "
             "ON CONFLICT (customer_id) DO UPDATE SET weight = EXCLUDED.weight, changed_by = EXCLUDED.changed_by, "
             "reason = EXCLUDED.reason, changed_at = now()"),
        {"c": customer_id, "w": weight, "by": changed_by[:MAX_CHANGED_BY_CHARS], "r": reason},
    )
    return WeightChange(customer_id, "changed", before, weight)
