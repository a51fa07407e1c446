"""The owner of ``edge_tasks``: the edge's record of an admitted task, and what it reserved.

One row per task, written by admission (in admission's one
statement, ``NEW_ROW``): who sent it (customer and key), to which specialist and skill, the
owner scope of its rows, and the credits reserved for it with the reservation's
id (the task id; NULL for a free specialist). One column changes later:
``reply_kind`` becomes ``message`` when the task's answer is a direct Message
(``record_message_reply``, in the transaction that writes it), so that a resend
is answered with that Message, as the first send was (``reply_kind``).
Everything that later moves the task's money (a finish, a cancel, a give-up, a
reconcile) reads the reserved amount here (``hold_of``), never from a spec file, which may have
changed since.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, text

from core.fragments import Fragment


@dataclass(frozen=True)
class Hold:
    """What a task reserved: ``reservation_id`` None for a free specialist (nothing held)."""

    reservation_id: str | None
    reserved_credits: int


# The task's row, written only ``{when}`` the condition holds (admission's one statement). The column
# ``tariff_credits`` holds the task's reserved credits (its name predates the glossary of docs/ARCHITECTURE.md; the
# release that contracts the schema renames it): every read here names it ``reserved_credits``.
NEW_ROW = Fragment.of("taskstate.admitted", """
    INSERT INTO edge_tasks (task_id, customer_id, key_id, specialist_id, skill_id, owner, tariff_credits,
                            reservation_id)
    SELECT CAST(:task_id AS varchar), CAST(:customer_id AS text), CAST(:key_id AS text),
           CAST(:specialist_id AS text), CAST(:skill_id AS text), CAST(:owner AS varchar),
           CAST(:reserved_credits AS bigint),
           CASE WHEN CAST(:reserved_credits AS bigint) > 0 THEN CAST(:task_id AS text) END
    WHERE {when}""", ("task_id", "customer_id", "key_id", "specialist_id", "skill_id", "owner", "reserved_credits"))

# ``hold_of`` (reservation_id, reserved_credits) of the task ``:task_id``, for a statement that does more in the
# same round trip (the finish closes the job's outbox row with it).
HOLD = Fragment.of(
    "taskstate.admitted",
    "SELECT reservation_id, tariff_credits AS reserved_credits FROM edge_tasks WHERE task_id = :task_id",
    ("task_id",),
)
_HOLD = HOLD.standalone("admitted.hold_of")


def hold_of(conn: Connection, task_id: str) -> Hold | None:
    """What the task reserved; None when it is not an admitted task (a test's raw job)."""
    row = _HOLD.execute(conn, {"task_id": task_id}).one_or_none()
    if row is None:
        return None
    hold = Hold(row.reservation_id, int(row.reserved_credits))
    assert (hold.reservation_id is None) == (hold.reserved_credits == 0), hold  # NEW_ROW: held iff credits > 0
    return hold


def free_tasks_relation() -> str:
    """Admitted tasks that reserved nothing, as a sub-query (task_id, customer_id, specialist_id, admitted_at)."""
    return ("(SELECT task_id, customer_id, specialist_id, admitted_at FROM edge_tasks "
            "WHERE reservation_id IS NULL)")


def admitted_relation() -> str:
    """Every admitted task as a sub-query (task_id, customer_id, specialist_id, skill_id, reserved_credits,
    reservation_id, admitted_at), for the operator's reads: by admission time (``edge_tasks_admitted``) or a
    customer's newest (``edge_tasks_customer``, migration 0230)."""
    return ("(SELECT task_id, customer_id, specialist_id, skill_id, tariff_credits AS reserved_credits, "
            "reservation_id, admitted_at "
            "FROM edge_tasks)")


REPLY_TASK = "task"
REPLY_MESSAGE = "message"
_RECORD_MESSAGE_REPLY = text("UPDATE edge_tasks SET reply_kind = 'message' WHERE task_id = :t")
_REPLY_KIND = text("SELECT reply_kind FROM edge_tasks WHERE task_id = :t")


def record_message_reply(conn: Connection, task_id: str) -> None:
    """The task answered with a direct Message (the caller's transaction writes that answer)."""
    conn.execute(_RECORD_MESSAGE_REPLY, {"t": task_id})


def reply_kind(conn: Connection, task_id: str) -> str:
    """``message`` when the task answered with a direct Message, ``task`` otherwise (and for a raw job's task)."""
    return conn.execute(_REPLY_KIND, {"t": task_id}).scalar_one_or_none() or REPLY_TASK
